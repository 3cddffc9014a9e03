"""Hermes style (Qwen 2.5 and 3, Hermes, the demo model's ChatML template,
and the fallback for templates that show no syntax of their own):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Qwen3's templates also show `<think>`: detection adds the think reasoning
to them (formats/__init__.py)."""

from service.formats.base import CallSyntax, Family

CALLS = CallSyntax("hermes", call_open='<tool_call>\n{"name": "',
                   name_close='", "arguments": ', call_close="}\n</tool_call>",
                   separator="\n", trigger="<tool_call>")


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return "<tool_call>" in template


FAMILY = Family("hermes", CALLS, None, detect,
                "the template writes `<tool_call>` (and any template that shows no syntax)")
