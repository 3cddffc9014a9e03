"""Per-request serving metrics under the names autoscalers and the Gateway
API Inference Extension read.

Why these names: GIE's endpoint picker (and llm-d's) and the usual KEDA/HPA
recipes read vLLM's metric names by default; a pod labelled
`llm-d.ai/engine-type: vllm` is scraped with that mapping. Exporting the same
names, types, units and `model_name` label lets miLLM replicas sit in such a
pool unchanged. The semantics follow GIE's model server protocol
(docs/proposals/003-model-server-protocol): waiting and running requests are
gauges, KV-cache usage is a 0-1 fraction. Scrape-time gauges are in
service/metrics.py; this module holds what is recorded as requests run:
generation/run.py calls a RequestTimer's `step` as output leaves the model
thread, `queued` when the request is admitted and `finished` at its end.

Definitions (docs/operations.md has the table):
- time to first token: from the request's validation starting to its first
  generated token leaving the model thread;
- inter-token latency: between two steps of one request, divided by the
  tokens one row gained in that step (a slow reader's merged steps count as
  several tokens); a request read whole (not streamed) is posted once, so its
  tokens are spread evenly between its first and its last (`held`). A
  streamed request tallies its steps itself and moves the histogram at most
  once a second (ITL_FLUSH_S) and at its end: observe() takes two locks
  and searches the buckets, and it ran once a step a request on the event
  loop (6-7 % of the engine's loop at 8 streamed clients);
- queue time: from the job's submission to its first part being admitted
  into the running batch (engines that report admission; others omit it);
- prefix-cache queries and hits: prompt tokens looked up and tokens served
  from the prefix cache, counted when each request finishes.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Histogram

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
# A streamed request's inter-token latencies reach the histogram this often at most.
ITL_FLUSH_S = 1.0
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LABEL = ["model_name"]


def observe_many(histogram, amount: float, count: int) -> None:
    """`count` observations of one amount: what `count` calls of observe()
    record, as one move of the sum and of the bucket (a request read whole
    posts hundreds of tokens at once). Uses prometheus_client's Histogram
    fields (pinned version); without them, observe() `count` times."""
    bounds = getattr(histogram, "_upper_bounds", None)
    if count == 1 or bounds is None or not hasattr(histogram, "_buckets"):
        for _ in range(count):
            histogram.observe(amount)
        return
    histogram._sum.inc(amount * count)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            histogram._buckets[i].inc(count)
            break


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry):
        def histogram(name, help_, buckets):
            return Histogram(name, help_, LABEL, buckets=buckets, registry=registry)

        def counter(name, help_):
            return Counter(name, help_, LABEL, registry=registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Time to the first generated token", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Time between two generated tokens of one request", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Time from a request's validation to its last token", E2E_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Time a request waited before joining the running batch",
                               E2E_BUCKETS)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prompt tokens served from the prefix cache")

    def request(self, model: str, started: float) -> RequestTimer:
        return RequestTimer(self, model, started)


class RequestTimer:
    """One request's timings (generation/run.py)."""

    def __init__(self, metrics: RequestMetrics, model: str, started: float):
        self._m, self._model, self._started = metrics, model, started
        self._last: float | None = None
        self._itl = metrics.itl.labels(model)  # looked up once, not every step
        self._bounds = getattr(self._itl, "_upper_bounds", None)
        if not hasattr(self._itl, "_buckets"):  # not the pinned prometheus_client
            self._bounds = None
        # Observations not yet in the histogram: per bucket, and their sum.
        self._tally = [0] * len(self._bounds) if self._bounds is not None else None
        self._tally_sum, self._flushed = 0.0, started

    def step(self, tokens_per_row: int) -> None:
        """A step of output left the model thread; tokens_per_row: the most
        tokens any one row gained in it."""
        if tokens_per_row <= 0:
            return
        now = time.monotonic()
        if self._last is None:
            self._m.ttft.labels(self._model).observe(now - self._started)
            # Tokens that came with the first one came at the same moment.
            for _ in range(tokens_per_row - 1):
                self._itl.observe(0.0)
        elif self._tally is not None:
            # One observation per token, as vLLM counts them, even when a slow
            # reader got several steps merged into one output.
            gap = (now - self._last) / tokens_per_row
            self._tally[bisect_left(self._bounds, gap)] += tokens_per_row
            self._tally_sum += gap * tokens_per_row
            if now - self._flushed >= ITL_FLUSH_S:
                self._flush(now)
        else:
            observe_many(self._itl, (now - self._last) / tokens_per_row, tokens_per_row)
        self._last = now

    def flush(self) -> None:
        """The tallied inter-token latencies into the histogram now."""
        if self._tally is not None:
            self._flush(time.monotonic())

    def _flush(self, now: float) -> None:
        self._flushed = now
        if not any(self._tally):
            return
        self._itl._sum.inc(self._tally_sum)
        for i, count in enumerate(self._tally):
            if count:
                self._itl._buckets[i].inc(count)
                self._tally[i] = 0
        self._tally_sum = 0.0

    def held(self, tokens_per_row: int, first_at: float, last_at: float) -> None:
        """Steps the model thread held for a caller that reads the answer whole,
        posted at once: the first token left the model at `first_at`, the
        rest are spread evenly up to `last_at`."""
        if tokens_per_row <= 0:
            return
        if self._last is None:
            self._m.ttft.labels(self._model).observe(max(0.0, first_at - self._started))
            self._last = first_at
            tokens_per_row -= 1
        if tokens_per_row > 0:
            observe_many(self._itl, max(0.0, last_at - self._last) / tokens_per_row,
                         tokens_per_row)
        self._last = max(self._last, last_at)

    def queued(self, seconds: float) -> None:
        self._m.queue.labels(self._model).observe(max(0.0, seconds))

    def finished(self, prompt_tokens: int, cached_tokens: int) -> None:
        m, model = self._m, self._model
        self.flush()
        m.e2e.labels(model).observe(time.monotonic() - self._started)
        m.prompt_tokens.labels(model).inc(prompt_tokens)
        m.prefix_queries.labels(model).inc(prompt_tokens)
        m.prefix_hits.labels(model).inc(cached_tokens)
