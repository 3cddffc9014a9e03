"""Scripts run by tests/test_ecosystem.py in the ecosystem venvs."""
