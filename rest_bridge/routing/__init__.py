"""Choosing an engine per request when the bridge has several (router.py)."""
