"""Pydantic schemas of the OpenAI requests the bridge accepts."""
