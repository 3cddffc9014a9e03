"""Rerank and classify: what RankingService (and the bridge's /v1/rerank,
/v1/score and /v1/classify) answer, on either engine, with the engine's own
reads and nothing trained for it.

- Rerank and score: the cosine similarity of a document's embedding (the
  mean-pooled last layer, EmbeddingService's vector) to the query's. It needs
  no prompt wording and is the same on both engines; a model tuned as a
  cross-encoder would do better, and the demo model is none.
- Classify with a probe: a monitoring probe is a linear classifier over SAE
  features. The input is read unsteered (a scoring pass with the probe's
  features recorded at every position, as return_sae_activations reads them)
  and its verdict is the monitoring rule: it fires where its weighted
  feature sum reaches its threshold at any token.
- Classify with labels: zero-shot, as evaluation harnesses score choices:
  each label's log-likelihood as the continuation of "<input>\\nLabel:" (the
  sum over its tokens, from one echo pass per label), normalised over the
  labels into probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from service.engines.capabilities import KIND_CAPABILITIES
from service.errors import EngineError, context_length_exceeded, invalid_parameter
from service.steering import plan as runtime
from service.steering import readout
from service.steering.recording import ActivationRecorder

MAX_DOCUMENTS = 1024
MAX_INPUTS = 256
MAX_LABELS = 32
MAX_PAIRS = 1024  # inputs × labels: one scoring pass each
MAX_TEXT_CHARS = 65536  # per query, document, input or label
LABEL_PROMPT = "\nLabel:"
FIRED, NOT_FIRED = "fired", "not_fired"


@dataclass(frozen=True)
class Ranked:
    results: tuple[tuple[int, float], ...]  # (document index, score), best first
    prompt_tokens: int
    model: str


@dataclass(frozen=True)
class Label:
    index: int
    label: str
    probs: tuple[float, ...] = ()
    score: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Labelled:
    data: tuple[Label, ...]
    prompt_tokens: int
    model: str


def _texts(values, field: str, most: int, least: int = 1) -> list[str]:
    if not least <= len(values) <= most:
        raise invalid_parameter(field, f"'{field}' takes {least} to {most} items; got "
                                f"{len(values)}.")
    for i, v in enumerate(values):
        if not v:
            raise invalid_parameter(f"{field}[{i}]", f"'{field}[{i}]' must not be empty.")
        if len(v) > MAX_TEXT_CHARS:
            raise invalid_parameter(f"{field}[{i}]", f"'{field}[{i}]' holds more than "
                                    f"{MAX_TEXT_CHARS} characters.")
    return list(values)


def _fit(lengths: list[int], limit: int, names: list[str], what: str) -> None:
    for length, name in zip(lengths, names, strict=True):
        if not length:
            raise invalid_parameter(name, f"'{name}' tokenizes to no tokens.")
        if length > limit:
            raise context_length_exceeded(name, f"This model's {what} is {limit} tokens. "
                                          f"However, '{name}' needs {length}. Please shorten it.")


class Ranking:
    """Rerank and classify over an InferenceService's loaded model."""

    def __init__(self, inference):
        self.inference = inference

    async def _encode(self, engine, texts: list[str], bos: bool = True) -> list[list[int]]:
        return await self.inference.tokenizer_calls.run(
            sum(map(len, texts)), lambda: [engine.encode_text(t, add_special=bos) for t in texts])

    async def rerank(self, model: str, query: str, documents: list[str],
                     top_n: int | None) -> Ranked:
        if not query:
            raise invalid_parameter("query", "'query' must not be empty.")
        if len(query) > MAX_TEXT_CHARS:
            raise invalid_parameter("query", f"'query' holds more than {MAX_TEXT_CHARS} "
                                    "characters.")
        _texts(documents, "documents", MAX_DOCUMENTS)
        if top_n is not None and top_n < 1:
            raise invalid_parameter("top_n", "'top_n' must be at least 1.")
        self.inference.lifecycle.resolve(model)
        lease = await self.inference.lifecycle.acquire(model)
        try:
            engine, info = lease.engine, lease.info
            ids = await self._encode(engine, [query, *documents])
            limit = min(info.context_window, info.embedding_window or info.context_window)
            _fit([len(t) for t in ids], limit,
                 ["query", *(f"documents[{i}]" for i in range(len(documents)))],
                 "longest embedding input")
            vectors = torch.tensor(await engine.embed(ids), dtype=torch.float64)
        finally:
            lease.release()
        scores = torch.nn.functional.cosine_similarity(vectors[1:], vectors[:1], dim=1)
        order = sorted(range(len(documents)), key=lambda i: (-float(scores[i]), i))
        return Ranked(tuple((i, float(scores[i])) for i in order[:top_n]),
                      sum(map(len, ids)), info.id)

    async def classify(self, model: str, inputs: list[str], probe: str,
                       labels: list[str]) -> Labelled:
        _texts(inputs, "input", MAX_INPUTS)
        if probe and labels:
            raise invalid_parameter("labels", "Give 'probe' or 'labels', not both.")
        if not probe:
            _texts(labels, "labels", MAX_LABELS, least=2)
            if len(set(labels)) != len(labels):
                raise invalid_parameter("labels", "'labels' must be distinct.")
            if len(inputs) * len(labels) > MAX_PAIRS:
                raise invalid_parameter("labels", f"Each input is scored with each label: "
                                        f"at most {MAX_PAIRS} pairs in one request; got "
                                        f"{len(inputs) * len(labels)}.")
        elif not KIND_CAPABILITIES[self.inference.lifecycle.resolve(model).engine].steer \
                or self.inference.monitoring is None:
            raise EngineError("steering_unavailable", "Probes read SAE features, which this "
                              "engine cannot reach.", "probe")
        self.inference.lifecycle.resolve(model)
        lease = await self.inference.lifecycle.acquire(model)
        try:
            if probe:
                return await self._by_probe(lease, inputs, probe)
            return await self._by_labels(lease, inputs, labels)
        finally:
            lease.release()

    async def _by_probe(self, lease, inputs: list[str], name: str) -> Labelled:
        found = self.inference.monitoring.probes.get(name)
        if found is None:
            raise EngineError("probe_not_found", f"No probe named '{name}'.", "probe")
        attached = self.inference.steering.attached
        if found.sae_id not in attached:
            raise invalid_parameter("probe", f"Probe '{name}' reads {found.sae_id}, which is "
                                    "not attached; attach it first.")
        weights = dict(found.features)
        spec = readout.check_request(readout.ActivationRequest(
            sae_id=found.sae_id, features=tuple(weights), top_k=len(weights),
            positions=runtime.PROMPT), attached)
        engine, info = lease.engine, lease.info
        ids = await self._encode(engine, inputs)
        _fit([len(t) for t in ids], info.context_window,
             [f"input[{i}]" for i in range(len(ids))], "maximum context length")
        out = []
        for i, tokens in enumerate(ids):
            recorder = ActivationRecorder(spec, len(tokens))
            await engine.score([tokens], temperature=1.0, allowed=None, top=0, echo=False,
                               next_token=True, recorder=recorder)
            peak = max((sum(weights[f] * v for f, v in features)
                        for _, _, features in recorder.entries), default=-math.inf)
            out.append(Label(i, FIRED if peak >= found.threshold else NOT_FIRED,
                             score=peak, threshold=found.threshold))
        return Labelled(tuple(out), sum(map(len, ids)), info.id)

    async def _by_labels(self, lease, inputs: list[str], labels: list[str]) -> Labelled:
        engine, info = lease.engine, lease.info
        heads = await self._encode(engine, [t + LABEL_PROMPT for t in inputs])
        tails = await self._encode(engine, [" " + label for label in labels], bos=False)
        longest = max(map(len, tails))
        _fit([len(h) + longest for h in heads], info.context_window,
             [f"input[{i}]" for i in range(len(heads))], "maximum context length")
        prompts = [head + tail for head in heads for tail in tails]
        scored = await engine.score(prompts, temperature=1.0, allowed=None, top=0, echo=True,
                                    next_token=False)
        out = []
        for i in range(len(inputs)):
            totals = []
            for j, tail in enumerate(tails):
                entries = scored[i * len(tails) + j].prompt_tokens[-len(tail):]
                totals.append(sum(e.token.logprob for e in entries))
            probs = torch.softmax(torch.tensor(totals, dtype=torch.float64), dim=0).tolist()
            best = max(range(len(labels)), key=lambda j: (probs[j], -j))
            out.append(Label(i, labels[best], tuple(probs)))
        return Labelled(tuple(out), sum(map(len, prompts)), info.id)
