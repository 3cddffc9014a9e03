"""The built-in demo model, millm-tiny, built offline and deterministically."""
