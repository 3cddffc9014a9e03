"""millm.v1.GenerationService: a GenerateRequest into GenerateParams; the replies
are generation_replies.py's."""

from __future__ import annotations

import contextlib

from google.protobuf import json_format

from millm.v1 import (
    generation_pb2,
    generation_service_pb2,
    generation_service_pb2_grpc,
    steering_pb2,
)
from service.errors import invalid_parameter
from service.inference import InferenceService
from service.requests import custom_tools, tools
from service.requests.params import ChatTurn, GenerateParams, ResponseFormat, StructuredOutputs
from service.servicers.error_handling import stream_errors
from service.servicers.generation_mux import MuxStream
from service.servicers.generation_replies import coalesced, event_to_pb, spaced
from service.steering import plan as runtime
from service.steering import readout
from service.structured_output import (
    JSON_OBJECT,
    JSON_SCHEMA,
)

# The contract's Role values are OpenAI's role names (requests/params.CHAT_ROLES).
_ROLES = {value: name.removeprefix("ROLE_").lower()
          for name, value in generation_pb2.Role.items() if value}
_TOOL_CHOICES = {
    generation_pb2.TOOL_CHOICE_MODE_NONE: tools.NONE,
    generation_pb2.TOOL_CHOICE_MODE_AUTO: tools.AUTO,
    generation_pb2.TOOL_CHOICE_MODE_REQUIRED: tools.REQUIRED,
    generation_pb2.TOOL_CHOICE_MODE_FUNCTION: tools.FUNCTION,
}


def _opt(message, name: str):
    return getattr(message, name) if message.HasField(name) else None


def prompt_from_pb(p: generation_pb2.Prompt) -> str | tuple[int, ...]:
    return tuple(p.token_ids.ids) if p.WhichOneof("kind") == "token_ids" else p.text


def add_special_from_pb(prompt: generation_pb2.PromptInput) -> bool | None:
    return prompt.add_special_tokens if prompt.HasField("add_special_tokens") else None


def turns_from_pb(chat: generation_pb2.ChatInput) -> tuple[ChatTurn, ...]:
    return tuple(ChatTurn(role=_ROLES.get(m.role, ""), content=m.content, name=m.name,
                          tool_calls=tuple(tools.ToolCallRecord(c.id, c.name, c.arguments_json)
                                           for c in m.tool_calls),
                          tool_call_id=m.tool_call_id, reasoning_content=m.reasoning_content)
                 for m in chat.messages)


_CUSTOM_SYNTAX = {generation_pb2.CUSTOM_TOOL_SYNTAX_LARK: custom_tools.LARK,
                  generation_pb2.CUSTOM_TOOL_SYNTAX_REGEX: custom_tools.REGEX}


def function_from_pb(t: generation_pb2.FunctionTool) -> tools.FunctionTool:
    custom = None
    if t.HasField("custom"):
        custom = (_CUSTOM_SYNTAX.get(t.custom.syntax, custom_tools.FREE), t.custom.definition)
    return tools.FunctionTool(t.name, t.description, t.parameters_json,
                              t.strict if t.HasField("strict") else None, custom)


def tools_from_pb(request) -> tuple[tuple[tools.FunctionTool, ...], tools.ToolChoice | None]:
    functions = tuple(function_from_pb(t) for t in request.tools)
    choice = None
    if request.HasField("tool_choice"):
        mode = _TOOL_CHOICES.get(request.tool_choice.mode)
        if mode is None:  # unspecified: auto with tools, as if unset
            mode = tools.AUTO if functions else None
        if mode is not None:
            choice = tools.ToolChoice(mode, request.tool_choice.function_name)
    return functions, choice


def _extra_fields(request) -> dict:
    try:
        return json_format.MessageToDict(request.extra_fields)
    except ValueError as exc:  # NaN or infinity: not JSON
        raise invalid_parameter("extra_fields", f"'extra_fields' must hold JSON: {exc}") from None


def _template_kwargs(request) -> dict | None:
    if not request.HasField("chat_template_kwargs"):
        return None
    try:
        return json_format.MessageToDict(request.chat_template_kwargs)
    except ValueError as exc:  # NaN or infinity: not JSON
        raise invalid_parameter("chat_template_kwargs", "'chat_template_kwargs' must hold "
                                f"JSON: {exc}") from None


def _response_format(request) -> ResponseFormat | None:
    if not request.HasField("response_format"):
        return None
    fmt = request.response_format
    which = fmt.WhichOneof("format")
    if which == "json_object":
        return ResponseFormat(JSON_OBJECT)
    if which == "json_schema":
        return ResponseFormat(JSON_SCHEMA, fmt.json_schema.name, fmt.json_schema.schema_json)
    return None  # text, or nothing chosen: free text


def _structured_outputs(request) -> StructuredOutputs | None:
    if not request.HasField("structured_outputs"):
        return None
    so = request.structured_outputs
    which = so.WhichOneof("kind")
    if which is None or (which == "json_object" and not so.json_object):
        return None  # no kind, or json_object false: free text
    if which == "choice":
        return StructuredOutputs(which, tuple(so.choice.choices))
    return StructuredOutputs(which, getattr(so, which))


_SELECTORS = {
    steering_pb2.POSITION_SELECTOR_UNSPECIFIED: runtime.LAST,
    steering_pb2.POSITION_SELECTOR_LAST: runtime.LAST,
    steering_pb2.POSITION_SELECTOR_PROMPT: runtime.PROMPT,
    steering_pb2.POSITION_SELECTOR_COMPLETION: runtime.COMPLETION,
    steering_pb2.POSITION_SELECTOR_ALL: runtime.ALL,
}
_READ_POINTS = {
    steering_pb2.READ_POINT_UNSPECIFIED: runtime.POST_STEERING,
    steering_pb2.READ_POINT_POST_STEERING: runtime.POST_STEERING,
    steering_pb2.READ_POINT_PRE_STEERING: runtime.PRE_STEERING,
}


