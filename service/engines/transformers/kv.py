"""The per-row model state a lane carries between steps, for every family.

A lane keeps its rows' state in one transformers `DynamicCache`. Two kinds of
layer state exist across the families we serve:

- attention layers hold keys and values per token column: left-padded, so
  rows of different lengths line up, concatenated along the column axis when
  a lane grows, trimmed when the columns no remaining row uses are dropped,
  and cut into prefix-cache blocks;
- recurrent layers (LFM2's short convolutions; Mamba-style linear
  attention) hold a fixed-size state per row, with no token columns: they are
  only selected, repeated and concatenated by row.

Attention layers write each step's new column into spare room reserved
behind their keys and values (`RoomyLayer`), instead of transformers'
`DynamicLayer`, which concatenates, and so copies the whole cache of every
layer, at every decode step: at 16 rows that copy is several milliseconds of
a step, and it grows with the context. The room is reserved again, with one
copy, when it runs out or when a lane replaced the tensors (rows joined, left
or were trimmed): those replacements copy once already, so a join, a
departure or a trim costs two copies of the lane's cache, not one. A
prefix-cache hit arrives with its room behind it already (PrefixCache.lookup
writes the blocks into it; `from_prefix` adopts it), so its prefix is copied
once. Its cost is memory: up to `SPARE_COLUMNS` columns per row and layer
beyond what the rows hold.

Sliding-window attention layers are kept in full here (a `RoomyLayer` like
the others, not transformers' truncating `DynamicSlidingWindowLayer`): every attention layer
then has the same columns, which is what left padding and trimming need, and
the window is applied by the model's own attention mask, whose distances are
the column distances (a row's tokens are contiguous). The cost is memory: a
sliding layer holds the whole context instead of its window.

A recurrent state summarises the whole prefix, so a prompt cannot resume from
a cached block boundary: models with one never use the prefix cache
(`reuses_prefixes`), and that is the one rule about it.

Anything else (a cache layer kind not listed here) is not served: the load
refuses it with `unsupported_architecture` rather than failing per request.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    DummyLayer,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
    get_layer_types_and_kwargs,
)

from service.errors import EngineError

# Layer kinds, by what a lane does with them.
ATTENTION, RECURRENT, BOTH, NONE = "attention", "recurrent", "both", "none"


def _kind(layer) -> str:
    recurrent = isinstance(layer, LinearAttentionCacheLayerMixin)
    if isinstance(layer, DummyLayer):
        return NONE
    if recurrent and isinstance(layer, DynamicSlidingWindowLayer):
        return ""  # a truncating window beside a state: not handled
    if recurrent and isinstance(layer, DynamicLayer):
        return BOTH
    if recurrent:
        return RECURRENT if type(layer) is LinearAttentionLayer else ""
    if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer, RoomyLayer):
        return ATTENTION
    return ""


SPARE_COLUMNS = 64  # room reserved beyond the columns held, per row and layer


class RoomyLayer(DynamicLayer):
    """A full attention layer that appends in place, into room reserved behind
    its columns; `keys` and `values` are views of the room's used columns."""

    def __init__(self):
        super().__init__()
        self._room: tuple[torch.Tensor, torch.Tensor] | None = None

    def _fits(self, end: int, new: torch.Tensor) -> bool:
        """The room still backs `keys`/`values` (no one replaced them) and holds `end` columns."""
        if self._room is None:
            return False
        keys, values = self._room
        return (end <= keys.shape[2] and keys.shape[:2] == new.shape[:2]
                and self.keys.data_ptr() == keys.data_ptr()
                and self.values.data_ptr() == values.data_ptr()
                and self.keys.stride() == keys.stride() and self.values.stride() == values.stride())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        end = used + key_states.shape[-2]
        if not self._fits(end, key_states):
            room = []
            for held, new in ((self.keys, key_states), (self.values, value_states)):
                shape = (*new.shape[:2], end + SPARE_COLUMNS, new.shape[3])
                room.append(new.new_empty(shape))
                if used:
                    room[-1][:, :, :used] = held
            self._room = (room[0], room[1])
        keys, values = self._room
        keys[:, :, used:end] = key_states
        values[:, :, used:end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, used: int) -> None:
        """Hold `used` columns of `keys`/`values`, the rest being room."""
        self.lazy_initialization(keys, values)
        self._room = (keys, values)
        self.keys, self.values = keys[:, :, :used], values[:, :, :used]

    def reset(self) -> None:
        self._room = None
        super().reset()


