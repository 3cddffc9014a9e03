"""A prefix-cache hit comes back as one copy of its blocks with room behind
it, which the cache built from it adopts (engines/transformers/prefix_cache.py,
kv.from_prefix); the text of a hit equal to a miss's is test_batching.py's."""

from __future__ import annotations

import torch
from transformers import AutoConfig

from service.engines.transformers import kv
from service.engines.transformers.prefix_cache import BLOCK_TOKENS, PrefixCache
from tests.harness import models_dir


def _stored(prompt: tuple[int, ...], layers: int):
    """A cache holding `prompt`'s K/V: keys 4 wide, values 3 (head sizes may differ)."""
    torch.manual_seed(0)
    kvs = [(torch.randn(1, 2, len(prompt), 4), torch.randn(1, 2, len(prompt), 3))
           for _ in range(layers)]
    cache = PrefixCache(max_tokens=1024)
    cache.store(prompt, kvs)
    return cache, kvs


def test_a_hit_holds_the_stored_columns_then_room_for_what_comes_next():
    prompt = tuple(range(3 * BLOCK_TOKENS + 5))
    cache, kvs = _stored(prompt, layers=2)
    later = prompt + (999,) * 7  # the same prompt and a new question
    tokens, layers = cache.lookup(later, columns=len(later) + 64)
    assert tokens == 3 * BLOCK_TOKENS
    for (keys, values), (k, v) in zip(layers, kvs, strict=True):
        assert keys.shape == (1, 2, len(later) + 64, 4)
        assert values.shape == (1, 2, len(later) + 64, 3)
        assert torch.equal(keys[:, :, :tokens], k[:, :, :tokens])
        assert torch.equal(values[:, :, :tokens], v[:, :, :tokens])


def test_the_cache_built_from_a_hit_appends_in_its_room_without_copying():
    config = AutoConfig.from_pretrained(models_dir() / "millm-tiny")
    prompt = tuple(range(2 * BLOCK_TOKENS + 1))
    cache, kvs = _stored(prompt, layers=config.num_hidden_layers)
    tokens, layers = cache.lookup(prompt, columns=len(prompt) + 8)
    built = kv.from_prefix(config, layers, tokens)
    layer = built.layers[0]
    assert layer.keys.shape[2] == tokens and built.get_seq_length() == tokens
    where = layer.keys.data_ptr()
    assert where == layers[0][0].data_ptr()  # the lookup's tensor itself, not a copy
    new_k, new_v = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 3)
    keys, values = layer.update(new_k, new_v)
    assert keys.data_ptr() == where  # written into the room, not a new tensor
    assert torch.equal(keys[:, :, :tokens], kvs[0][0][:, :, :tokens])
    assert torch.equal(keys[:, :, tokens:], new_k) and torch.equal(values[:, :, tokens:], new_v)


def test_a_miss_returns_nothing():
    cache, _ = _stored(tuple(range(40)), layers=1)
    assert cache.lookup(tuple(range(1, 41)), columns=100) == (0, [])
