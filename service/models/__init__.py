"""The models a server can serve (registry.py: what is on disk and what a name
means) and the one it serves now (lifecycle.py: the state machine that loads,
switches and unloads it)."""
