"""Which request fields each route honours on each engine: one table, read by
validation, by the ignored-fields report and by GetCapabilities alike.

Every cell (field x route) is one of three treatments:

- honoured: the field does what OpenAI says; some cells need a capability of
  the serving engine (engines/base.py EngineCapabilities), and without it the
  field is refused;
- reported: the field changes nothing on that route, so it is accepted and
  named in the response's ignored fields (strict mode refuses it);
- refused: it would change the output and cannot be honoured here: 400 with
  the rule's code (field_not_honoured, ...) naming the field.

Anthropic's Messages API (route `messages`, POST /v1/messages on the bridge)
is a chat generation: the bridge translates its body into the contract and
forwards every field it has no place for under its own name, as an extra
field. The engine never learns which API a request came in by; it judges a
Messages request as the chat request it is, so that route's column is derived
from chat's (`messages_cell`): a field the Messages body carries into the
contract (MESSAGES_PLACES) is treated as on chat, and one chat honours but
the Messages body has no place for is refused like any unmapped extra field.

Nothing is dropped silently. A value that means "no change" (null, `n: 1`,
`logprobs: false`, `tools: []`, ...) is accepted everywhere. Fields the table
does not know are reported. When a request sends several refused fields, the
first in the order of this table is named, whatever order the body (or a
protobuf Struct) holds them in. When a later feature makes a field honoured,
its row changes here and nowhere else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from service.engines.capabilities import EngineCapabilities
from service.errors import EngineError

CHAT, COMPLETIONS, EMBEDDINGS = "chat", "completions", "embeddings"
MESSAGES = "messages"
ROUTES = (CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES)
# The table's fields that a Messages body maps into the contract (miLLM's
# extensions seed, profile and steering_intensity under their own names;
# tools and tool_choice in Anthropic's shapes; llama.cpp's top-level grammar,
# which every route's extra fields carry to the engine by name).
MESSAGES_PLACES = frozenset({"seed", "profile", "steering_intensity", "tools", "tool_choice",
                             "grammar", "priority"})
# Messages fields of the table that the bridge maps onto another field of the
# contract: their cell is that field's on chat (`thinking` is the reasoning
# budget; its `disabled` is reasoning_effort "none"; `output_config.effort` is
# reasoning_effort, and its `format` comes as `output_format`, refused).
MESSAGES_ALIASES = {"thinking": "thinking_token_budget", "output_config": "reasoning_effort"}
# Messages fields the bridge does itself, before the conversation reaches the
# contract (a gRPC caller sends the conversation it wants rendered): always
# honoured there, with what they do.
MESSAGES_BRIDGED = {
    "context_management": "clear_thinking_20251015 leaves older assistant turns' thinking "
    "out of the prompt (keep: all, or the last N turns); other edits are reported",
}
MESSAGES_NOTES = {
    "output_config": "effort is the reasoning effort (max as xhigh); format is refused",
}
NO_PLACE = "this endpoint's request has no place for it"
ALWAYS = ""  # a cell honoured on every engine


class Treatment(enum.Enum):
    HONOURED = "honoured"
    REPORTED = "reported"
    REFUSED = "refused"


@dataclass(frozen=True)
class Cell:
    treatment: Treatment
    code: str = ""
    reason: str = ""


@dataclass(frozen=True)
class FieldRule:
    # route -> the EngineCapabilities attribute the field needs there (ALWAYS: none).
    honoured: dict[str, str] = field(default_factory=dict)
    # Routes where the field means nothing and is reported.
    reported: frozenset[str] = frozenset()
    # Values that ask for nothing (null always does).
    no_change: tuple = ()
    # Why it is refused on a route that does not serve it, and on an engine
    # that lacks the capability; each finishes "'<field>' is not honoured: ...".
    why: str = "this server does not implement it"
    why_engine: str = ""
    code: str = "field_not_honoured"
    # A limit an honoured cell still has, said with it in GetCapabilities.
    note: str = ""

    def cell(self, route: str, kind: EngineCapabilities, model: EngineCapabilities) -> Cell:
        if route == MESSAGES:
            raise ValueError("the messages column is derived: use messages_cell")
        if route in self.reported:
            return Cell(Treatment.REPORTED)
        if route not in self.honoured:
            return Cell(Treatment.REFUSED, self.code, self.why)
        needs = self.honoured[route]
        if needs == ALWAYS or getattr(model, needs):
            return Cell(Treatment.HONOURED, reason=self.note)
        if needs in _REPORTED_WITHOUT:
            # Nothing for the field to act on in this model: it changes nothing.
            return Cell(Treatment.REPORTED, reason=_REPORTED_WITHOUT[needs])
        if getattr(kind, needs):
            # This kind of engine can, but not for the model it has loaded.
            return Cell(Treatment.REFUSED, *_UNAVAILABLE[needs])
        return Cell(Treatment.REFUSED, self.code, self.why_engine or self.why)


# A capability the engine kind has but the loaded model lacks.
# A capability whose absence in the loaded model leaves the field nothing to
# change (reported as ignored), with why.
_REPORTED_WITHOUT = {
    "reasoning": "the loaded model has no reasoning format",
}
_UNAVAILABLE = {
    "steer": ("steering_unavailable", "the loaded model's layers cannot be reached by the "
              "steering hooks"),
}

GENERATING = {CHAT: ALWAYS, COMPLETIONS: ALWAYS}
NOT_YET = "not implemented yet"
NO_DISTRIBUTION = "this engine gives no per-token distribution"

RULES: dict[str, FieldRule] = {
    "n": FieldRule({CHAT: "several_choices", COMPLETIONS: "several_choices"},
                   frozenset({EMBEDDINGS}), (1,), why_engine="several choices are not "
                   "served here"),
    # GGUF: measured byte-identical over 20 runs per seed (docs/gguf.md).
    "seed": FieldRule(GENERATING, frozenset({EMBEDDINGS})),
    "max_completion_tokens": FieldRule(GENERATING, frozenset({EMBEDDINGS})),
    "stream_interval": FieldRule(GENERATING, frozenset({EMBEDDINGS}), (1,)),
    "priority": FieldRule(GENERATING, frozenset({EMBEDDINGS}), (0,)),
    # GGUF serves scoring and echo log-probabilities, not those of generated
    # text: validation.check_generation_logprobs, which reads the same capability.
    "logprobs": FieldRule({CHAT: "scoring", COMPLETIONS: "scoring"}, no_change=(False,),
                          why="log-probabilities are not served on this route",
                          why_engine=NO_DISTRIBUTION),
    "top_logprobs": FieldRule({CHAT: "scoring"}, no_change=(0,),
                              why="this route takes 'logprobs' for alternatives",
                              why_engine=NO_DISTRIBUTION),
    "allowed_token_ids": FieldRule({CHAT: "scoring", COMPLETIONS: "scoring"},
                                   why="scoring is not served on this route",
                                   why_engine=NO_DISTRIBUTION),
    "return_tokens_as_token_ids": FieldRule(GENERATING, no_change=(False,),
                                            why="no tokens are returned here"),
    "add_special_tokens": FieldRule({COMPLETIONS: ALWAYS}, no_change=(True,),
                                    why="only raw prompts choose their special tokens"),
    "echo": FieldRule({COMPLETIONS: ALWAYS}, no_change=(False,),
                      why="only raw prompts can be echoed"),
    "extra_messages": FieldRule({CHAT: "extra_conversations"}, no_change=([],),
                                why="extra conversations are served on chat completions only",
                                why_engine="extra conversations are not served on this "
                                "engine"),
    "response_format": FieldRule({CHAT: "grammar"}, no_change=({"type": "text"},),
                                 why="structured output is served on chat completions only",
                                 why_engine="this engine cannot mask its tokens",
                                 code="response_format_unsupported"),
    # vLLM's and llama.cpp's constraints: the same grammar masks as
    # response_format, on raw prompts too (requests/constraints.py).
    "structured_outputs": FieldRule({CHAT: "grammar", COMPLETIONS: "grammar"},
                                    why="constraints apply to generated text",
                                    why_engine="this engine cannot mask its tokens"),
    "grammar": FieldRule({CHAT: "grammar", COMPLETIONS: "grammar"}, no_change=("",),
                         why="constraints apply to generated text",
                         why_engine="this engine cannot mask its tokens"),
    # Both engine kinds steer (steering/plan.py); a loaded model whose residual
    # stream its engine cannot reach has steer=False, refused steering_unavailable.
    "profile": FieldRule({CHAT: "steer"}, why="steering profiles apply to chat completions "
                         "only", why_engine="this engine cannot steer its model"),
    "steering_intensity": FieldRule({CHAT: "steer"}, why="the steering dial applies to chat "
                                    "completions only", why_engine="this engine cannot steer "
                                    "its model"),
    "return_sae_activations": FieldRule({CHAT: "steer", COMPLETIONS: "steer"},
                                        why="activations are read on chat and text "
                                        "completions only", why_engine="this engine cannot "
                                        "read its model's activations"),
    "steering_compare": FieldRule({CHAT: "steer", COMPLETIONS: "steer"}, no_change=(False,),
                                  why="steered and unsteered completions are compared on chat "
                                  "and text completions only", why_engine="this engine cannot "
                                  "steer its model"),
    "steering": FieldRule(why="per-request steering vectors are " + NOT_YET),
    "dimensions": FieldRule(why="embeddings with chosen dimensions are " + NOT_YET),
    # Calls are constrained by the same grammar masks as response_format.
    "tools": FieldRule({CHAT: "grammar"}, no_change=([],), why="tool calling is served on "
                       "chat completions only", why_engine="this engine cannot constrain calls",
                       note="a non-strict tool's schema may be any JSON Schema: calls are "
                       "constrained by the part a grammar enforces; strict ones keep the subset"),
    "tool_choice": FieldRule({CHAT: "grammar"}, no_change=("none",), why="tool calling is "
                             "served on chat completions only",
                             why_engine="this engine cannot constrain calls"),
    "parallel_tool_calls": FieldRule({CHAT: "grammar"}, frozenset({COMPLETIONS, EMBEDDINGS}),
                                     why_engine="this engine cannot constrain calls"),
    # Reasoning (requests/reasoning.py, generation/reasoning.py): a model
    # with no reasoning format reports them as ignored.
    "reasoning_effort": FieldRule({CHAT: "reasoning"}, frozenset({COMPLETIONS, EMBEDDINGS}),
                                  note="passed to the chat template; 'none' switches thinking "
                                  "off"),
    "thinking_token_budget": FieldRule({CHAT: "reasoning"},
                                       frozenset({COMPLETIONS, EMBEDDINGS})),
    "chat_template_kwargs": FieldRule({CHAT: "reasoning"}, frozenset({COMPLETIONS, EMBEDDINGS}),
                                      no_change=({},), note="names the chat template never "
                                      "mentions are reported as ignored"),
    "functions": FieldRule(no_change=([],), why="function calling is not supported"),
    "function_call": FieldRule(no_change=("none",), why="function calling is not supported"),
    # Added to each row's logits before the draw; refused in scoring mode
    # (checks.check_logit_bias), whose answer is the model's own top token.
    "logit_bias": FieldRule(GENERATING, frozenset({EMBEDDINGS}), no_change=({},),
                            note="not in scoring mode (max_tokens 1 with logprobs), refused "
                            "(invalid_scoring_request); log-probabilities leave the bias out"),
    "best_of": FieldRule(no_change=(1,), why="best_of is not supported; use n"),
    "suffix": FieldRule(no_change=("",), why="insertion (suffix) is not supported"),
    "audio": FieldRule(why="audio output is not supported"),
    "modalities": FieldRule(no_change=(["text"],), why="only text output is supported"),
    # The Responses API's own fields (POST /v1/responses is a chat generation
    # here); its store, metadata and previous_response_id are the bridge's.
    "background": FieldRule(no_change=(False,), why="background responses are not served; "
                            "wait for the response or stream it"),
    "truncation": FieldRule(no_change=("disabled",), why="the input is never truncated: it must "
                            "fit the context window"),
    "conversation": FieldRule(why="the Conversations API is not served; chain responses with "
                              "previous_response_id"),
    "max_tool_calls": FieldRule(why="a cap on tool calls is " + NOT_YET),
    # Hints and labels that never change the output: the bridge reads a
    # Responses request's prompt_cache_key as a routing hint (replicas with
    # that prefix cached); Codex labels its requests with client_metadata.
    "prompt_cache_key": FieldRule(reported=frozenset(ROUTES) - {MESSAGES}),
    "client_metadata": FieldRule(reported=frozenset(ROUTES) - {MESSAGES}),
    # On /v1/responses the bridge serves reasoning.encrypted_content itself
    # (docs/responses.md) and forwards only the other values; elsewhere it
    # asks for nothing from a model that shows no reasoning.
    "include": FieldRule(no_change=([], ["reasoning.encrypted_content"]),
                         why="no extra output (log-probabilities, sources) is included in "
                         "responses"),
    # Anthropic's Messages fields that would change the output. `thinking` is
    # the Messages body's reasoning budget (MESSAGES_ALIASES); anywhere else
    # it is an unknown request to think, refused.
    "thinking": FieldRule(no_change=({"type": "disabled"},), why="thinking is Anthropic's "
                          "Messages API field; use thinking_token_budget or reasoning_effort"),
    "output_config": FieldRule(no_change=({},), why="output_config is Anthropic's Messages "
                               "API field; use reasoning_effort or response_format"),
    "output_format": FieldRule(why="output formats are " + NOT_YET + "; force a tool for "
                               "structured output"),
    "mcp_servers": FieldRule(no_change=([],), why="the server calls no MCP servers"),
    "container": FieldRule(why="code-execution containers are not served"),
    "context_management": FieldRule(why="context edits are Anthropic's Messages API field; "
                                    "send the conversation as it should be rendered"),
}


def _same(a, b) -> bool:
    """JSON equality: true is not 1, but 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def messages_cell(name: str, rule: FieldRule, kind: EngineCapabilities,
                  model: EngineCapabilities) -> Cell:
    """The Messages route's cell: chat's, except that a field chat honours
    but a Messages body cannot place is refused, as check() refuses an
    unmapped extra field."""
    if name in MESSAGES_BRIDGED:
        return Cell(Treatment.HONOURED, reason=MESSAGES_BRIDGED[name])
    if name in MESSAGES_ALIASES:
        cell = RULES[MESSAGES_ALIASES[name]].cell(CHAT, kind, model)
        if cell.treatment is Treatment.HONOURED and name in MESSAGES_NOTES:
            return Cell(Treatment.HONOURED, reason=MESSAGES_NOTES[name])
        return cell
    # check() runs first with the engine kind's capabilities: a field the kind
    # honours but the body could not place is refused there, whatever the
    # loaded model would make of it.
    if (name not in MESSAGES_PLACES
            and rule.cell(CHAT, kind, kind).treatment is Treatment.HONOURED):
        return Cell(Treatment.REFUSED, "field_not_honoured", NO_PLACE)
    return rule.cell(CHAT, kind, model)


