"""Settings read from the environment meet their flag's `choices` too.

Both servers take every setting as a flag whose default comes from an
environment variable, and argparse checks `choices` only for a value given
as a flag, never for a default: MILLM_GGUF_FLASH_ATTN=true or a misspelt
MILLM_TORCH_LINEAR would otherwise be served as whatever the code does with
an unknown value, silently. Shared by service/config.py and
rest_bridge/config.py.
"""

from __future__ import annotations

import argparse


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """parser.error (exit 2) naming the variable, for a value outside its choices."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.choices is not None and value is not None and value not in action.choices:
            name = (action.help or action.dest).split(":")[0]
            parser.error(f"{name} must be one of {', '.join(map(str, action.choices))}; "
                         f"got {value!r}")
