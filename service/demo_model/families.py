"""Tiny random checkpoints of real model families, built offline.

Users drop real checkpoints (Llama, Qwen, Gemma, Mistral, Phi-3, LFM2, GPT-2,
GPT-NeoX, ...) into the models dir; no hub is reachable here, so the
conformance suite (tests/test_model_families.py) builds one checkpoint per
family from its transformers config instead: a few hundred thousand seeded
random parameters, the demo model's tokenizer and, where the family has one,
a sliding window short enough that the suite's prompts run past it. Every
family has the demo's hidden size (64) and at least two decoder layers, so the
demo SAEs (layers 0 and 1) attach to each of them.

Random weights say nothing about quality; they exercise exactly what differs
between families: attention variants (sliding windows, soft-capping, parallel
residuals, partial rotary), mixture-of-experts, hybrid convolution caches,
where the decoder layers live, and chat templates with and without a system
role.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from dataclasses import dataclass

from service.chat_template import CHATML

SEED = 4321
HIDDEN = 64
SLIDING_WINDOW = 16  # tokens; the suite's prompts are longer
CONTEXT = 512

# Gemma 2's own template refuses a system turn; Gemma 3's folds it into the
# first user turn. Both are written here with the demo tokenizer's ChatML
# markers (the model's turn is called "model", as in Gemma's templates).
GEMMA2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- raise_exception('System role not supported') }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<|im_start|>' + role + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>model\\n' }}{%- endif %}"
)
GEMMA3_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<|im_start|>' + role + '\\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>model\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str  # the model_type, and the checkpoint's directory name
    config: dict  # the transformers config's fields besides the shared ones
    layers_path: str  # where its decoder layers live (a list of modules)
    sliding_window: int | None = None
    template: str = CHATML
    system_role: bool = True  # whether its own template renders a system turn

    @property
    def model_id(self) -> str:
        return f"tiny-{self.name.replace('_', '-')}"


_LLAMA_LIKE = {"hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": CONTEXT}
_GEMMA = {**_LLAMA_LIKE, "head_dim": 16, "query_pre_attn_scalar": 16,
          "sliding_window": SLIDING_WINDOW}

FAMILIES: tuple[Family, ...] = (
    Family("llama", _LLAMA_LIKE, "model.layers"),
    Family("qwen2", _LLAMA_LIKE, "model.layers"),
    Family("qwen3", {**_LLAMA_LIKE, "head_dim": 16}, "model.layers"),
    Family("qwen3_moe", {**_LLAMA_LIKE, "head_dim": 16, "num_experts": 4,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                         "norm_topk_prob": True}, "model.layers"),
    Family("gemma2", {**_GEMMA, "layer_types": ["sliding_attention", "full_attention"]},
           "model.layers", SLIDING_WINDOW, GEMMA2_TEMPLATE, system_role=False),
    Family("gemma3_text", {**_GEMMA, "layer_types": ["sliding_attention", "full_attention"]},
           "model.layers", SLIDING_WINDOW, GEMMA3_TEMPLATE),
    Family("mistral", {**_LLAMA_LIKE, "sliding_window": SLIDING_WINDOW}, "model.layers",
           SLIDING_WINDOW),
    Family("phi3", {**_LLAMA_LIKE, "sliding_window": SLIDING_WINDOW,
                    "original_max_position_embeddings": CONTEXT}, "model.layers",
           SLIDING_WINDOW),
    # Liquid's hybrid: short convolutions (a per-row state, no KV) and attention.
    Family("lfm2", {"hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": 3,
                    "num_attention_heads": 4, "num_key_value_heads": 2,
                    "max_position_embeddings": CONTEXT, "block_auto_adjust_ff_dim": False,
                    "layer_types": ["conv", "full_attention", "conv"]}, "model.layers"),
    Family("gpt2", {"n_embd": HIDDEN, "n_layer": 2, "n_head": 4, "n_positions": CONTEXT},
           "transformer.h"),
    Family("gpt_neox", {"hidden_size": HIDDEN, "intermediate_size": 128,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "max_position_embeddings": CONTEXT, "rotary_pct": 0.25},
           "gpt_neox.layers"),
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def by_name(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def build(family: Family, tokenizer_dir: pathlib.Path, models_dir: pathlib.Path
          ) -> pathlib.Path:
    """Write `family`'s checkpoint under models_dir (same seed, same weights),
    with the tokenizer of the checkpoint in `tokenizer_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from service.demo_model import build as demo

    tokenizer_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    pad = 0  # <|endoftext|>
    eos = 2  # <|im_end|>
    config = AutoConfig.for_model(family.name, vocab_size=vocab, bos_token_id=None,
                                  eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=True,
                                  **family.config)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        # A wider spread than the usual init, so greedy choices are clear-cut
        # rather than near-ties that rounding could flip.
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.08)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    target = models_dir / family.model_id
    shutil.rmtree(target, ignore_errors=True)
    model.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, target / name)
    tokenizer_config["model_max_length"] = CONTEXT
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (target / "chat_template.jinja").write_text(family.template)
    (target / demo.METADATA_FILE).write_text(json.dumps(
        {"id": family.model_id, "owned_by": "millm", "revision": demo.weights_revision(target),
         "created": 0}, indent=2) + "\n")
    return target


def build_all(tokenizer_dir: pathlib.Path, models_dir: pathlib.Path,
              families: tuple[Family, ...] = FAMILIES) -> dict[str, pathlib.Path]:
    return {f.name: build(f, tokenizer_dir, models_dir) for f in families}