def cell_for(name: str, route: str, kind: EngineCapabilities,
             model: EngineCapabilities) -> Cell:
    rule = RULES[name]
    if route == MESSAGES:
        return messages_cell(name, rule, kind, model)
    return rule.cell(route, kind, model)


def asks_for_change(name: str, value) -> bool:
    rule = RULES.get(name)
    no_change = rule.no_change if rule is not None else ()
    return value is not None and not any(_same(value, v) for v in no_change)


def check(sent: dict, route: str, kind: EngineCapabilities,
          model: EngineCapabilities | None = None, unmapped=frozenset()) -> list[str]:
    """Refuse the first field (in table order) that asks for a change this
    route and engine cannot honour; return the names of the sent fields that
    are reported (table order, then unknown names sorted). `kind` is what the
    engine kind offers, `model` what the loaded model does (None: not loaded
    yet, assume the kind's). `unmapped` names the fields that came only as
    extra fields: the caller found no place for them in the request, so one
    the route would honour cannot act either (say `n` on /v1/responses,
    whose request has no field for it) and is refused, never dropped."""
    model = model or kind
    reported = []
    for name, rule in RULES.items():
        if name not in sent:
            continue
        cell = rule.cell(route, kind, model)
        if cell.treatment is Treatment.REPORTED:
            reported.append(name)  # whatever its value: nothing here reads it
        elif cell.treatment is Treatment.REFUSED and asks_for_change(name, sent[name]):
            raise EngineError(cell.code, f"'{name}' is not honoured: {cell.reason}.", name)
        elif name in unmapped and asks_for_change(name, sent[name]):
            raise EngineError("field_not_honoured", f"'{name}' is not honoured: {NO_PLACE}.",
                              name)
    reported.extend(sorted(name for name in sent if name not in RULES))
    return reported


def support_table(kind: EngineCapabilities,
                  model: EngineCapabilities) -> list[tuple[str, str, Cell]]:
    """(field, route, cell) for every field and route, as GetCapabilities
    reports them."""
    return [(name, route, cell_for(name, route, kind, model))
            for name in RULES for route in ROUTES]
