"""POST /tokenize and POST /detokenize (vLLM's routes and shapes), over the
engine's TokenizationService.

The engine owns every rule (which input, the chat template, tools, the
vocabulary); the bridge maps JSON to the contract. The contract has no place
for fields outside vLLM's documented ones, so unknown keys are reported in
X-miLLM-Ignored-Fields (refused under X-miLLM-Strict), and the vLLM fields
that would change the tokens but are not served here (a chat template of the
caller's, template kwargs, multimodal options) are refused by name.
"""

from __future__ import annotations

import grpc
from fastapi.responses import JSONResponse
from starlette.requests import Request

from millm.v1 import tokenization_service_pb2
from rest_bridge.access import call_metadata, request_id
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from rest_bridge.serving import ignored_fields, tool_calls
from rest_bridge.serving.chat import chat_input
from rest_bridge.serving.disconnect import unless_disconnected
from rest_bridge.serving.request_fields import strict_mode

# vLLM fields that would change the tokens, with no place in the contract.
NOT_SERVED = {
    "chat_template": "the model's own chat template is always used",
    "chat_template_kwargs": "chat templates take no extra arguments here",
    "mm_processor_kwargs": "only text is tokenized",
    "media_io_kwargs": "only text is tokenized",
}
FLAGS = ("add_generation_prompt", "continue_final_message", "add_special_tokens")


def _unused(request, http_request: Request) -> dict[str, str]:
    """The ignored-fields header, or a 400 under strict mode."""
    extras = request.top_level_extras()
    for name, why in NOT_SERVED.items():
        if extras.get(name) not in (None, {}):
            raise OpenAIError(400, f"'{name}' is not honoured: {why}.", param=name,
                              code="field_not_honoured")
    unused = [name for name in sorted(extras) if name not in NOT_SERVED]
    unused += request.nested_unused()
    for i, message in enumerate(getattr(request, "messages", None) or ()):
        if message.name:
            unused.append(f"messages[{i}].name")  # templates render no author names
    if unused and strict_mode(http_request):
        raise OpenAIError(400, "Strict mode: the request has fields that would go unused: "
                          + ", ".join(unused) + ".", param=unused[0][:256],
                          code="unused_fields_refused")
    header = ignored_fields.header_value(unused)
    return {ignored_fields.HEADER: header} if header is not None else {}


def tokenize_pb(request: TokenizeRequest) -> tokenization_service_pb2.TokenizeRequest:
    pb = tokenization_service_pb2.TokenizeRequest(
        model=request.model, request_id=request_id.get(),
        parse_special_tokens=bool(request.parse_special_tokens),
        return_token_strs=bool(request.return_token_strs))
    if request.messages is not None:
        pb.chat.CopyFrom(chat_input(request.messages, "messages"))
    if request.prompt is not None:
        if request.messages is not None:
            raise OpenAIError(400, "Send exactly one of 'prompt' and 'messages'.",
                              param="prompt", code="invalid_parameter")
        pb.prompt = request.prompt
    for name in FLAGS:
        if getattr(request, name) is not None:
            setattr(pb, name, getattr(request, name))
    for i, tool in enumerate(request.tools or ()):
        fn = tool.function
        if fn is None:
            raise tool_calls.unsupported_tool(i, tool.type)
        tool_calls.add_tool(pb.tools, i, tool.type, fn.name, fn.description, fn.parameters,
                            fn.strict)
    return pb


class TokenizeHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def _call(self, http_request: Request, method: str, pb):
        stub = self.engine.tokenization_for(pb.model)
        try:
            return await unless_disconnected(http_request, getattr(stub, method)(
                pb, timeout=http_request.app.state.config.engine_deadline_max_s,
                metadata=call_metadata.get()))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def tokenize(self, request: TokenizeRequest, http_request: Request):
        headers = _unused(request, http_request)
        reply = await self._call(http_request, "Tokenize", tokenize_pb(request))
        body = {"count": reply.count, "max_model_len": reply.max_model_len,
                "tokens": list(reply.tokens),
                "token_strs": list(reply.token_strs) if request.return_token_strs else None}
        return JSONResponse(body, headers=headers)

    async def detokenize(self, request: DetokenizeRequest, http_request: Request):
        headers = _unused(request, http_request)
        reply = await self._call(http_request, "Detokenize",
                                 tokenization_service_pb2.DetokenizeRequest(
                                     model=request.model, tokens=request.tokens,
                                     request_id=request_id.get()))
        return JSONResponse({"prompt": reply.prompt}, headers=headers)
