"""Log-probabilities in OpenAI's two JSON shapes, from the engine's TokenScores.

Completions (legacy): {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, with
top_logprobs a {token: logprob} dict per position, keyed by text; two ids that decode to
the same text share one key, whose probability is the sum of theirs. text_offset is the
character offset of each token in prompt + completion (OpenAI's convention).
Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}.
`token_ids` keys every token "token_id:<id>" instead (return_tokens_as_token_ids).
"""

from __future__ import annotations

import math

from millm.v1 import generation_pb2


def _name(token: generation_pb2.TokenLogprob, token_ids: bool) -> str:
    return f"token_id:{token.token_id}" if token_ids else token.text


def _logprob(token: generation_pb2.TokenLogprob) -> float | None:
    return token.logprob if token.HasField("logprob") else None


class CompletionLogprobs:
    """Accumulates one choice's completions-shaped log-probabilities."""

    def __init__(self, token_ids: bool, offset: int = 0):
        self.token_ids = token_ids
        self.offset = offset  # characters before the next token

    def block(self, scores) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for score in scores:
            token = score.token
            out["tokens"].append(_name(token, self.token_ids))
            out["token_logprobs"].append(_logprob(token))
            if _logprob(token) is None:
                out["top_logprobs"].append(None)  # a prompt's first token: nothing predicted it
            else:
                merged: dict[str, float] = {}
                for alt in score.top:
                    key = _name(alt, self.token_ids)
                    merged[key] = (alt.logprob if key not in merged
                                   else _logaddexp(merged[key], alt.logprob))
                out["top_logprobs"].append(merged)
            out["text_offset"].append(self.offset)
            self.offset += len(token.text)
        return out


def _logaddexp(a: float, b: float) -> float:
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def merge_blocks(first: dict | None, second: dict) -> dict:
    if first is None:
        return second
    return {key: first[key] + second[key] for key in first}


def chat_content(scores, token_ids: bool) -> list[dict]:
    def entry(token):
        return {"token": _name(token, token_ids), "logprob": token.logprob,
                "bytes": list(token.bytes)}

    return [{**entry(s.token), "top_logprobs": [entry(t) for t in s.top]} for s in scores]
