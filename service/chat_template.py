"""ChatML: the demo model's chat template, and the fallback for checkpoints
that ship none (so both render a conversation the same way); and the one rule
for templates without a system role, or with one only at the head of the
conversation (`render_folding_system`), which both engines follow.

A plain conversation renders as `<|im_start|>{role}\\n{content}<|im_end|>\\n`
per message, then `<|im_start|>assistant\\n` when a generation prompt is asked
for. Tools follow Hugging Face's `apply_chat_template(messages, tools=...)`
convention, as Qwen2.5's template renders them (the Hermes style that the
tool grammar of requests/tools.py constrains):

- with `tools`, a system turn (the first system message's content, then a
  blank line, when there is one) lists them inside `<tools></tools>`, one
  JSON object a line, and says how to call one;
- an assistant message's `tool_calls` follow its content (if any), each as
  `<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`, one
  line apart;
- `tool` messages are a user turn of `<tool_response>\\n...\\n</tool_response>`
  blocks, one turn for consecutive tool messages.

The template uses only plain Jinja and `tojson`, so Hugging Face's renderer
and llama-cpp-python's Jinja2ChatFormatter (the GGUF engine's) agree; render()
renders it the same way without either, for the demo model's training text.
"""

from __future__ import annotations

import json

CHATML = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name' }}
    {{- ' and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first and tools %}
        {#- Already in the tools' system turn. #}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.content %}
            {{- message.content + '\n' }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set function = call.function if call.function is defined else call %}
            {%- if not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + function.name + '", "arguments": ' }}
            {%- if function.arguments is string %}
                {{- function.arguments }}
            {%- else %}
                {{- function.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # As Hugging Face's and llama-cpp-python's: no HTML escaping, non-ASCII kept.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def render(messages: list[dict], tools: list[dict] | None = None,
           add_generation_prompt: bool = False, template: str = CHATML) -> str:
    """Render a conversation with a sandboxed Jinja environment configured as
    Hugging Face's and llama-cpp-python's are (trim_blocks, lstrip_blocks,
    loop controls, their `tojson`)."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    return env.from_string(template).render(messages=messages, tools=tools,
                                            add_generation_prompt=add_generation_prompt)


def render_folding_system(render_with, messages: list[dict]):
    """`render_with(messages)`: the model's own template. System turns stay
    where the caller put them while the template renders them there (ChatML
    does; agents send instructions mid-conversation). When the template
    refuses the conversation, two repairs are tried in turn, each rendered:

    - system turns after the first message are merged, in order, into the
      leading system turn (one is made when the conversation has none):
      templates such as Qwen3's allow a system turn only at the head;
    - then the (leading) system text goes at the head of the first user turn
      (what Gemma 3's own template does, and what Gemma 2's, which refuses
      system turns, needs).

    The first refusal stands if every repair fails too."""
    from jinja2 import TemplateError

    try:
        return render_with(messages)
    except TemplateError:
        merged = _merge_system(messages)
        for candidate in (merged, _fold_system(merged or messages)):
            if candidate is None:
                continue
            try:
                return render_with(candidate)
            except TemplateError:
                pass
        raise


def _merge_system(messages: list[dict]) -> list[dict] | None:
    """Every system turn's text in one leading system turn; None when there
    is no system turn after the first message (nothing to merge)."""
    later = [m for m in messages[1:] if m.get("role") == "system"]
    if not later or not all(isinstance(m.get("content"), str) for m in later):
        return None
    head = messages[0] if messages and messages[0].get("role") == "system" else None
    if head is not None and not isinstance(head.get("content"), str):
        return None
    texts = ([head["content"]] if head is not None else []) + [m["content"] for m in later]
    rest = [m for m in messages[1 if head is not None else 0:] if m.get("role") != "system"]
    return [{**(head or {}), "role": "system", "content": "\n\n".join(texts)}, *rest]


def _fold_system(messages: list[dict]) -> list[dict] | None:
    if len(messages) < 2 or messages[0].get("role") != "system" \
            or messages[1].get("role") != "user":
        return None
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    return [{**messages[1], "content": f"{system}\n\n{user}"}, *messages[2:]]
