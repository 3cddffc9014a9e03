"""A long prompt's keys and values for training, at a fraction of the cost.

The coding-agent sessions (agent_sessions.py) put the model's decision after
prompts of up to 20,000 tokens. Learned whole, such a sequence costs seconds a
step on one thread: every position attends to every earlier one, forward and
backward. Only the last few hundred positions are learned, though, and what
they need from the prompt is its keys and values at each layer.

`prefix_cache` computes those keys and values with gradient, but the
attention that mixes the prompt's own positions (the quadratic part) without
it: each layer's keys and values are a cheap function of its input, so the
model still learns what a prompt's filler should look like to a query (say,
nothing worth attending to), while the mixing inside the prompt is taken as
it is. Exact in the forward pass: the learned positions see the same keys
and values a whole forward pass would give them.
"""

from __future__ import annotations


def prefix_cache(model, embeds):
    """A DynamicCache of a Llama model's keys and values over `embeds` (one
    sequence), differentiable except through attention within the prefix."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    inner = model.model
    length = embeds.shape[1]
    cos, sin = inner.rotary_emb(embeds, torch.arange(length)[None])
    cache = DynamicCache(config=model.config)
    hidden = embeds
    for number, layer in enumerate(inner.layers):
        attention = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (1, length, -1, attention.head_dim)
        query = attention.q_proj(x).view(shape).transpose(1, 2)
        key = attention.k_proj(x).view(shape).transpose(1, 2)
        value = attention.v_proj(x).view(shape).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        cache.update(key, value, number)
        if number == len(inner.layers) - 1:
            break
        groups = attention.num_key_value_groups
        with torch.no_grad():
            mixed = F.scaled_dot_product_attention(query, repeat_kv(key, groups),
                                                   repeat_kv(value, groups), is_causal=True,
                                                   scale=attention.scaling)
            hidden = hidden + attention.o_proj(mixed.transpose(1, 2).reshape(1, length, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return cache
