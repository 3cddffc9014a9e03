"""n > 1 on the GGUF engine: a request's choices share its prompt's cells.

Each choice of a group runs as a row of its own (a part: n = 1, its own
index, its own row seed, so its own sampler chain and grammar mask), and the
runner admits parts like any other row. Where the choices of one unseeded
group are admitted together, the first (the leader) evaluates the prompt
and the others (its followers) wait in their slots without evaluating
anything. When the leader has read its whole prompt, the step that samples
its first token forks it: llama_memory_seq_cp gives each follower's sequence
the leader's cells (in the shared context's unified KV cache that only tags
the same cells with one more sequence id: nothing is computed or copied),
and each follower draws its first token from the same logits with its own
sampler. From then on every choice decodes its own tokens as an ordinary
row. A choice admitted later (the request's fair share was full) takes the
slot holding the longest prefix of its prompt, as any prompt does, which is
usually a sibling's: it evaluates one token.

A seeded request's choices each decode in a lane (engines/gguf/lanes.py): a
lane is a context of its own, and cells cannot be shared between contexts,
so each evaluates the prompt itself. That is the price of the seed's
promise: choice j of a seeded request depends on the seed and j only, not on
n nor on what else runs (the same text as the same request with n = 1 for
choice 0).

The parts are admitted by the rule both engines share (engines/admission.py):
one request holds at most MILLM_MAX_ROWS_PER_REQUEST rows at once (by
default half the slots), so a large n (or many prompts) never takes every
slot; the oldest request under its share goes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.requests.generation import PromptGroup


@dataclass(frozen=True)
class Choice(PromptGroup):
    """One choice of a prompt group, run as a part of its own."""

    origin: int = 0  # id() of the group it comes from (alive as long as its job)
    rank: int = 0  # its place among the group's choices: 0 leads


def parts(groups: tuple[PromptGroup, ...]) -> list[PromptGroup]:
    """Every group as one part per choice (a group of one stays itself)."""
    out: list[PromptGroup] = []
    for group in groups:
        if group.n == 1:
            out.append(group)
            continue
        fields = {name: getattr(group, name) for name in PromptGroup.__dataclass_fields__}
        for j in range(group.n):
            out.append(Choice(**{**fields, "n": 1, "first_index": group.first_index + j,
                                 "row_seeds": (group.row_seeds[j],)},
                              origin=id(group), rank=j))
    return out


def part_count(groups: tuple[PromptGroup, ...]) -> int:
    """How many parts (GroupDone events) a request's groups make."""
    return sum(group.n for group in groups)


class Forks:
    """Followers waiting for their leader's prompt, by the leader's row."""

    def __init__(self):
        self.followers: dict[int, list] = {}  # id(leader row) -> follower rows
        self.leaders: dict[int, object] = {}  # id(leader row) -> the row

    def leader_for(self, job, group: PromptGroup, rows):
        """The running row this part can follow: a choice of the same group
        of the same unseeded request, in the shared context, that has not
        finished reading its prompt. None: the part runs on its own."""
        if not isinstance(group, Choice) or job.spec.seed is not None:
            return None
        for row in rows:
            other = row.group
            if (row.job is job and isinstance(other, Choice) and other.origin == group.origin
                    and row.generated == 0 and row.pending and id(row) not in self._following()):
                return row
        return None

    def _following(self) -> set[int]:
        return {id(f) for group in self.followers.values() for f in group}

    def follow(self, leader, follower) -> None:
        """`follower` (admitted with nothing to evaluate) waits for `leader`."""
        self.leaders[id(leader)] = leader
        self.followers.setdefault(id(leader), []).append(follower)

    def waiting(self, row) -> bool:
        return id(row) in self._following()

    def fork(self, ctx, leader, take) -> list:
        """After `leader` sampled its first token: its followers get its cells
        and draw their own first token from its logits; (row, delta, done)
        for each follower still running. `take(row)` samples and takes."""
        followers = self.followers.pop(id(leader), [])
        self.leaders.pop(id(leader), None)
        if not followers:
            return []
        from llama_cpp import llama_cpp as lib

        out = []
        for row in followers:
            if row.slot.row is not row:  # it left (its request was cancelled)
                continue
            lib.llama_memory_seq_cp(ctx.memory, leader.slot.seq, row.slot.seq, 0, -1)
            row.slot.tokens[:] = leader.slot.tokens
            row.batch_index = leader.batch_index
            delta, done = take(row)
            out.append((row, delta, done))
        return out

    def orphans(self) -> None:
        """Followers whose leader left before its first token (its request
        ended, or it failed alone): each evaluates the prompt itself."""
        for key in [k for k, leader in self.leaders.items() if leader.slot.row is not leader]:
            for row in self.followers.pop(key, []):
                row.pending[:] = row.group.prompt_ids
            del self.leaders[key]

