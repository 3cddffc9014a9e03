"""The GGUF engine: .gguf files through llama-cpp-python, continuously batched
over llama.cpp sequences on one model thread."""