def new_cache(config) -> DynamicCache:
    """An empty cache with the model's own layer kinds; full and sliding
    attention layers are `RoomyLayer`s (sliding ones kept in full)."""
    cache = DynamicCache()  # then the layers `DynamicCache(config=config)` would make
    cache.layers = [RoomyLayer() if kind in (DynamicLayer, DynamicSlidingWindowLayer)
                    else kind(**kwargs) for kind, kwargs in _layout(config)]
    cache.layer_class_to_replicate = None
    return cache


_LAYOUTS: dict[int, tuple[weakref.ref, list[tuple[type, dict]]]] = {}


def _layout(config) -> list[tuple[type, dict]]:
    """Each cache layer's class and arguments, as `DynamicCache(config=config)`
    derives them. Derived once per config: they are read through the config's
    attribute hooks, about 40 µs, which every prompt would pay (a warm
    prefix-cache hit's whole admission is a few hundred)."""
    entry = _LAYOUTS.get(id(config))
    if entry is not None and entry[0]() is config:
        return entry[1]
    kinds, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    layout = [(DYNAMIC_LAYER_TYPE_MAPPING[kind], dict(kw))
              for kind, kw in zip(kinds, kwargs, strict=False)]  # as DynamicCache zips them
    # (list(): the model thread and a loading thread may both be here)
    for key in [k for k, (ref, _) in list(_LAYOUTS.items()) if ref() is None]:
        _LAYOUTS.pop(key, None)  # configs of unloaded models
    _LAYOUTS[id(config)] = (weakref.ref(config), layout)
    return layout


def check_servable(config) -> bool:
    """Refuse (unsupported_architecture) a model whose cache holds layer kinds
    a lane cannot pad, trim and select; True when it has recurrent state."""
    cache = DynamicCache(config=config)
    kinds = [_kind(layer) for layer in cache.layers]
    unknown = sorted({type(layer).__name__ for layer, k in zip(cache.layers, kinds, strict=True)
                      if not k})
    if unknown:
        raise EngineError("unsupported_architecture", f"The transformers engine cannot batch "
                          f"this model's cache layers ({', '.join(unknown)}).", "model")
    return any(k in (RECURRENT, BOTH) for k in kinds)


def _has_keys(layer) -> bool:
    return _kind(layer) in (ATTENTION, BOTH) and getattr(layer, "keys", None) is not None


def _states(layer) -> list[tuple[dict, int]]:
    """(the dict, key) of each initialised recurrent state of a layer."""
    if _kind(layer) not in (RECURRENT, BOTH):
        return []
    found = []
    for store, ready in ((layer.conv_states, layer.is_conv_states_initialized),
                         (layer.recurrent_states, layer.is_recurrent_states_initialized)):
        found += [(store, i) for i, is_ready in ready.items() if is_ready]
    return found


def attention_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each attention layer's (keys, values) [rows, heads, columns, dim], in order."""
    return [(layer.keys, layer.values) for layer in cache.layers if _has_keys(layer)]


def from_prefix(config, layers: list[tuple[torch.Tensor, torch.Tensor]],
                tokens: int) -> DynamicCache:
    """A cache holding a cached prefix's keys and values, the first `tokens`
    columns of `layers` (PrefixCache.lookup), whose other columns become room
    (attention-only models)."""
    cache = new_cache(config)
    found = iter(layers)
    for layer in cache.layers:
        if _kind(layer) == ATTENTION:
            keys, values = next(found)
            layer.adopt(keys, values, tokens)
    return cache


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep (or repeat) the rows in `index`, in that order."""
    for layer in cache.layers:
        if _has_keys(layer):
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        for store, i in _states(layer):
            store[i] = store[i][index.to(store[i].device)]


def pad_left(tensor: torch.Tensor, amount: int, dim: int) -> torch.Tensor:
    if amount == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = amount
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def append_rows(cache, other, grow_old: int, grow_new: int) -> None:
    """Add `other`'s rows after `cache`'s, left-padding the attention columns
    of each by its grow amount so both end on the same column."""
    for mine, theirs in zip(cache.layers, other.layers, strict=True):
        if _has_keys(mine):
            mine.keys = torch.cat([pad_left(mine.keys, grow_old, 2),
                                   pad_left(theirs.keys, grow_new, 2)])
            mine.values = torch.cat([pad_left(mine.values, grow_old, 2),
                                     pad_left(theirs.values, grow_new, 2)])
        for (store, i), (their_store, _) in zip(_states(mine), _states(theirs), strict=True):
            store[i] = torch.cat([store[i], their_store[i]])


def trim_columns(cache, first: int) -> None:
    """Drop the first `first` attention columns (padding for every row left)."""
    for layer in cache.layers:
        if _has_keys(layer):
            layer.keys = layer.keys[:, :, first:, :]
            layer.values = layer.values[:, :, first:, :]
