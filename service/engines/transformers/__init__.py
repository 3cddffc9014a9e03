"""The transformers engine: HF checkpoints, continuously batched on one model
thread (engine.py loads and tokenizes; scheduler.py, batch.py and
prefix_cache.py run generations; reading.py scores and embeds)."""
