"""The attention masks of a decode step, and of a lone prompt's columns after
cached ones, handed over ready when that is safe.

A lane's rows are left-padded, so every decode step passes an attention mask.
Given the 2-D mask ([rows, columns], 1 = real token), transformers rebuilds
the 4-D mask its attention reads on every step, at a cost that grows with
rows x columns: about a tenth of a 16-row step on the demo model. For a
one-token query the causal rule allows every cached column, so that 4-D mask
is just the padding mask as booleans, [rows, 1, 1, columns], which costs
nothing to make (`decode_mask`).

A lone prompt (one row, no padding) computed after columns already in its
cache (a prefix-cache hit, or its second chunk on) has no padding at all: its
4-D mask is the causal rule alone, column j visible to query column i when
j <= i (`prefix_mask`), which transformers would otherwise build on every
such pass (about a tenth of a 20-column pass over a 528-column cached prefix
on the demo model). A prompt's first pass from column 0 passes no mask, so
attention stays causal by itself.

Only where nothing else goes into the mask: attention through SDPA (which
reads a boolean mask as "may attend"), full attention on every layer (a
sliding window or chunked attention would need more than padding), and no
recurrent layer (those read the 2-D mask themselves). `suffices` also runs
one padded decode step and one cached-prefix pass both ways when the model
loads and keeps transformers' masks unless the logits are identical.
"""

from __future__ import annotations

import torch

from service.engines.transformers import kv


def suffices(model, recurrent: bool) -> bool:
    """Whether decode steps may pass `decode_mask(mask)` for this model."""
    config = model.config.get_text_config(decoder=True)
    if recurrent or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "sliding_window", None) or any(
            kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
        return False
    try:
        return _same_logits(model)
    except Exception:  # noqa: BLE001 - any doubt keeps the mask transformers builds
        return False


def decode_mask(mask: torch.Tensor) -> torch.Tensor:
    """[rows, columns] 1/0 -> [rows, 1, 1, columns] booleans."""
    return mask.bool()[:, None, None, :]


def prefix_mask(start: int, end: int, device) -> torch.Tensor:
    """One unpadded row's query columns [start, end) over columns [0, end):
    [1, 1, end - start, end] booleans, True where attention may look."""
    columns = torch.arange(end, device=device)
    return (columns[None, :] <= torch.arange(start, end, device=device)[:, None])[None, None]


def _same_logits(model) -> bool:
    return _same_decode_logits(model) and _same_prefix_logits(model)


def _same_prefix_logits(model) -> bool:
    """Three columns after two cached ones, with transformers' mask and with ours."""
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3, 4, 5]], device=device)
    logits = []
    with torch.inference_mode():
        for mask in (None, prefix_mask(2, 5, device)):
            cache = kv.new_cache(model.config)
            model(input_ids=ids[:, :2], past_key_values=cache, use_cache=True)
            out = model(input_ids=ids[:, 2:], attention_mask=mask,
                        position_ids=torch.arange(2, 5, device=device)[None],
                        past_key_values=cache, use_cache=True)
            logits.append(out.logits.float())
    return torch.equal(logits[0], logits[1])


def _same_decode_logits(model) -> bool:
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 3, 4, 5]], device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], device=device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    step = torch.ones((2, 1), dtype=torch.long, device=device)
    full = torch.cat([mask, step], dim=1)
    logits = []
    with torch.inference_mode():
        for attention in (full, decode_mask(full)):
            cache = kv.new_cache(model.config)
            model(input_ids=ids, attention_mask=mask, position_ids=positions,
                  past_key_values=cache, use_cache=True)
            out = model(input_ids=step * 6, attention_mask=attention,
                        position_ids=mask.sum(1, keepdim=True), past_key_values=cache,
                        use_cache=True)
            logits.append(out.logits[:, -1].float())
    return torch.equal(logits[0], logits[1])
