"""Mistral (tokenizer v11 and later: Mistral Small 3.2, Magistral,
Devstral): tools are announced in `[AVAILABLE_TOOLS]`, and each call is

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

one after the other for several calls. Magistral thinks in
`[THINK]`...`[/THINK]` when its template shows it."""

from service.formats.base import CallSyntax, Family, ReasoningSyntax

CALLS = CallSyntax("mistral", call_open="[TOOL_CALLS]", name_close="[ARGS]", call_close="",
                   separator="")
THINK = ReasoningSyntax("mistral_think", "[THINK]", "[/THINK]")


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return "[TOOL_CALLS]" in template or "[AVAILABLE_TOOLS]" in template


FAMILY = Family("mistral", CALLS, None, detect,
                "the template writes `[AVAILABLE_TOOLS]` or `[TOOL_CALLS]`")
