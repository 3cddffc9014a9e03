"""What the conformance suite compares the engine with: each family's tiny
checkpoint run directly by transformers in the test process (`generate()`
for greedy text, a plain forward pass for log-probabilities, forward hooks
written here for steering and SAE readout), never by the engine's code."""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib

import torch
from safetensors.torch import load_file

from service.demo_model.families import Family

# <|endoftext|>, <|im_start|>, <|im_end|>: with ignore_eos the engine never
# emits a special token, so the reference must not either.
SPECIAL_IDS = [0, 1, 2]


class Reference:
    def __init__(self, family: Family, path: pathlib.Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.family = family
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, split_special_tokens=True)["input_ids"]

    def chat_ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def layers(self):
        module = self.model
        for part in self.family.layers_path.split("."):
            module = getattr(module, part)
        return module

    def greedy(self, ids: list[int], tokens: int, delta: torch.Tensor | None = None,
               layer: int = 1) -> list[int]:
        """`tokens` greedy tokens by generate(), never a special one; `delta`
        added to the output of decoder layer `layer` at every position."""
        hook = self._adding(delta, layer) if delta is not None else contextlib.nullcontext()
        with torch.inference_mode(), hook:
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(
                (1, len(ids)), dtype=torch.long), max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, suppress_tokens=SPECIAL_IDS)
        return out[0, len(ids):].tolist()

    @contextlib.contextmanager
    def _adding(self, delta: torch.Tensor, layer: int):
        def hook(module, args, output):
            if isinstance(output, tuple):
                return (output[0] + delta, *output[1:])
            return output + delta

        handle = self.layers[layer].register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    def log_softmax(self, ids: list[int]) -> torch.Tensor:
        """[positions, vocab] log-probabilities of a plain forward pass."""
        with torch.inference_mode():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def residual(self, ids: list[int], layer: int) -> torch.Tensor:
        """The output of decoder layer `layer` at every position [positions, d]."""
        seen = {}

        def hook(module, args, output):
            seen["hidden"] = output[0] if isinstance(output, tuple) else output

        handle = self.layers[layer].register_forward_hook(hook)
        try:
            with torch.inference_mode():
                self.model(torch.tensor([ids]))
        finally:
            handle.remove()
        return seen["hidden"][0].float()


@functools.cache
def demo_sae(directory: pathlib.Path) -> tuple[dict, dict]:
    """(cfg, tensors) of a demo SAE in SAELens format."""
    cfg = json.loads((directory / "cfg.json").read_text())
    return cfg, load_file(str(directory / "sae_weights.safetensors"))


def sae_encode(directory: pathlib.Path, hidden: torch.Tensor) -> torch.Tensor:
    """SAELens's standard encoder: relu((x - b_dec) @ W_enc + b_enc)."""
    cfg, w = demo_sae(directory)
    assert cfg["architecture"] == "standard"
    x = hidden - w["b_dec"] if cfg["apply_b_dec_to_input"] else hidden
    return torch.relu(x @ w["W_enc"] + w["b_enc"])
