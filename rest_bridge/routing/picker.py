"""The routing policy: one pure function over what the bridge knows of each replica.

In order:
1. Only replicas that report SERVING over a live load stream (a replica that
   is starting, switching models or draining, or whose stream broke, gets
   nothing new). A retry leaves out the replicas already tried, unless that
   leaves none.
2. Replicas that have the requested model loaded, when any has: the others
   would have to switch (or refuse) first.
3. Prefix affinity: the replica that was sent the longest run of this
   prompt's leading blocks (prefix.py), so its prefix cache hits, unless it
   is overloaded: more than IMBALANCE_ABS requests above the least loaded
   and more than IMBALANCE_REL times its load (SGLang's cache-aware router
   uses the same two-threshold test).
4. Otherwise the least loaded, ties taken in turn.

A replica's load is the larger of this bridge's calls in flight to it (exact
and current, but blind to other bridges) and the running plus waiting
requests it last reported (every bridge's, a report interval old). A report
that arrived before one of this bridge's calls there ended is out of date by
that call: until the next one arrives, the calls in flight alone count.

A late report is not a dead replica: on a loaded machine an engine's reports
can run a second or more behind while it serves. The stream itself tells a
replica that went away (it breaks); only a replica silent for HANG_S, far
longer than any scheduling delay, is taken for hung and gets nothing new.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from millm.v1 import server_service_pb2

IMBALANCE_ABS = 4
IMBALANCE_REL = 1.5
HANG_S = 30.0  # no report for this long over a live stream: the engine hangs
_SERVING = server_service_pb2.REPLICA_STATE_SERVING


@dataclass
class Replica:
    target: str
    client: object = None  # the AsyncClient on this replica's own channel
    report: server_service_pb2.WatchLoadResponse | None = None
    streaming: bool = False  # the load stream is up
    in_flight: int = 0
    routed: dict = field(default_factory=dict)  # reason -> calls the router sent here
    seen_at: float = 0.0  # time.monotonic() of the last report
    done_at: float = 0.0  # time.monotonic() when this bridge's last call there ended
    mux: object = None  # engine_mux.Mux: the GenerateMany stream there, unless turned off

    def routable(self, now: float) -> bool:
        return (self.streaming and self.report is not None and self.report.state == _SERVING
                and now - self.seen_at < HANG_S)

    @property
    def load(self) -> int:
        reported = 0
        if self.report is not None and self.seen_at > self.done_at:
            reported = self.report.running_requests + self.report.waiting_requests
        return max(self.in_flight, reported)

    def serves(self, model: str) -> bool:
        return self.report is not None and model in self.report.model_names


@dataclass
class Choice:
    replica: Replica
    reason: str  # "prefix", "least_load": for the bridge's metrics


_turn = itertools.count()


def choose(replicas: list[Replica], model: str, matches: dict[str, int],
           exclude: frozenset[str] = frozenset()) -> Choice | None:
    now = time.monotonic()
    routable = [r for r in replicas if r.routable(now)]
    candidates = [r for r in routable if r.target not in exclude] or routable
    if not candidates:
        return None
    loaded = [r for r in candidates if r.serves(model)]
    candidates = loaded or candidates
    least = min(r.load for r in candidates)
    best = max(candidates, key=lambda r: (matches.get(r.target, 0), -r.load))
    if matches.get(best.target, 0) > 0 and not _overloaded(best.load, least):
        return Choice(best, "prefix")
    idle = [r for r in candidates if r.load == least]
    return Choice(idle[next(_turn) % len(idle)], "least_load")


def _overloaded(load: int, least: int) -> bool:
    return load - least > IMBALANCE_ABS and load > IMBALANCE_REL * least
