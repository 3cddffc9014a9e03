"""ChatML: the demo model's chat template, and the fallback for checkpoints
that ship none (so both render a conversation the same way); and the one rule
for templates without a system role (`render_folding_system`), which both
engines follow."""

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def render_folding_system(render, messages: list[dict]):
    """`render(messages)` with the model's own template; when the template
    refuses the conversation and it opens with a system turn, the system
    text goes at the head of the first user turn instead (what Gemma 3's own
    template does, and what Gemma 2's, which refuses system turns, needs) and
    rendering is tried once more. The first refusal stands if that fails too."""
    from jinja2 import TemplateError

    try:
        return render(messages)
    except TemplateError:
        folded = _fold_system(messages)
        if folded is None:
            raise
        try:
            return render(folded)
        except TemplateError:
            pass
        raise


def _fold_system(messages: list[dict]) -> list[dict] | None:
    if len(messages) < 2 or messages[0].get("role") != "system" \
            or messages[1].get("role") != "user":
        return None
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    return [{**messages[1], "content": f"{system}\n\n{user}"}, *messages[2:]]
