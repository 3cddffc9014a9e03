"""POST /tokenize and /detokenize (TokenizationService) as the engine reads
them: the request values, their rules, and how a conversation is split into
what the template renders and what is continued.

The tokens must be the ones a generation of the same input would feed the
model, so a conversation goes through the same checks (roles, tool history,
forged special tokens, tools) and the same encoder as generation
(InferenceService.encode_conversation); only the caller's explicit choices
(no generation prompt, a closed final assistant turn, an added BOS) differ
from generation's rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import invalid_parameter
from service.requests import checks
from service.requests.params import ChatTurn, GenerateParams
from service.requests.tools import FunctionTool, ToolPlan, check_tools, template_message

# Ids one DetokenizeRequest may hold (a REST body holds far fewer).
MAX_DETOKENIZE_TOKENS = 1_048_576


@dataclass(frozen=True)
class TokenizeParams:
    model: str
    messages: tuple[ChatTurn, ...] | None = None
    prompt: str | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    add_special_tokens: bool | None = None
    parse_special_tokens: bool = False
    tools: tuple[FunctionTool, ...] = ()
    return_token_strs: bool = False
    request_id: str = ""


@dataclass(frozen=True)
class DetokenizeParams:
    model: str
    tokens: tuple[int, ...]
    request_id: str = ""


@dataclass(frozen=True)
class Tokenized:
    tokens: list[int]
    max_model_len: int
    token_strs: list[str] | None
    model: str


@dataclass(frozen=True)
class ChatRendering:
    """What the template renders and how: the checked tool plan, the
    messages, the answer to continue (appended raw), the generation prompt."""

    plan: ToolPlan | None
    messages: list[dict]
    partial: str | None
    generation_prompt: bool


def _chat_only(params: TokenizeParams) -> None:
    for name in ("add_generation_prompt", "continue_final_message"):
        if getattr(params, name) is not None:
            raise invalid_parameter(name, f"'{name}' applies to 'messages' only.")
    if params.tools:
        raise invalid_parameter("tools", "'tools' applies to 'messages' only.")


def check_prompt(params: TokenizeParams) -> None:
    if (params.messages is None) == (params.prompt is None):
        raise invalid_parameter("prompt", "Send exactly one of 'prompt' and 'messages'.")
    if params.prompt is not None:
        _chat_only(params)
    elif params.parse_special_tokens:
        raise invalid_parameter("parse_special_tokens", "'parse_special_tokens' applies to "
                                "'prompt' only: message text never spells a special token.")


def chat_rendering(params: TokenizeParams, special_tokens: tuple[str, ...]) -> ChatRendering:
    """The conversation's checks (generation's own) and its rendering. By
    default a final assistant message without calls is continued and
    anything else gets the generation prompt, as generation renders it."""
    as_generation = GenerateParams(model=params.model, messages=params.messages,
                                   tools=params.tools)
    checks.check_input(as_generation)
    checks.check_no_special_tokens(as_generation, special_tokens)
    plan = check_tools(params.tools, None, None, [])
    turns = params.messages
    last = turns[-1]
    continuable = last.role == "assistant" and not last.tool_calls
    cont = params.continue_final_message
    if cont is None:
        cont = continuable and params.add_generation_prompt is not True
    prompt = params.add_generation_prompt
    if prompt is None:
        prompt = not cont
    if cont and prompt:
        raise invalid_parameter("continue_final_message", "'continue_final_message' and "
                                "'add_generation_prompt' cannot both be true.")
    if cont and not continuable:
        raise invalid_parameter("continue_final_message", "'continue_final_message' needs a "
                                "last message from the assistant, without tool calls.")
    if cont:
        messages, partial = checks.continuation(turns)
        # The continued answer follows the opening of the assistant's turn.
        return ChatRendering(plan, messages, partial, True)
    return ChatRendering(plan, [template_message(t) for t in turns], None, prompt)


def check_detokenize(params: DetokenizeParams, vocab_size: int) -> None:
    if len(params.tokens) > MAX_DETOKENIZE_TOKENS:
        raise invalid_parameter("tokens", f"'tokens' holds at most {MAX_DETOKENIZE_TOKENS} ids; "
                                f"got {len(params.tokens)}.")
    for i, token in enumerate(params.tokens):
        if not 0 <= token < vocab_size:
            raise invalid_parameter(f"tokens[{i}]", f"'tokens[{i}]' is {token}, outside the "
                                    f"vocabulary (0-{vocab_size - 1}).")
