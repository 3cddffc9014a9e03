"""A GGUF slot's kept probe scores: monitoring's reads of the positions its
cells hold, so that a prompt reusing those cells under the same probes gets
their scores replayed instead of being read again (engines/gguf/batch.py
admits a monitored request onto a slot's prefix only when they are whole).

Why a module of its own: this is the slot's bookkeeping, apart from the eval
callback's tables (steering.py), which only hand the scores over.
"""

from __future__ import annotations

from service.steering.probes import ProbeReader


def monitor_key(monitor: ProbeReader | None) -> tuple | None:
    """What a slot's kept probe scores were computed for: every probe of the
    spec, in order, and whether contexts were sampled from them (a prompt
    read without keep_contexts is read again with it, so its positions are
    sampled; None: not monitored)."""
    if monitor is None:
        return None
    return (monitor.spec.contexts, *((layer.layer, p.sae_id, p.features, p.threshold)
                                     for layer in monitor.spec.layers for p in layer.probes))


def keep_scores(kept: dict, layer: int, positions: list[int], scores: list) -> None:
    """Record a slot's scores at spec layer `layer` for `positions` (its
    positions arrive in order; a gap makes the table unusable past it)."""
    table = kept.setdefault(layer, [])
    for position, row in zip(positions, scores, strict=True):
        if position < len(table):
            table[position] = row
        elif position == len(table):
            table.append(row)


def replay_scores(kept: dict, monitor: ProbeReader, same: int) -> bool:
    """Hand `monitor` the kept scores of positions below `same`; False (and
    nothing read) when the slot does not hold them all."""
    tables = [kept.get(i, []) for i in range(len(monitor.spec.layers))]
    if any(len(t) < same for t in tables):
        return False
    for layer, table in zip(monitor.spec.layers, tables, strict=True):
        monitor.read(layer, list(range(same)), table[:same])
    return True
