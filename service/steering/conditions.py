"""When a steering entry applies: its condition (`"when"` in an entry, or an
`"abort_when"` entry that ends the row), and the per-row state that evaluates
conditions as a row generates.

Why a module of its own: a condition is written by operators (documents.py
parses it with the entry), keys the plan (plan.py: a cached prefix is never
reused under another condition), and is evaluated by both engines per row at
each step from this one state machine, so the rule of when an entry fires is
written once.

Conditions served:
- `{"after_text": "<text>"}`: from the token after that text appears in the
  row's generated text (the prompt never counts). The forward pass that reads
  the token completing the text is the first one steered, so the token after
  it is the first the entry changes, and everything up to it is exactly what
  the unsteered request generates. Once fired it stays fired.
- `{"from_position": n}`: at absolute positions n and later (prompt positions
  count from 0, as readout's ranges do).
- `{"feature": i, "above": x, "layer"?: L}`: while feature i of the SAE
  attached at layer L (default: the entry's) read more than x at the previous
  position; `{"probe": "<name>"}`: while that monitoring probe fired (its
  score reached its threshold) at the previous position. Both read the
  residual stream before layer L's own steering (as monitoring does), at the
  last position of each forward pass, so the first position they can steer
  is the first generated one; the engine hands the reading over in the pass
  that computes it (plan.ScoreRule), with no extra device round trip.

Everything else here is host-side bookkeeping on tokens the engine has
already sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AFTER_TEXT, FROM_POSITION, FEATURE, PROBE = "after_text", "from_position", "feature", "probe"
KINDS = (AFTER_TEXT, FROM_POSITION, FEATURE, PROBE)
SCORED = (FEATURE, PROBE)
MAX_TRIGGER_CHARS = 256
MAX_POSITION = 1 << 24
MAX_ABOVE = 10000.0
# Distinct conditions one plan may evaluate per row.
MAX_CONDITIONS = 16


@dataclass(frozen=True)
class Condition:
    kind: str  # one of KINDS
    text: str = ""  # after_text; probe: its name
    position: int = 0  # from_position
    feature: int = 0
    above: float = 0.0
    layer: int = -1  # feature: the SAE's layer (-1 until the entry's is filled in)

    def to_json(self) -> dict:
        if self.kind == FEATURE:
            return {FEATURE: self.feature, "above": self.above, "layer": self.layer}
        if self.kind == FROM_POSITION:
            return {FROM_POSITION: self.position}
        return {self.kind: self.text}

    @property
    def trigger(self) -> bytes:
        return self.text.encode("utf-8") if self.kind == AFTER_TEXT else b""


def parse(raw, where: str, layer: int = -1) -> Condition:
    """An entry's `when`, checked; errors name `where` (e.g. `members[2].when`).
    `layer`: the entry's, which a feature condition reads by default (-1:
    the entry has none, so the condition must name one)."""
    from service.steering.documents import invalid_document

    served = ", ".join(KINDS)
    if not isinstance(raw, dict) or not raw:
        raise invalid_document(where, f"'{where}' must be an object with one of {served}.")
    kinds = [k for k in raw if k in KINDS]
    if len(kinds) != 1:
        unknown = next((k for k in raw if k not in KINDS and k not in ("above", "layer")), None)
        if unknown is not None:
            raise invalid_document(f"{where}.{unknown}", f"Unknown condition '{unknown}' in "
                                   f"'{where}' (served: {served}).")
        raise invalid_document(where, f"'{where}' must hold exactly one of {served}.")
    kind = kinds[0]
    value, field = raw[kind], f"{where}.{kind}"
    extra = [k for k in raw if k != kind and not (kind == FEATURE and k in ("above", "layer"))]
    if extra:
        raise invalid_document(f"{where}.{extra[0]}", f"'{where}.{extra[0]}' does not go with "
                               f"'{kind}'.")
    if kind in (AFTER_TEXT, PROBE):
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_TRIGGER_CHARS:
            raise invalid_document(field, f"'{field}' must be a text of 1 to "
                                   f"{MAX_TRIGGER_CHARS} characters.")
        return Condition(kind, text=value)
    if kind == FROM_POSITION:
        return Condition(FROM_POSITION, position=_count(value, field, MAX_POSITION))
    feature = _count(value, field, MAX_POSITION)
    if "above" not in raw:
        raise invalid_document(f"{where}.above", f"Missing field '{where}.above' (the "
                               "activation the feature must exceed).")
    above = raw["above"]
    if isinstance(above, bool) or not isinstance(above, int | float) or not (
            math.isfinite(above) and abs(above) <= MAX_ABOVE):
        raise invalid_document(f"{where}.above", f"'{where}.above' must be a finite number "
                               f"within ±{MAX_ABOVE:g}.")
    if "layer" in raw:
        layer = _count(raw["layer"], f"{where}.layer", 1 << 16)
    elif layer < 0:
        raise invalid_document(f"{where}.layer", f"Missing field '{where}.layer': this entry "
                               "has no layer of its own to read the feature at.")
    return Condition(FEATURE, feature=feature, above=float(above), layer=layer)


def _count(value, field: str, high: int) -> int:
    from service.steering.documents import invalid_document

    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise invalid_document(field, f"'{field}' must be an integer from 0 to {high}.")
    return value


class RowConditions:
    """One row's conditions as it generates: which hold at a position. The
    state keeps only the generated text a trigger could still end in, and
    each scored condition's last reading."""

    def __init__(self, conditions: tuple[Condition, ...], aborts: tuple[bool, ...] = ()):
        self.conditions = conditions
        self._aborts = aborts
        self._triggers = [c.trigger for c in conditions]
        self._fired = [False] * len(conditions)
        self._keep = max((len(t) for t in self._triggers), default=1) - 1
        self._tail = b""
        self._watching = any(self._triggers)

    def generated(self, piece: str | bytes) -> None:
        """The text a sampled token added to the row's output (as its
        detokenizer gives it, or its bytes): triggers it completes fire."""
        if not self._watching or not piece:
            return
        text = self._tail + (piece.encode("utf-8") if isinstance(piece, str) else piece)
        for i, trigger in enumerate(self._triggers):
            if trigger and not self._fired[i] and trigger in text:
                self._fired[i] = True
        self._watching = not all(f for f, t in zip(self._fired, self._triggers,
                                                   strict=True) if t)
        self._tail = text[-self._keep:] if self._keep else b""

    def read(self, index: int, holds: bool) -> None:
        """Scored condition `index` as read at the row's latest position."""
        self._fired[index] = holds

    def aborted(self) -> bool:
        """Whether an abort_when condition holds after the latest reading."""
        return any(a and f for a, f in zip(self._aborts, self._fired, strict=False))

    def active(self, position: int) -> tuple[bool, ...]:
        """Which conditions hold at `position`. A trigger fires only on
        generated tokens and a scored condition is read at the position
        before, so prompt positions see neither."""
        return tuple(position >= c.position if c.kind == FROM_POSITION else self._fired[i]
                     for i, c in enumerate(self.conditions))

    def runs(self, first: int, count: int) -> list[tuple[int, int, tuple[bool, ...]]]:
        """Positions first..first+count-1 as runs (offset, length, active)
        that share one set of holding conditions: only a from_position
        condition changes within one forward pass."""
        if count == 1:
            return [(0, 1, self.active(first))]
        cuts = sorted({c.position - first for c in self.conditions
                       if c.kind == FROM_POSITION and 0 < c.position - first < count})
        bounds = [0, *cuts, count]
        return [(a, b - a, self.active(first + a))
                for a, b in zip(bounds, bounds[1:], strict=False)]


class Replayed:
    """A finished sequence's conditions, position by position: what held when
    each position was steered as it generated. Teacher-forced passes over a
    known completion (steering_compare's divergence, echo) steer as the
    generation did. Scored conditions are not replayed: a plan holding one
    is refused there (resolution.py)."""

    def __init__(self, conditions: tuple[Condition, ...], pieces: list[bytes],
                 generated_from: int):
        """`pieces`: each token's bytes; tokens from `generated_from` on were
        generated (a trigger only fires on them)."""
        state = RowConditions(conditions)
        self._active = [state.active(p) for p in range(min(generated_from, len(pieces)))]
        for p in range(generated_from, len(pieces)):
            state.generated(pieces[p])
            self._active.append(state.active(p))

    def runs(self, first: int, count: int) -> list[tuple[int, int, tuple[bool, ...]]]:
        out: list[tuple[int, int, tuple[bool, ...]]] = []
        for offset in range(count):
            active = self._active[first + offset]
            if out and out[-1][2] == active:
                out[-1] = (out[-1][0], out[-1][1] + 1, active)
            else:
                out.append((offset, 1, active))
        return out
