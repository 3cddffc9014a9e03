"""Model engines. Each one loads a checkpoint, tokenizes, and runs GenerationJobs
off the event loop; the gRPC services never know which engine answers."""
