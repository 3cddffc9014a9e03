"""Which request fields each route and engine honours: the field_not_honoured
table, and the ignored-fields report.

A field is honoured (it does what OpenAI says), reported (it changes nothing,
so the response names it in its ignored fields) or refused (it would change
the output and cannot be honoured here: 400 field_not_honoured naming it).
Nothing is dropped silently. A field whose value means "no change" (null,
`n: 1`, `logprobs: false`, `tools: []`, ...) is accepted everywhere.

Fields with a place in the contract (n, seed, max_completion_tokens) are
checked from the request itself; OpenAI fields without one arrive in
GenerateRequest.extra_fields with their JSON values and are checked here by
name. When a later feature makes a field honoured, its row changes here.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import EngineError

CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"
TRANSFORMERS, GGUF = "transformers", "gguf"


@dataclass(frozen=True)
class FieldRule:
    # Values that ask for nothing (null always does).
    no_change: tuple = ()
    # (route, engine) pairs where the field is honoured.
    honoured: frozenset[tuple[str, str]] = frozenset()
    # Why it is refused elsewhere, finishing "'<field>' is not honoured: ..."
    why: str = "this server does not implement it"
    code: str = "field_not_honoured"

    def refuse(self, name: str) -> EngineError:
        return EngineError(self.code, f"'{name}' is not honoured: {self.why}.", name)


NOT_YET = "not implemented yet"

# OpenAI (and miLLM extension) fields that change the output and have no field
# in the contract yet.
EXTRA_FIELD_RULES: dict[str, FieldRule] = {
    # Routes that serve these map them into the contract; elsewhere they arrive here.
    "logprobs": FieldRule((False,), why="log-probabilities are not served on this route"),
    "top_logprobs": FieldRule((0,), why="this route takes 'logprobs' for alternatives"),
    "allowed_token_ids": FieldRule(why="scoring is not served on this route"),
    "return_tokens_as_token_ids": FieldRule((False,), why="no tokens are returned here"),
    "add_special_tokens": FieldRule((True,), why="only raw prompts choose their special "
                                    "tokens"),
    # On chat, response_format is a contract field; anywhere else it arrives here.
    "response_format": FieldRule(({"type": "text"},), why="structured output is served on chat "
                                 "completions only", code="response_format_unsupported"),
    # Contract fields on the routes that serve them (GenerateRequest.profile, ...).
    "profile": FieldRule(why="steering profiles apply to chat completions only"),
    "steering_intensity": FieldRule(why="the steering dial applies to chat completions only"),
    "return_sae_activations": FieldRule(why="activations are read on chat and text "
                                        "completions only"),
    "steering": FieldRule(why="per-request steering vectors are " + NOT_YET),
    "extra_messages": FieldRule(([],), why="extra conversations are served on chat only"),
    "dimensions": FieldRule(why="embeddings with chosen dimensions are " + NOT_YET),
    "tools": FieldRule(([],), why="tool calling is not supported"),
    "tool_choice": FieldRule(("none",), why="tool calling is not supported"),
    "functions": FieldRule(([],), why="function calling is not supported"),
    "function_call": FieldRule(("none",), why="function calling is not supported"),
    "logit_bias": FieldRule(({},), why="logit bias is not supported"),
    "best_of": FieldRule((1,), why="best_of is not supported; use n"),
    "echo": FieldRule((False,), why="only raw prompts can be echoed"),
    "suffix": FieldRule(("",), why="insertion (suffix) is not supported"),
    "audio": FieldRule(why="audio output is not supported"),
    "modalities": FieldRule((["text"],), why="only text output is supported"),
}

# Contract fields whose honouring depends on the route or engine; checked by
# check_contract_fields.
GENERATING = frozenset((route, engine) for route in (CHAT, COMPLETIONS)
                       for engine in (TRANSFORMERS, GGUF))
ON_TRANSFORMERS = frozenset({(CHAT, TRANSFORMERS), (COMPLETIONS, TRANSFORMERS)})
# Scoring reads llama.cpp's logits on GGUF too (engines/gguf_engine.py); the
# GGUF engine refuses log-probabilities of generated text itself, before any load.
SCORING = ON_TRANSFORMERS | {(CHAT, GGUF), (COMPLETIONS, GGUF)}

CONTRACT_FIELD_RULES: dict[str, FieldRule] = {
    # n above 1: rows of one batch on the transformers engine
    "n": FieldRule((1,), ON_TRANSFORMERS, "several choices are not served here"),
    # GGUF: measured byte-identical over 20 runs per seed (docs/gguf.md), with a
    # seeded request never reusing a cached prefix (engines/gguf_engine.py).
    "seed": FieldRule((), GENERATING, "seeds are not yet measured to reproduce here"),
    "max_completion_tokens": FieldRule((), GENERATING, "nothing is generated here"),
    "logprobs": FieldRule((), SCORING, "this engine gives no per-token distribution"),
    "allowed_token_ids": FieldRule((), SCORING, "this engine gives no per-token distribution"),
    "echo": FieldRule((), frozenset({(COMPLETIONS, TRANSFORMERS), (COMPLETIONS, GGUF)}),
                      "only raw prompts can be echoed"),
    "extra_messages": FieldRule((), frozenset({(CHAT, TRANSFORMERS)}),
                                "extra conversations are served on chat completions only"),
    "response_format": FieldRule((), frozenset({(CHAT, TRANSFORMERS)}),
                                 "structured output needs the transformers engine's token masks",
                                 "response_format_unsupported"),
    # Steering hooks are forward hooks on the transformers engine's decoder layers.
    "profile": FieldRule((), frozenset({(CHAT, TRANSFORMERS)}),
                         "steering profiles apply to chat completions on the transformers "
                         "engine only"),
    "steering_intensity": FieldRule((), frozenset({(CHAT, TRANSFORMERS)}),
                                    "the steering dial applies to chat completions on the "
                                    "transformers engine only"),
    "return_sae_activations": FieldRule((), ON_TRANSFORMERS, "SAE activations are read on "
                                        "the transformers engine only"),
}


def _same(a, b) -> bool:
    """JSON equality: true is not 1, but 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _asks_for_change(rule: FieldRule, value) -> bool:
    return value is not None and not any(_same(value, v) for v in rule.no_change)


