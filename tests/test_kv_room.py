"""The lanes' attention cache layer (engines/transformers/kv.py RoomyLayer):
it appends in place while its room lasts, holds exactly what concatenation
would, survives a lane replacing its tensors (rows selected, joined, trimmed),
and gives the demo model bit-equal logits to transformers' DynamicCache."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from service.engines.transformers import kv
from tests import harness


def _columns(rows: int, count: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 2, count, 4, generator=torch.Generator().manual_seed(seed))


def test_appends_in_place_and_holds_what_concatenation_holds():
    layer, keys = kv.RoomyLayer(), []
    for step in range(kv.SPARE_COLUMNS + 3):
        new = _columns(3, 5 if step == 0 else 1, step)
        keys.append(new)
        got, _ = layer.update(new, -new)
        if step == 0:
            start = got.data_ptr()
        assert torch.equal(got, torch.cat(keys, dim=2))
        assert torch.equal(layer.values, -got)
        # The first reservation holds 5 + SPARE_COLUMNS columns: no copy till then.
        assert (got.data_ptr() == start) == (got.shape[2] <= 5 + kv.SPARE_COLUMNS)


def test_a_lane_replacing_the_tensors_gets_a_fresh_room():
    config = AutoModelForCausalLM.from_pretrained(harness.models_dir() / "millm-tiny").config
    cache = kv.new_cache(config)
    assert all(type(layer) is kv.RoomyLayer for layer in cache.layers)
    for layer in cache.layers:
        layer.update(_columns(3, 6, 1), _columns(3, 6, 2))
    kv.select_rows(cache, torch.tensor([2, 0]))
    kv.trim_columns(cache, 2)
    other = kv.new_cache(config)
    for layer in other.layers:
        layer.update(_columns(1, 2, 3), _columns(1, 2, 4))
    kv.append_rows(cache, other, 0, 2)
    step = _columns(3, 1, 5)
    for layer in cache.layers:
        keys, values = layer.update(step, step)
        want = torch.cat([_columns(3, 6, 1)[[2, 0], :, 2:], torch.cat(
            [torch.zeros(1, 2, 2, 4), _columns(1, 2, 3)], dim=2)])
        assert torch.equal(keys[:, :, :4], want)
        assert torch.equal(keys[:, :, 4:], step) and torch.equal(values[:, :, 4:], step)


def test_demo_model_logits_equal_dynamic_cache_ones():
    model = AutoModelForCausalLM.from_pretrained(harness.models_dir() / "millm-tiny",
                                                 dtype=torch.float32).eval()
    prompt = torch.tensor([[0, 0, 5, 17, 300], [42, 9, 1000, 77, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    runs = []
    with torch.inference_mode():
        for cache in (DynamicCache(config=model.config), kv.new_cache(model.config)):
            logits, ids, held = [], prompt, mask
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            for _ in range(12):
                out = model(input_ids=ids, attention_mask=held, position_ids=positions,
                            past_key_values=cache, use_cache=True)
                logits.append(out.logits[:, -1])
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
                positions = positions[:, -1:] + 1
                held = torch.cat([held, torch.ones(2, 1, dtype=torch.long)], dim=1)
            runs.append(torch.stack(logits))
    assert torch.equal(runs[0], runs[1])


def _same_state(ours, theirs) -> bool:
    return type(ours) is type(theirs) and vars(ours).keys() == vars(theirs).keys() and all(
        (a is b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(vars(ours).values(), vars(theirs).values(), strict=True))


def test_new_cache_builds_the_layers_dynamic_cache_would_for_every_family():
    """new_cache derives the layer kinds once per config (kv._layout), not
    through the config's attribute hooks on every prompt: the same layers as
    DynamicCache(config=...), attention ones as RoomyLayers, every time."""
    from transformers import AutoConfig

    from service.demo_model.families import FAMILIES

    for family in FAMILIES:
        config = AutoConfig.for_model(family.name, vocab_size=64, **family.config)
        theirs = DynamicCache(config=config)
        for _ in range(2):  # the second from the remembered layout
            ours = kv.new_cache(config)
            assert ours.layer_class_to_replicate is None and not ours.offloading
            assert len(ours.layers) == len(theirs.layers), family.name
            for mine, want in zip(ours.layers, theirs.layers, strict=True):
                if type(want) in (kv.DynamicLayer, kv.DynamicSlidingWindowLayer):
                    assert type(mine) is kv.RoomyLayer and not mine.is_initialized
                else:
                    assert _same_state(mine, want), (family.name, type(want).__name__)
        assert ours.layers[0] is not kv.new_cache(config).layers[0]  # fresh layers each time
