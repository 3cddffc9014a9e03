"""SAE steering: SAEs on disk, the steering state operators manage, the rules
that turn a request into per-row deltas, and the model-thread hooks that add
them."""
