"""The GGUF engine: .gguf files through llama-cpp-python, one job at a time on
one model thread."""
