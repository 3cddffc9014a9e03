"""Handlers: an OpenAI request in, a gRPC call, JSON or SSE out."""
