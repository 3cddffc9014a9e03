"""gpt-oss's harmony: every message of the answer names its channel. The
model thinks in the analysis channel, answers in the final one, and calls a
function in the commentary channel, addressed to it:

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(one line, cut here),
or, answering, `<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>`.
The reasoning block is the analysis message (up to the next
`<|start|>assistant`); the final channel's header and end are the answer's
own markup, left out of the content. The template reads `reasoning_effort`."""

from service.formats.base import CallSyntax, Family, ReasoningSyntax

CALLS = CallSyntax("harmony", call_open="<|channel|>commentary to=functions.",
                   name_close=" <|constrain|>json<|message|>", call_close="<|call|>",
                   separator="<|start|>assistant")
REASONING = ReasoningSyntax("harmony", "<|channel|>analysis<|message|>",
                            "<|end|><|start|>assistant",
                            answer_open="<|channel|>final<|message|>", answer_close="<|return|>",
                            prompt_closes=False)


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return "<|channel|>" in template or "<|channel|>" in special_tokens


FAMILY = Family("harmony", CALLS, REASONING, detect,
                "the template writes `<|channel|>` (gpt-oss)")
