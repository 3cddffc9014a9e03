"""Grouped-query attention without copying the key/value heads, for passes of
several query columns on a CPU.

When a model has fewer key/value heads than query heads (GQA), transformers'
SDPA path picks one of three ways per call: no mask, PyTorch takes the groups
itself (`enable_gqa`); one query column, the query heads are folded onto the
K/V heads; otherwise each cached K/V head is copied once for every query head
it serves (`repeat_kv`). A pass of several columns with a mask is what a
prefix-cache hit makes (the question after a cached system prompt) and what
prompts prefilled together make, so each of those copied the whole cache of
every layer: on the demo model 2–3 % of a warm request's time to first
token.

PyTorch's SDPA with `enable_gqa` gives the same bits as after the copy on a
CPU (measured for boolean and additive masks, float32, bfloat16 and float16,
fully masked rows included), but not the same bits as the one-column fold, so
decode steps keep theirs. transformers exposes the choice only as a
process-wide environment switch; `install` wraps its predicate instead, so
that the calling thread opts in for one pass (`multi_column`) and every other
call, other threads' included, decides as before. The model thread opts in
only after a cached-prefix pass of the loaded model gave identical logits both
ways (`choose`); on CUDA the option is never taken (a mask with `enable_gqa`
would send attention to its slow math kernel there).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import torch

from service.engines.transformers import kv
from service.engines.transformers.decode_mask import prefix_mask

log = logging.getLogger(__name__)

_local = threading.local()
_installed = False


def install() -> bool:
    """Wrap transformers' SDPA predicate once; False if it is not there."""
    global _installed
    if _installed:
        return True
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return False
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None:
        return False

    def use_gqa_in_sdpa(attention_mask, key, value):
        if getattr(_local, "grouped", False) and key.device.type == "cpu":
            return True
        return original(attention_mask, key, value)

    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
    _installed = True
    return True


@contextlib.contextmanager
def multi_column(enabled: bool):
    """While it lasts, this thread's masked attention takes the K/V groups in
    place (only meant around passes of more than one query column)."""
    if not enabled:
        yield
        return
    _local.grouped = True
    try:
        yield
    finally:
        _local.grouped = False


def choose(model, device: torch.device) -> bool:
    """Whether the model thread may use `multi_column` for `model`."""
    if not _grouped(model, device) or not install():
        return False
    try:
        plain = _passes(model)
        with multi_column(True):
            grouped = _passes(model)
    except Exception:  # noqa: BLE001 - any doubt keeps transformers' own path
        log.warning("grouped-query attention check failed: K/V heads are copied",
                    exc_info=True)
        return False
    if not all(torch.equal(a, b) for a, b in zip(plain, grouped, strict=True)):
        log.info("grouped-query attention changes this model's logits: K/V heads are copied")
        return False
    return True


def _grouped(model, device: torch.device) -> bool:
    if device.type != "cpu" or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    config = model.config.get_text_config(decoder=True)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv_heads and kv_heads < heads)


def _passes(model) -> list[torch.Tensor]:
    """The logits of the two multi-column passes the engine makes with a mask:
    three columns after two cached ones (its ready-made mask), and two
    left-padded prompts prefilled together (transformers' mask)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 3, 4, 5]], device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], device=device)
    with torch.inference_mode():
        cache = kv.new_cache(model.config)
        model(input_ids=ids[:1, :2], past_key_values=cache, use_cache=True)
        after_prefix = model(input_ids=ids[:1, 2:], attention_mask=prefix_mask(2, 5, device),
                             position_ids=torch.arange(2, 5, device=device)[None],
                             past_key_values=cache, use_cache=True).logits.float()
        padded = model(input_ids=ids, attention_mask=mask,
                       position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                       past_key_values=kv.new_cache(model.config), use_cache=True)
    return [after_prefix, padded.logits.float()]
