"""Finding an SAE's features without knowing their indices (issue 43): by
words in what each feature's record says it fires on, by what fires on an
example text, and by the direction a feature writes.

A researcher's first question is "which feature is about X?". The record
beside an SAE (features.json, steering/features.py) lists each feature's
strongest tokens and their contexts, so words are matched there. An example
is run through the loaded model, unsteered, and read through the SAE with
the readout every request can ask for (return_sae_activations), so the
scores are exactly what a request's readout would report. Neighbours are
features whose decoder rows point the same way: steering along them moves
the residual stream alike.

This module holds the rules and the scoring; `run_example` runs the example
through the inference service as a scoring request with a readout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from service.errors import EngineError, invalid_parameter
from service.steering import plan as runtime
from service.steering.readout import ActivationRequest, ActivationResult
from service.steering.sae import SaeInfo, check_feature_index

MAX_QUERY = 256
# An example is read at every token with EXAMPLE_TOP_K features per token; the
# readout's entry limit (readout.MAX_ENTRIES, 65,536) then bounds it to 2,048
# tokens. A token holds at least one byte, so 2,000 bytes of UTF-8 (and a
# beginning-of-text token) always fit.
MAX_EXAMPLE_BYTES = 2000
EXAMPLE_TOP_K = 32
TOKEN_FEATURES = 8  # features listed per token of an example
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Match:
    index: int
    score: float


@dataclass(frozen=True)
class TokenMatches:
    position: int
    token_id: int
    features: tuple[Match, ...]


def query_words(query: str) -> list[str]:
    if len(query) > MAX_QUERY:
        raise invalid_parameter("query", f"'query' is at most {MAX_QUERY} characters.")
    words = [w.lower() for w in _WORD.findall(query)]
    if not words:
        raise invalid_parameter("query", "'query' must hold at least one word.")
    return list(dict.fromkeys(words))


def by_words(document: dict | None, info: SaeInfo, words: list[str],
             explanations: dict[int, str]) -> list[Match]:
    """Features whose record or explanation holds the words, best first.
    Each word scores 1 where the feature's explanation says it, the share of
    the feature's strongest positions whose token is that word (the feature
    fires on it), and half the share of its example contexts that hold it
    (it fires near it)."""
    records = {}
    for feature in (document or {}).get("features", ()):
        if isinstance(feature, dict) and 0 <= feature.get("index", -1) < info.d_sae:
            records[int(feature["index"])] = feature
    matches = []
    for index in sorted(set(records) | set(explanations)):
        feature = records.get(index, {})
        tokens = [t for t in feature.get("top_tokens", ()) if isinstance(t, dict)]
        examples = [e for e in feature.get("examples", ()) if isinstance(e, dict)]
        positions = sum(int(t.get("count", 0)) for t in tokens) or 1
        contexts = [set(_WORD.findall(f"{e.get('left', '')}{e.get('token', '')}"
                                      f"{e.get('right', '')}".lower())) for e in examples]
        explained = set(_WORD.findall(explanations.get(index, "").lower()))
        score = 0.0
        for word in words:
            score += float(word in explained)
            score += sum(int(t.get("count", 0)) for t in tokens
                         if str(t.get("token", "")).strip().lower() == word) / positions
            if contexts:
                score += 0.5 * sum(word in c for c in contexts) / len(contexts)
        if score > 0:
            matches.append(Match(index, round(score, 6)))
    return sorted(matches, key=lambda m: (-m.score, m.index))


def check_example(example: str) -> None:
    if not example:
        raise invalid_parameter("example", "'example' must not be empty.")
    if len(example.encode("utf-8", "surrogatepass")) > MAX_EXAMPLE_BYTES:
        raise invalid_parameter("example", f"'example' is at most {MAX_EXAMPLE_BYTES} bytes "
                                "of UTF-8.")


def readout_request(info: SaeInfo) -> ActivationRequest:
    """The readout an example runs with: every token of the prompt."""
    return ActivationRequest(sae_id=info.id, top_k=EXAMPLE_TOP_K, positions=runtime.PROMPT)


def by_example(result: ActivationResult) -> tuple[list[Match], list[TokenMatches]]:
    """Features by their largest activation anywhere in the example, and
    each token's strongest features."""
    best: dict[int, float] = {}
    tokens = []
    for position, token_id, features in result.positions:
        firing = [(f, v) for f, v in features if v > 0]
        for feature, value in firing:
            if value > best.get(feature, 0.0):
                best[feature] = value
        tokens.append(TokenMatches(position, token_id, tuple(
            Match(f, round(v, 6)) for f, v in firing[:TOKEN_FEATURES])))
    matches = [Match(f, round(v, 6)) for f, v in best.items()]
    return sorted(matches, key=lambda m: (-m.score, m.index)), tokens


def neighbours(decoder: torch.Tensor, info: SaeInfo, index: int) -> list[Match]:
    """Every other feature by the cosine of its decoder row with `index`'s."""
    check_feature_index(info, index, "neighbours_of")
    rows = torch.nn.functional.normalize(decoder.float(), dim=1)
    cosines = (rows @ rows[index]).tolist()
    matches = [Match(i, round(c, 6)) for i, c in enumerate(cosines) if i != index]
    return sorted(matches, key=lambda m: (-m.score, m.index))


async def run_example(inference, attached: dict, info: SaeInfo, example: str, model: str
                      ) -> tuple[list[Match], list[TokenMatches], list[str]]:
    """Runs `example` through `model` (the loaded one when empty), unsteered,
    and reads `info`'s features at every token: (features by
    their largest activation, each token's strongest, the tokens' strings)."""
    from service.errors import model_not_loaded
    from service.generation.events import ActivationsRead
    from service.requests.params import GenerateParams
    from service.requests.tokenization import TokenizeParams

    check_example(example)
    if info.id not in attached:
        raise invalid_parameter("sae_id", f"{info.id} is not attached; attach it to search by "
                                "example (its features are read as a request's readout is).")
    if not model:
        if inference.loaded is None:
            raise model_not_loaded("No model is loaded; name one in 'model'.")
        model = inference.loaded.id
    # Scoring mode (one step, log-probabilities): never steered, so the
    # features read are the unmodified model's.
    params = GenerateParams(model=model, prompts=(example,), max_tokens=1, logprobs=0,
                            sae_activations=readout_request(info))
    result = None
    async with inference.generation(params) as generation:
        async for event in generation.events():
            if isinstance(event, ActivationsRead):
                result = event.result
    if result is None:  # every generation with a readout ends with one
        raise EngineError("internal_error", "The example's readout did not come back.")
    matches, tokens = by_example(result)
    strings = (await inference.tokenize(TokenizeParams(
        model=model, prompt=example, return_token_strs=True))).token_strs or []
    return matches, tokens, strings
