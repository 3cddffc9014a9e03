"""The fair-admission rule both engines admit by (engines/admission.py), on
its own: the share of rows one request holds, who goes first, aging and
serial batching. No model: jobs are stand-ins and parts are row counts."""

from __future__ import annotations

import collections
import time

from service.engines.admission import FairTurns, SchedulerLimits, Waiting


class Job:
    outcome = None

    class spec:  # noqa: N801 - what admission reads of a ValidatedGeneration
        priority = 0


def waiting(parts: list[int], age: float = 0.0) -> Waiting:
    return Waiting(Job(), collections.deque(parts), time.monotonic() - age)


def admit(limits: SchedulerLimits, queue: collections.deque, room: int, share: int,
          held: collections.Counter | None = None, running: set | None = None):
    """One pass as an engine makes it: each request starts what parts fit
    (`room` rows free); returns [(queue position, rows)] in order started."""
    held = held if held is not None else collections.Counter()
    running = running if running is not None else set()
    turns = FairTurns(limits, share, held, running)
    started = []
    for entry in turns.order(queue):
        while entry.groups and turns.allows(entry.job, entry.groups[0],
                                            room=entry.groups[0] <= room):
            rows = entry.groups.popleft()
            room -= rows
            turns.took(entry.job, rows)
            running.add(id(entry.job))
            started.append((list(queue).index(entry), rows))
    return started


def test_the_share_is_the_setting_or_half_the_batch():
    assert SchedulerLimits(max_batch=64).request_rows == 32
    assert SchedulerLimits(max_rows_per_request=1).rows_per_request(8) == 1
    assert SchedulerLimits().rows_per_request(8) == 4  # the GGUF engine's 8 slots
    assert SchedulerLimits().rows_per_request(1) == 1
    assert SchedulerLimits(serial=True, max_rows_per_request=1).rows_per_request(8) == 8


def test_one_request_holds_its_share_and_the_next_gets_the_rest():
    queue = collections.deque([waiting([1] * 4), waiting([1] * 2)])
    started = admit(SchedulerLimits(max_rows_per_request=1), queue, room=8, share=1)
    assert started == [(0, 1), (1, 1)]  # one row each, oldest first


def test_a_request_holding_nothing_may_start_a_part_past_its_share():
    queue = collections.deque([waiting([6])])
    assert admit(SchedulerLimits(), queue, room=8, share=4) == [(0, 6)]


def test_a_request_that_does_not_fit_is_passed_until_it_has_aged():
    limits = SchedulerLimits(aging_s=5.0)
    young = collections.deque([waiting([16], age=1.0), waiting([1])])
    assert admit(limits, young, room=4, share=16) == [(1, 1)]  # the small one passes
    old = collections.deque([waiting([16], age=6.0), waiting([1])])
    assert admit(limits, old, room=4, share=16) == []  # nobody passes it now


def test_an_aged_request_already_running_is_passed_still():
    """Aging protects a request holding nothing; one already running makes progress."""
    first = waiting([1, 1], age=60.0)
    held = collections.Counter({id(first.job): 1})
    queue = collections.deque([first, waiting([1])])
    started = admit(SchedulerLimits(aging_s=0.0), queue, room=4, share=1, held=held,
                    running={id(first.job)})
    assert started == [(1, 1)]


def test_a_failed_request_does_not_stop_the_pass():
    failed = waiting([16], age=60.0)
    failed.job.outcome = "failed"
    queue = collections.deque([failed, waiting([1])])
    assert admit(SchedulerLimits(aging_s=0.0), queue, room=4, share=16) == [(1, 1)]


def test_serial_runs_one_request_at_a_time_with_all_it_asks():
    limits = SchedulerLimits(serial=True, max_rows_per_request=1)
    queue = collections.deque([waiting([1] * 3), waiting([1])])
    assert admit(limits, queue, room=8, share=8) == [(0, 1), (0, 1), (0, 1)]
    running = collections.deque([waiting([1])])
    other = Job()
    assert admit(limits, running, room=8, share=8, running={id(other)}) == []
