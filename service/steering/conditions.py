"""When a steering entry applies: its condition (`"when"` in an entry), and
the per-row state that evaluates conditions as a row generates.

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

Everything here is host-side bookkeeping on tokens the engine has already
sampled: no device round trip is added per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import EngineError

AFTER_TEXT, FROM_POSITION = "after_text", "from_position"
KINDS = (AFTER_TEXT, FROM_POSITION)
MAX_TRIGGER_CHARS = 256
MAX_POSITION = 1 << 24
# Distinct conditions one plan may evaluate per row.
MAX_CONDITIONS = 16


@dataclass(frozen=True)
class Condition:
    kind: str  # AFTER_TEXT or FROM_POSITION
    text: str = ""
    position: int = 0

    def to_json(self) -> dict:
        return {AFTER_TEXT: self.text} if self.kind == AFTER_TEXT else {
            FROM_POSITION: self.position}

    @property
    def trigger(self) -> bytes:
        return self.text.encode("utf-8")


def parse(raw, where: str) -> Condition:
    """An entry's `when`, checked; errors name `where` (e.g. `members[2].when`)."""
    from service.steering.documents import invalid_document

    if not isinstance(raw, dict) or len(raw) != 1:
        raise invalid_document(where, f"'{where}' must be an object with one of "
                               f"{', '.join(KINDS)}.")
    (kind, value), = raw.items()
    field = f"{where}.{kind}"
    if kind == AFTER_TEXT:
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_TRIGGER_CHARS:
            raise invalid_document(field, f"'{field}' must be a text of 1 to "
                                   f"{MAX_TRIGGER_CHARS} characters.")
        return Condition(AFTER_TEXT, text=value)
    if kind == FROM_POSITION:
        if isinstance(value, bool) or not isinstance(value, int) or not (
                0 <= value <= MAX_POSITION):
            raise invalid_document(field, f"'{field}' must be an integer from 0 to "
                                   f"{MAX_POSITION}.")
        return Condition(FROM_POSITION, position=value)
    if kind in ("probe", "feature", "above"):
        raise EngineError("invalid_parameter", f"'{field}': conditions on a probe's verdict "
                          "or an SAE feature's activation are not served yet (served: "
                          f"{', '.join(KINDS)}).", field)
    raise invalid_document(field, f"Unknown condition '{kind}' in '{where}' (served: "
                           f"{', '.join(KINDS)}).")


class RowConditions:
    """One row's conditions as it generates: which hold at a position. The
    state keeps only the generated text a trigger could still end in."""

    def __init__(self, conditions: tuple[Condition, ...]):
        self.conditions = conditions
        self._triggers = [c.trigger if c.kind == AFTER_TEXT else b"" for c in conditions]
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

    def active(self, position: int) -> tuple[bool, ...]:
        """Which conditions hold at `position`. A trigger fires only on
        generated tokens, so prompt positions never see one fired."""
        return tuple(position >= c.position if c.kind == FROM_POSITION else self._fired[i]
                     for i, c in enumerate(self.conditions))

    def runs(self, first: int, count: int) -> list[tuple[int, int, tuple[bool, ...]]]:
        """Positions first..first+count-1 as runs (offset, length, active)
        that share one set of holding conditions: only a from_position
        condition changes within one forward pass."""
        cuts = sorted({c.position - first for c in self.conditions
                       if c.kind == FROM_POSITION and 0 < c.position - first < count})
        bounds = [0, *cuts, count]
        return [(a, b - a, self.active(first + a))
                for a, b in zip(bounds, bounds[1:], strict=False)]


class Replayed:
    """A finished sequence's conditions, position by position: what held when
    each position was steered as it generated. Teacher-forced passes over a
    known completion (steering_compare's divergence, echo) steer as the
    generation did."""

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
