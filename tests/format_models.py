# ruff: noqa: E501  (the templates are written one Jinja statement a line)
"""Model directories in real families' output syntaxes, made from the demo
model's weights and tokenizer for tests/test_model_formats.py.

Each chat template below is written here from its family's format (how the
family's published template renders tools, calls, tool results and
thinking), with the family's own markers as text: the demo tokenizer has
none of them as special tokens, which is the point of detection from the
template text alone. Assistant turns end with the demo tokenizer's end of
turn, `<|im_end|>`, the token the model stops with.
"""

from __future__ import annotations

import json
import pathlib
import shutil

# DeepSeek R1 (and its distills): the generation prompt opens <think>; an
# earlier assistant turn keeps only what follows its reasoning; calls are
# grouped, typed "function" and fenced as ```json.
R1 = r"""{%- set ns = namespace(system='') %}
{%- for m in messages %}{%- if m.role == 'system' %}{%- set ns.system = m.content %}{%- endif %}{%- endfor %}
{{- ns.system }}
{%- if tools %}{{- '\n\n## Tools\nCall a function with <｜tool▁calls▁begin｜>.\n' }}
{%- for t in tools %}{{- t | tojson + '\n' }}{%- endfor %}{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}{{- '<｜User｜>' + m.content }}
{%- elif m.role == 'assistant' %}
{%- set content = m.content or '' %}
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}
{{- '<｜Assistant｜>' + content }}
{%- if m.tool_calls %}{{- '<｜tool▁calls▁begin｜>' }}
{%- for c in m.tool_calls %}{%- if not loop.first %}{{- '\n' }}{%- endif %}
{{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + c.function.name + '\n```json\n' + c.function.arguments | tojson + '\n```<｜tool▁call▁end｜>' }}
{%- endfor %}{{- '<｜tool▁calls▁end｜>' }}{%- endif %}
{{- '<|im_end|>' }}
{%- elif m.role == 'tool' %}{{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜><｜tool▁outputs▁end｜>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\n' }}{%- endif %}"""

# DeepSeek V3.1: the same markers; a call is NAME<｜tool▁sep｜>ARGS, unfenced;
# thinking is chosen by the `thinking` variable.
V31 = (R1.replace("'<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + c.function.name + "
                  "'\\n```json\\n' + c.function.arguments | tojson + '\\n```<｜tool▁call▁end｜>'",
                  "'<｜tool▁call▁begin｜>' + c.function.name + '<｜tool▁sep｜>' + "
                  "c.function.arguments | tojson + '<｜tool▁call▁end｜>'")
       .replace("{{- '<｜Assistant｜><think>\\n' }}",
                "{{- '<｜Assistant｜>' + ('<think>' if thinking is defined and thinking "
                "else '</think>') }}"))

# Mistral (tokenizer v11+): tools announced before the last user turn in
# [AVAILABLE_TOOLS]; each call [TOOL_CALLS]NAME[ARGS]{...}; results in
# [TOOL_RESULTS].
MISTRAL = r"""{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' %}{{- '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' }}
{%- elif m.role == 'user' %}
{%- if tools and loop.index0 == ns.last_user %}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{{- '[INST]' + m.content + '[/INST]' }}
{%- elif m.role == 'assistant' %}{{- m.content or '' }}
{%- for c in m.tool_calls or [] %}{{- '[TOOL_CALLS]' + c.function.name + '[ARGS]' + c.function.arguments | tojson }}{%- endfor %}
{{- '<|im_end|>' }}
{%- elif m.role == 'tool' %}{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}"""

