"""Activation readout's one encoder, shared by both engines: a row's residual
vectors at one SAE's layer go through the SAE's encoder here, whichever engine
computed them (the transformers hooks hand torch tensors; the GGUF engine
hands the rows llama.cpp's callback copied out, as a tensor over the same
memory)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from service.steering.plan import ALL, COMPLETION, LAST, PROMPT, ActivationSpec


@dataclass
class ActivationRecorder:
    """One row's activations at one SAE's layer, kept as they are read."""

    spec: ActivationSpec
    prompt_len: int
    # (position, token id, ((feature index, value), ...)) in position order.
    entries: list = field(default_factory=list)

    def wanted(self, position: int) -> bool:
        kind = self.spec.positions
        if kind in (LAST, ALL):
            return True
        if kind == PROMPT:
            return position < self.prompt_len
        if kind == COMPLETION:
            return position >= self.prompt_len
        return self.spec.start <= position < self.spec.end

    def record(self, hidden: torch.Tensor, positions: list[int], token_ids: list[int]) -> None:
        keep = [i for i, p in enumerate(positions) if self.wanted(p)]
        if not keep:
            return
        if self.spec.positions == LAST:
            keep = keep[-1:]
        acts = self.spec.sae.encode(hidden[keep].float())
        candidates = None
        if self.spec.features is not None:
            candidates = torch.tensor(self.spec.features, dtype=torch.long, device=acts.device)
            acts = acts[:, candidates]
        k = min(self.spec.top_k, acts.shape[1])
        best = torch.topk(acts, k, dim=1)
        rows = []
        for r, i in enumerate(keep):
            features = []
            for value, j in zip(best.values[r].tolist(), best.indices[r].tolist(), strict=True):
                # Over the whole dictionary an inactive feature says nothing;
                # features the caller named are reported even at zero.
                if candidates is None and value <= 0.0:
                    continue
                index = int(candidates[j]) if candidates is not None else int(j)
                features.append((index, float(value)))
            rows.append((positions[i], token_ids[i], tuple(features)))
        if self.spec.positions == LAST:
            self.entries = rows
        else:
            self.entries.extend(rows)
