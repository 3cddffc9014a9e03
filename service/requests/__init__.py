"""A request from the wire to one frozen, typed, validated value: the field
table (fields.py), the rules (checks.py) and the value the engine runs
(generation.py)."""
