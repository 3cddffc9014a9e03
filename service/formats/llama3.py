"""Llama 3.1 to 3.3 (and 3.2): a call is a bare JSON object naming the
function and its `parameters`, as the template asks for:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

Several calls are written one after the other, separated by "; " (what
Llama's parsers elsewhere accept)."""

from service.formats.base import CallSyntax, Family

CALLS = CallSyntax("llama3_json", call_open='{"name": "', name_close='", "parameters": ',
                   call_close="}", separator="; ", trigger='{"name": ')


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return ("<|python_tag|>" in template
            or ('"parameters"' in template and '"name"' in template
                and "<tool_call>" not in template))


FAMILY = Family("llama3_json", CALLS, None, detect,
                'the template asks for `{"name": ..., "parameters": ...}` or writes '
                "`<|python_tag|>`")
