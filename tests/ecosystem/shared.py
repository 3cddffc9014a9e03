"""What the ecosystem scripts share: the structured-output model, the tool, and
the one JSON line each script prints.

The scripts run in venvs of their own (tests/ecosystem/requirements*.txt),
so this module imports nothing from miLLM, only pydantic. The demo model is
a tiny random-ish model: what it writes is only guaranteed to match the
schema, so the string fields carry a maxLength (an unbounded string lets it
ramble to max_tokens) and the reports say which types came back, for
tests/test_ecosystem.py to assert on.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, Field

PROMPT = "What is the weather in Paris right now? Give the city, the time, an id and degrees."
TOOL_PROMPT = "Use the get_weather tool to look up the weather in Paris."
MAX_TOKENS = 256
SEED = 10
TOOL_DESCRIPTION = "Look up the current weather in a city."

City = Annotated[str, Field(max_length=24, description="The city's name.")]


class Weather(BaseModel):
    """The weather in one city at one time."""

    city: City
    when: datetime
    id: UUID
    celsius: int = Field(gt=-100, lt=100)


# The cities get_weather was called with, in order: the agents' tool runs.
CALLS: list[str] = []


def get_weather(city: City) -> str:
    """Look up the current weather in a city."""
    CALLS.append(city)
    return f"Sunny in {city}, 21 degrees."


def cli() -> tuple[str, str, str]:
    """argv: the bridge's base URL (ending in /v1), the model, the path to run."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL MODEL PATH")
    return sys.argv[1], sys.argv[2], sys.argv[3]


def model_report(value) -> dict:
    """A structured output as the class it is, its fields and their types."""
    if not isinstance(value, BaseModel):
        return {"class": type(value).__name__, "repr": repr(value)[:500]}
    return {"class": type(value).__name__, "fields": value.model_dump(mode="json"),
            "types": {name: type(getattr(value, name)).__name__
                      for name in type(value).model_fields}}


def tool_call(name: str, arguments) -> dict:
    """One tool call: its name and its arguments as a JSON object (parsed here
    when a library hands back the raw string)."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    return {"name": name, "arguments": arguments}


def emit(**result) -> None:
    print(json.dumps(result, default=str), flush=True)