# Llama 3.1: header-framed turns; tools listed in the user turn with the
# instruction to answer {"name": ..., "parameters": ...}; results from ipython.
LLAMA31 = r"""{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- for c in m.tool_calls %}{{- '{"name": "' + c.function.name + '", "parameters": ' + c.function.arguments | tojson + '}' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif m.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- else %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' }}
{%- if tools and m.role == 'user' and loop.last %}
{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n\n' }}
{%- for t in tools %}{{- t | tojson + '\n\n' }}{%- endfor %}{%- endif %}
{{- m.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""

# Qwen3: ChatML with Hermes calls; the model opens <think> itself, and
# enable_thinking false closes an empty block in the generation prompt. An
# assistant turn after the last user turn (a tool-calling round) keeps its
# reasoning_content in a <think> block; earlier turns drop it.
QWEN3 = r"""{%- if tools %}{{- '<|im_start|>system\n# Tools\n<tools>' }}
{%- for t in tools %}{{- '\n' + t | tojson }}{%- endfor %}
{{- '\n</tools>\nCall a function inside <tool_call></tool_call> tags.<|im_end|>\n' }}{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}
{%- if m.reasoning_content and loop.index0 > ns.last_user %}{{- '<think>\n' + m.reasoning_content + '\n</think>\n\n' }}{%- endif %}
{{- m.content or '' }}
{%- for c in m.tool_calls or [] %}{{- '\n<tool_call>\n{"name": "' + c.function.name + '", "arguments": ' + c.function.arguments | tojson + '}\n</tool_call>' }}{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

# gpt-oss harmony: a system message naming the reasoning effort, tools as a
# TypeScript-like namespace in a developer message, each message framed by
# <|start|>ROLE ... <|end|> with its channel; an assistant's calls in the
# commentary channel (its reasoning_content, before calls, in analysis);
# earlier final answers without their analysis; the generation prompt opens
# an assistant message whose channel the model chooses.
HARMONY = r"""{{- '<|start|>system<|message|>You are a helpful assistant.\nReasoning: ' + (reasoning_effort or 'medium') + '\n\n# Valid channels: analysis, commentary, final.<|end|>' }}
{%- if tools %}{{- '<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n' }}
{%- for t in tools %}{{- 'type ' + t.function.name + ' = (_: ' + t.function.parameters | tojson + ') => any;\n' }}{%- endfor %}
{{- '} // namespace functions<|end|>' }}{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}
{%- if m.reasoning_content %}{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.reasoning_content + '<|end|>' }}{%- endif %}
{%- for c in m.tool_calls %}{{- '<|start|>assistant<|channel|>commentary to=functions.' + c.function.name + ' <|constrain|>json<|message|>' + c.function.arguments | tojson + '<|call|>' }}{%- endfor %}
{%- elif m.role == 'assistant' %}{{- '<|start|>assistant<|channel|>final<|message|>' + (m.content or '') + '<|end|>' }}
{%- elif m.role == 'tool' %}{{- '<|start|>functions.tool to=assistant<|channel|>commentary<|message|>' + m.content + '<|end|>' }}
{%- else %}{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"""

# Qwen3-Coder: ChatML; tools listed as <function> elements; a call is XML,
# one <parameter=NAME> element per argument (strings raw, other values JSON).
QWEN3_CODER = r"""{%- if tools %}{{- '<|im_start|>system\n# Tools\n\n<tools>' }}
{%- for t in tools %}{{- '\n<function>\n<name>' + t.function.name + '</name>\n<parameters>' + t.function.parameters | tojson + '</parameters>\n</function>' }}{%- endfor %}
{{- '\n</tools>\n\nTo call a function reply:\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call><|im_end|>\n' }}{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\n' + (m.content or '') }}
{%- for c in m.tool_calls or [] %}{{- '\n<tool_call>\n<function=' + c.function.name + '>\n' }}
{%- for key, value in c.function.arguments.items() %}{{- '<parameter=' + key + '>\n' + (value if value is string else value | tojson) + '\n</parameter>\n' }}{%- endfor %}
{{- '</function>\n</tool_call>' }}{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""

# Gemma 4: <|turn>ROLE ... <turn|> turns; tools declared in the system turn;
# a call <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>, its result
# a <|tool_response> in the next turn; the model may think in a thought channel.
GEMMA4 = r"""{%- macro g(v) -%}
{%- if v is mapping -%}{{- '{' -}}{%- for k, x in v.items() -%}{{- k + ':' -}}{{- g(x) -}}{%- if not loop.last -%},{%- endif -%}{%- endfor -%}{{- '}' -}}
{%- elif v is string -%}{{- '<|"|>' + v + '<|"|>' -}}
{%- elif v is sequence -%}{{- '[' -}}{%- for x in v -%}{{- g(x) -}}{%- if not loop.last -%},{%- endif -%}{%- endfor -%}{{- ']' -}}
{%- else -%}{{- v | tojson -}}{%- endif -%}
{%- endmacro -%}
{%- if tools or messages[0].role == 'system' %}{{- '<|turn>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n' }}{%- endif %}
{%- for t in tools or [] %}{{- '<|tool>declaration:' + t.function.name + g(t.function.parameters) + '<tool|>' }}{%- endfor %}
{{- '<turn|>\n' }}{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}{{- '<|turn>model\n' + (m.content or '') }}
{%- for c in m.tool_calls or [] %}{{- '<|tool_call>call:' + c.function.name + g(c.function.arguments) + '<tool_call|>' }}{%- endfor %}
{{- '<turn|>\n' }}
{%- elif m.role == 'tool' %}{{- '<|turn>user\n<|tool_response>response:' + m.content + '<tool_response|><turn|>\n' }}
{%- elif m.role != 'system' %}{{- '<|turn>' + m.role + '\n' + m.content + '<turn|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|turn>model\n' }}{%- endif %}"""

TEMPLATES = {"tiny-harmony": HARMONY, "tiny-qwen3-coder": QWEN3_CODER, "tiny-gemma4": GEMMA4,
             "tiny-r1": R1, "tiny-v31": V31, "tiny-mistral": MISTRAL, "tiny-llama31": LLAMA31,
             "tiny-qwen3": QWEN3}
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json")


def build(demo: pathlib.Path, target: pathlib.Path, model_id: str, template: str,
          settings: dict | None = None) -> pathlib.Path:
    """A checkpoint directory: the demo's weights and tokenizer, `template`
    as its chat template, `settings` in its millm_model.json."""
    path = target / model_id
    path.mkdir(parents=True)
    for name in FILES:
        shutil.copy(demo / name, path / name)
    (path / "chat_template.jinja").write_text(template)
    (path / "millm_model.json").write_text(json.dumps({"id": model_id, **(settings or {})}))
    return path


def build_gguf(checkpoint: pathlib.Path, target: pathlib.Path) -> str:
    """Its F32 GGUF export in a repository of its own; returns the model id."""
    from service.demo_model import gguf_export

    repo = f"{checkpoint.name}-gguf"
    (target / repo).mkdir()
    gguf_export.write_file(checkpoint, target / repo / f"{repo}-F32.gguf", "F32", repo)
    return f"{repo}:F32"


GGUF_EXPORTED = ("tiny-r1", "tiny-mistral", "tiny-llama31")
# gpt-oss's markers, the first the one its answers open with.
HARMONY_MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>",
                   "<|call|>")
# The request the *-marked models' first marker is tuned to (build_with_markup_tokens).
MARKED_ASK = [{"role": "user", "content": "Ping, please."}]
MARKED_TOOLS = [{"type": "function", "function": {"name": "ping", "description": "", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}]


def serve(tmp_path_factory, name: str):
    """An engine and bridge of a test module's own on every model above
    (the three GGUF exports too, as '<id>-gguf:F32'), plus tiny-overridden
    (a Qwen3 template whose settings name Mistral's syntax and no reasoning),
    tiny-misnamed (a setting naming no format), and tiny-mistral-marked and
    tiny-harmony-marked, whose tokenizers have their family's markers as
    special tokens (also as GGUF)."""
    from tests import harness

    models = tmp_path_factory.mktemp(f"{name}-models")
    demo = harness.models_dir() / "millm-tiny"
    for model_id, template in TEMPLATES.items():
        path = build(demo, models, model_id, template)
        if model_id in GGUF_EXPORTED:
            build_gguf(path, models)
    build(demo, models, "tiny-overridden", QWEN3,
          {"tool_call_format": "mistral", "reasoning_format": "none"})
    build(demo, models, "tiny-misnamed", QWEN3, {"tool_call_format": "klingon"})
    marked = build_with_markup_tokens(demo, models, "tiny-mistral-marked", MISTRAL,
                                      ("[TOOL_CALLS]", "[ARGS]"), MARKED_ASK, MARKED_TOOLS)
    build_gguf(marked, models)
    marked = build_with_markup_tokens(demo, models, "tiny-harmony-marked", HARMONY,
                                      HARMONY_MARKERS, MARKED_ASK, MARKED_TOOLS)
    build_gguf(marked, models)
    return harness.OwnStack(tmp_path_factory.mktemp(name), MILLM_MODELS_DIR=str(models),
                            MILLM_MODEL="tiny-r1")


def build_with_markup_tokens(demo: pathlib.Path, target: pathlib.Path, model_id: str,
                             template: str, markers: tuple[str, ...], messages: list[dict],
                             tools: list[dict]) -> pathlib.Path:
    """A checkpoint whose tokenizer has `markers` as special tokens (new ids
    after the demo's), as real families' tokenizers have theirs. The new rows
    of the output matrix are zero but the first marker's, which points along
    the model's last hidden state for `messages` and `tools`: the model's
    first answer token is that marker when the grammar allows it."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build(demo, target, model_id, template)
    tokenizer_json = json.loads((path / "tokenizer.json").read_text())
    first = 1 + max([*tokenizer_json["model"]["vocab"].values(),
                     *(t["id"] for t in tokenizer_json["added_tokens"])])
    for k, marker in enumerate(markers):
        tokenizer_json["added_tokens"].append({
            "id": first + k, "content": marker, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True})
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = first + len(markers)
    (path / "config.json").write_text(json.dumps(config))
    weights = load_file(path / "model.safetensors")
    rows = np.zeros((len(markers), weights["lm_head.weight"].shape[1]), dtype=np.float32)
    weights["lm_head.weight"] = np.concatenate([weights["lm_head.weight"], rows])
    weights["model.embed_tokens.weight"] = np.concatenate([
        weights["model.embed_tokens.weight"],
        np.tile(weights["model.embed_tokens.weight"].mean(0), (len(markers), 1))])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    # The prompt may hold markers too: its last hidden state from the grown model.
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                           chat_template=template, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1][0, -1].numpy()
    weights["lm_head.weight"][first] = 60.0 * hidden / float(hidden @ hidden)  # its logit: 60
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path