def _dial(request):
    if not request.HasField("steering_intensity"):
        return None
    which = request.steering_intensity.WhichOneof("value")
    if which is None:
        return None
    return getattr(request.steering_intensity, which)


def readout_from_pb(request) -> readout.ActivationRequest | None:
    if not request.HasField("return_sae_activations"):
        return None
    r = request.return_sae_activations
    which = r.WhichOneof("positions")
    positions, start, end = runtime.LAST, 0, 0
    if which == "range":
        positions, start, end = runtime.RANGE, r.range.start, r.range.end
    elif which == "selector":
        positions = _SELECTORS.get(r.selector, "")
    read_point = _READ_POINTS.get(r.read_point, "")
    features = None
    if r.HasField("feature_selection"):
        features = tuple(r.feature_selection.indices)  # empty: refused by readout
    elif r.features:
        features = tuple(r.features)
    return readout.ActivationRequest(
        sae_id=r.sae_id, features=features,
        top_k=r.top_k if r.HasField("top_k") else None, positions=positions, start=start,
        end=end, read_point=read_point)


def params_from_pb(request: generation_service_pb2.GenerateRequest) -> GenerateParams:
    s = request.sampling
    messages = prompts = None
    which = request.WhichOneof("input")
    extra_chats = tuple(turns_from_pb(c) for c in request.extra_chats)
    if which == "chat":
        messages = turns_from_pb(request.chat)
    elif which == "prompt":
        prompts = tuple(prompt_from_pb(p) for p in request.prompt.prompts)
    functions, choice = tools_from_pb(request)
    extra_fields = _extra_fields(request)
    # llama.cpp's top-level grammar has no field of its own: it comes as an
    # extra field, and is read as the grammar it is.
    grammar = extra_fields.pop("grammar", None)
    return GenerateParams(
        model=request.model,
        tools=functions,
        tool_choice=choice,
        parallel_tool_calls=(request.parallel_tool_calls
                             if request.HasField("parallel_tool_calls") else None),
        messages=messages,
        prompts=prompts,
        temperature=_opt(s, "temperature"),
        top_p=_opt(s, "top_p"),
        top_k=_opt(s, "top_k"),
        min_p=_opt(s, "min_p"),
        max_tokens=_opt(s, "max_tokens"),
        max_completion_tokens=_opt(s, "max_completion_tokens"),
        stop=tuple(s.stop),
        n=_opt(s, "n"),
        seed=_opt(s, "seed"),
        frequency_penalty=_opt(s, "frequency_penalty"),
        presence_penalty=_opt(s, "presence_penalty"),
        repetition_penalty=_opt(s, "repetition_penalty"),
        ignore_eos=s.ignore_eos,
        request_id=request.request_id,
        parse_special_tokens=which == "prompt" and request.prompt.parse_special_tokens,
        extra_fields=extra_fields,
        grammar=grammar,
        structured_outputs=_structured_outputs(request),
        unused_fields=tuple(request.unused_fields),
        user=request.user if request.HasField("user") else None,
        strict=request.strict,
        stream=request.stream,
        response_format=_response_format(request),
        logprobs=_opt(s, "logprobs"),
        allowed_token_ids=tuple(s.allowed_token_ids),
        logit_bias=dict(s.logit_bias) or None,
        echo=which == "prompt" and request.prompt.echo,
        add_special_tokens=add_special_from_pb(request.prompt) if which == "prompt" else None,
        extra_chats=extra_chats,
        profile=request.profile if request.HasField("profile") else None,
        steering_intensity=_dial(request),
        sae_activations=readout_from_pb(request),
        steering_compare=request.steering_compare,
        stream_interval=_opt(request, "stream_interval"),
        priority=_opt(request, "priority"),
        whole=request.coalesce and not request.stream,
        reasoning_effort=_opt(request, "reasoning_effort"),
        thinking_token_budget=_opt(request, "thinking_token_budget"),
        chat_template_kwargs=_template_kwargs(request),
    )


class GenerationServicer(generation_service_pb2_grpc.GenerationServiceServicer):
    def __init__(self, inference: InferenceService, access=None):
        self._inference = inference
        self._access = access  # servicers/access.Access, for GenerateMany's calls

    async def GenerateMany(self, request_iterator, context):
        async for frame in MuxStream(self, self._access).frames(request_iterator):
            yield frame

    async def replies(self, request, context=None):
        """A Generate call's messages: Generate's and each GenerateMany call's."""
        async with self._inference.generation(params_from_pb(request)) as generation:
            events = generation.events()
            # aclosing: a cancelled call closes the generator at once, which
            # cancels the job in the model thread.
            async with contextlib.aclosing(events):
                interval = request.stream_interval if request.HasField("stream_interval") else 1
                if request.stream and interval > 1:
                    async for message in spaced(events, interval):
                        yield message
                    return
                if not request.coalesce or request.stream:
                    # A message an event, the metadata alone first (the
                    # contract's order), with no generator between: this
                    # loop runs once a streamed token.
                    async for event in events:
                        yield event_to_pb(event)
                    return
                async for message in coalesced(events):
                    yield message

    # The same code, its errors as the call's status (no generator between).
    Generate = stream_errors(replies)
