"""Requests per minute per API key: a token bucket for each key.

A bucket holds up to `requests_per_minute` tokens and refills continuously at
that rate, so a key may burst up to its limit and then gets one request every
60/limit seconds. A dozen lines of our own rather than a dependency: the
limiter runs on one event loop, needs no storage, and its numbers feed
OpenAI's x-ratelimit-* headers directly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    retry_after_s: float  # until one token is back (0 when allowed)
    reset_s: float  # until the bucket is full again


class TokenBucket:
    def __init__(self, per_minute: int, clock=time.monotonic):
        self.capacity = per_minute
        self.rate = per_minute / 60.0
        self.tokens = float(per_minute)
        self.clock = clock
        self.updated = clock()

    def take(self) -> Decision:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        allowed = self.tokens >= 1
        if allowed:
            self.tokens -= 1
        retry = 0.0 if allowed else (1 - self.tokens) / self.rate
        return Decision(allowed, self.capacity, int(math.floor(self.tokens)), retry,
                        (self.capacity - self.tokens) / self.rate)


class RateLimiter:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, name: str, per_minute: int | None) -> Decision | None:
        """None when the key has no limit."""
        if per_minute is None:
            return None
        bucket = self._buckets.get(name)
        if bucket is None or bucket.capacity != per_minute:
            bucket = self._buckets[name] = TokenBucket(per_minute, self.clock)
        return bucket.take()
