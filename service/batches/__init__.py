"""OpenAI's Files and Batch APIs in the engine's state database."""