def check_extra_fields(extra: dict, route: str, engine: str) -> list[str]:
    """Refuse the first output-changing extra field not honoured here; return
    the names of the extra fields that are simply unused (to be reported)."""
    unused = []
    for name, value in extra.items():
        rule = EXTRA_FIELD_RULES.get(name)
        if rule is None:
            unused.append(name)
        elif _asks_for_change(rule, value) and (route, engine) not in rule.honoured:
            raise rule.refuse(name)
    return unused


def check_contract_field(name: str, value, route: str, engine: str) -> None:
    rule = CONTRACT_FIELD_RULES[name]
    if _asks_for_change(rule, value) and (route, engine) not in rule.honoured:
        raise rule.refuse(name)


def support_table(engine: str) -> list[tuple[str, str, bool, str, str]]:
    """(field, route, honoured, refusal code, reason) for every field that
    depends on the route or engine, as the capability RPC reports them. A field
    with both a contract rule and an extra-field rule (where a route carries it
    outside the contract) is honoured where either rule honours it."""
    rows = []
    for name in dict.fromkeys([*CONTRACT_FIELD_RULES, *EXTRA_FIELD_RULES]):
        rules = [r for r in (CONTRACT_FIELD_RULES.get(name), EXTRA_FIELD_RULES.get(name)) if r]
        for route in (CHAT, COMPLETIONS, EMBEDDINGS):
            if any((route, engine) in r.honoured for r in rules):
                rows.append((name, route, True, "", ""))
            else:
                rows.append((name, route, False, rules[0].code, rules[0].why))
    return rows
