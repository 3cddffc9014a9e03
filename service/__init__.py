"""miLLM engine: the grpc.aio server, the model engines and all semantic validation."""
