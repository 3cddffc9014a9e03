"""miLLM REST bridge: the OpenAI API over the engine's gRPC services. It holds
no model state and checks only JSON shape; the engine owns every other rule."""
