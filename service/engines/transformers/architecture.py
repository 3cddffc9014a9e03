"""Where a checkpoint's decoder layers live, found once when it loads.

Families keep their decoder layers in different places (`model.layers` in
Llama, Qwen, Gemma, Mistral, Phi-3 and LFM2; `transformer.h` in GPT-2;
`gpt_neox.layers` in GPT-NeoX; `model.decoder.layers` in OPT), but always as
one `nn.ModuleList` with one entry per decoder layer. `decoder_layers` finds
that list by its shape, not by name: the shallowest ModuleList holding exactly
as many modules as the text config has hidden layers. The steering hooks go
on those modules (engines/transformers/steering.py); nothing else in the project asks
where the layers are.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


class LayersNotFound(RuntimeError):
    """No single list of decoder layers: the model is served, unsteered."""


@dataclass(frozen=True)
class DecoderLayers:
    path: str  # e.g. "model.layers", for logs and docs
    modules: nn.ModuleList


def decoder_layers(model: nn.Module) -> DecoderLayers:
    config = model.config.get_text_config(decoder=True)
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int) or count <= 0:
        raise LayersNotFound(f"{type(model).__name__}'s config gives no number of layers")
    candidates = [(name, module) for name, module in model.named_modules()
                  if isinstance(module, nn.ModuleList) and len(module) == count]
    if not candidates:
        raise LayersNotFound(f"{type(model).__name__} has no list of {count} decoder layers")
    depth = min(name.count(".") for name, _ in candidates)
    shallowest = [(name, module) for name, module in candidates if name.count(".") == depth]
    if len(shallowest) > 1:
        names = ", ".join(name for name, _ in shallowest)
        raise LayersNotFound(f"{type(model).__name__} has several lists of {count} layers "
                             f"({names}); which one is the decoder is not clear")
    name, module = shallowest[0]
    return DecoderLayers(name, module)
