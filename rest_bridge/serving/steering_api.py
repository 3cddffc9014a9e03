"""The management API for steering under /api: one row per route, each a thin
translation of path and JSON body into a SteeringService request and of its
response back into JSON. Every rule lives in the engine; /api needs an admin
key when keys are configured (rest_bridge/access.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from millm.v1 import steering_service_pb2 as pb
from rest_bridge.access import call_metadata
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.base import MAX_BODY_DEPTH, json_depth, query_int, refuse_surrogates
from rest_bridge.routes import read_body
from rest_bridge.serving.disconnect import unless_disconnected

router = APIRouter()


def to_json(message: Message) -> dict:
    """Plain JSON: numbers as numbers (proto JSON writes int64 as strings),
    enums by their short lower-case name, stored documents parsed."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        if not field.is_repeated and field.has_presence and not message.HasField(field.name):
            out[field.name] = None
            continue
        value = getattr(message, field.name)
        if field.name == "document_json":
            out["document"] = json.loads(value) if value else None
        elif field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    if message.DESCRIPTOR.full_name == "millm.v1.SteeringEntry":
        # An entry is of one kind: the other kind's fields would read as values,
        # and a mode's unused fields are left out.
        kind = (("abort_when",) if message.HasField("abort_when") else
                _VECTOR_FIELDS if message.control_vector else _SAE_FIELDS)
        out = {k: v for k, v in out.items() if k in kind and _entry_field_set(message, k, v)}
    elif message.DESCRIPTOR.full_name == "millm.v1.SteeringCondition":
        kind = message.WhichOneof("kind")
        out = {k: v for k, v in out.items() if k == kind or (
            k in ("above", "layer") and message.HasField(k))}
    return out


_MODE_FIELDS = ("mode", "value", "when")


def _entry_field_set(entry: Message, name: str, value) -> bool:
    if name == "mode":
        return bool(entry.mode)
    if name in ("value", "when", "abort_when"):
        return entry.HasField(name)
    return value is not None  # strength and scale are unset outside mode add
_VECTOR_FIELDS = ("control_vector", "scale", *_MODE_FIELDS)
_SAE_FIELDS = ("layer", "feature", "strength", "sae_id", *_MODE_FIELDS)


def _value(field: FieldDescriptor, value):
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        name = field.enum_type.values_by_number[value].name
        prefix = field.enum_type.name
        snake = "".join(f"_{c}" if c.isupper() else c for c in prefix).lstrip("_").upper() + "_"
        return name.removeprefix(snake).lower()
    return value


def _body(raw: bytes) -> dict:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:
        raise OpenAIError(400, f"The body is nested deeper than {MAX_BODY_DEPTH} levels.",
                          code="invalid_json") from None
    except ValueError as exc:
        raise OpenAIError(400, f"The body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The body must be a JSON object.", code="invalid_json")
    if json_depth(body) > MAX_BODY_DEPTH:
        # protobuf's own nesting limit sits well below what json.loads reaches.
        raise OpenAIError(400, f"The body is nested deeper than {MAX_BODY_DEPTH} levels.",
                          code="invalid_json")
    refuse_surrogates(body)
    return body


def _parse(body: dict, message: Message) -> Message:
    try:
        return json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        raise OpenAIError(400, f"Invalid body: {exc}", code="invalid_parameter") from None


# Each builder turns (path parameters, raw body) into the request message.
def _empty(cls):
    return lambda path, raw: cls()


def _path(cls, **fields):
    return lambda path, raw: cls(**{f: path[p] for f, p in fields.items()})


def _features(path, raw, query=None):
    query = query or {}
    request = pb.ListSaeFeaturesRequest(sae_id=path["sae_id"], query=query.get("query", ""))
    for name in ("offset", "limit"):
        value = query_int(query, name)
        if value is not None:
            setattr(request, name, value)
    return request


def _search(path, raw):
    request = _parse(_body(raw), pb.SearchSaeFeaturesRequest())
    request.sae_id = path["sae_id"]
    return request


def _index(path) -> int:
    """The {index} path parameter, read as query_int reads a number."""
    return query_int({"index": path["index"]}, "index")


def _feature_card(path, raw, query=None):
    request = pb.GetSaeFeatureRequest(sae_id=path["sae_id"], index=_index(path))
    top_tokens = query_int(query or {}, "top_tokens")
    if top_tokens is not None:
        request.top_tokens = top_tokens
    return request


def _explanation(path, raw):
    body = _body(raw)
    if set(body) != {"text"}:
        raise OpenAIError(400, "The body must be {\"text\": <string>} (empty removes it).",
                          param="text", code="invalid_parameter")
    request = _parse(body, pb.SetFeatureExplanationRequest())
    request.sae_id, request.index = path["sae_id"], _index(path)
    return request


def _import_explanations(path, raw):
    """The body is the export itself (a JSON array, or an object holding one
    under "explanations"), passed on as text once it is known to be JSON."""
    try:
        value = json.loads(raw)
    except RecursionError:
        value = None
    except ValueError as exc:
        raise OpenAIError(400, f"The body is not valid JSON: {exc}.",
                          code="invalid_json") from None
    if value is None or json_depth(value) > MAX_BODY_DEPTH:
        raise OpenAIError(400, f"The body is nested deeper than {MAX_BODY_DEPTH} levels.",
                          code="invalid_json")
    refuse_surrogates(value)
    return pb.ImportFeatureExplanationsRequest(sae_id=path["sae_id"],
                                               document_json=json.dumps(value))


BUILD_ROUTE_TIMEOUT = 660.0


def _create_vector(path, raw):
    return _parse(_body(raw), pb.CreateControlVectorRequest())


def _set_steering(path, raw):
    body = _body(raw)
    request = _parse({k: v for k, v in body.items() if k != "values"}, pb.SetSteeringRequest())
    if "values" in body:
        _parse({"values": body["values"]}, request)
        request.replace_values = True
    return request


def _clear_values(path, raw):
    return pb.SetSteeringRequest(replace_values=True)


def _create_profile(path, raw):
    return _parse(_body(raw), pb.CreateProfileRequest())


def _update_profile(path, raw):
    body = _body(raw)
    request = _parse({k: v for k, v in body.items() if k != "entries"},
                     pb.UpdateProfileRequest())
    if "entries" in body:
        _parse({"entries": body["entries"]}, request)
        request.replace_entries = True
    request.name = path["name"]
    return request


def _document(cls):
    def build(path, raw):
        _body(raw)  # a JSON object, or a 400 here
        return cls(document_json=raw.decode())
    return build


def _intensity(cls):
    def build(path, raw):
        body = _body(raw)
        if set(body) != {"intensity"}:
            raise OpenAIError(400, "The body must be {\"intensity\": <number>}.",
                              param="intensity", code="invalid_parameter")
        request = _parse(body, cls())
        request.name = path["name"]
        return request
    return build


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    rpc: str
    build: Callable
    service: str = "steering"  # the EngineClient stub the RPC belongs to
    query: bool = False  # build also takes the query string's parameters
    status: int = 200
    timeout: float = 30.0  # seconds the RPC may take


ROUTES = (
    Route("GET", "/api/saes", "ListSaes", _empty(pb.ListSaesRequest)),
    Route("POST", "/api/saes/{sae_id}/attach", "AttachSae",
          _path(pb.AttachSaeRequest, sae_id="sae_id")),
    Route("POST", "/api/saes/{sae_id}/detach", "DetachSae",
          _path(pb.DetachSaeRequest, sae_id="sae_id")),
    Route("GET", "/api/saes/{sae_id}/features", "ListSaeFeatures", _features, query=True),
    Route("POST", "/api/saes/{sae_id}/search", "SearchSaeFeatures", _search),
    Route("GET", "/api/saes/{sae_id}/features/{index}", "GetSaeFeature", _feature_card,
          query=True),
    Route("PUT", "/api/saes/{sae_id}/features/{index}/explanation", "SetFeatureExplanation",
          _explanation),
    Route("POST", "/api/saes/{sae_id}/explanations", "ImportFeatureExplanations",
          _import_explanations),
    Route("GET", "/api/control_vectors", "ListControlVectors",
          _empty(pb.ListControlVectorsRequest)),
    # A build runs in the call (cancelled if the client leaves): its own
    # time limit (timeout_s, at most 600 s) bounds it, not the route's.
    Route("POST", "/api/control_vectors", "CreateControlVector", _create_vector, status=201,
          timeout=BUILD_ROUTE_TIMEOUT),
    Route("GET", "/api/control_vectors/build", "GetControlVectorBuild",
          _empty(pb.GetControlVectorBuildRequest)),
    Route("DELETE", "/api/control_vectors/build", "CancelControlVectorBuild",
          _empty(pb.CancelControlVectorBuildRequest)),
    Route("DELETE", "/api/control_vectors/{vector_id}", "DeleteControlVector",
          _path(pb.DeleteControlVectorRequest, id="vector_id")),
    Route("GET", "/api/steering", "GetSteering", _empty(pb.GetSteeringRequest)),
    Route("PUT", "/api/steering", "SetSteering", _set_steering),
    Route("DELETE", "/api/steering", "SetSteering", _clear_values),
    Route("GET", "/api/profiles", "ListProfiles", _empty(pb.ListProfilesRequest)),
    Route("POST", "/api/profiles", "CreateProfile", _create_profile),
    Route("DELETE", "/api/profiles/active", "ActivateProfile",
          _empty(pb.ActivateProfileRequest)),
    Route("GET", "/api/profiles/{name}", "GetProfile", _path(pb.GetProfileRequest, name="name")),
    Route("PATCH", "/api/profiles/{name}", "UpdateProfile", _update_profile),
    Route("DELETE", "/api/profiles/{name}", "DeleteProfile",
          _path(pb.DeleteProfileRequest, name="name")),
    Route("POST", "/api/profiles/{name}/activate", "ActivateProfile",
          _path(pb.ActivateProfileRequest, name="name")),
    Route("GET", "/api/clusters", "ListClusters", _empty(pb.ListClustersRequest)),
    Route("POST", "/api/clusters", "ImportCluster", _document(pb.ImportClusterRequest)),
    Route("GET", "/api/clusters/{name}", "GetCluster", _path(pb.GetClusterRequest, name="name")),
    Route("PUT", "/api/clusters/{name}/intensity", "SetClusterIntensity",
          _intensity(pb.SetClusterIntensityRequest)),
    Route("DELETE", "/api/clusters/{name}", "DeleteCluster",
          _path(pb.DeleteClusterRequest, name="name")),
    Route("GET", "/api/circuits", "ListCircuits", _empty(pb.ListCircuitsRequest)),
    Route("POST", "/api/circuits", "ImportCircuit", _document(pb.ImportCircuitRequest)),
    Route("GET", "/api/circuits/active", "GetActiveCircuit",
          _empty(pb.GetActiveCircuitRequest)),
    Route("DELETE", "/api/circuits/active", "ActivateCircuit",
          _empty(pb.ActivateCircuitRequest)),
    Route("GET", "/api/circuits/{name}", "GetCircuit", _path(pb.GetCircuitRequest, name="name")),
    Route("POST", "/api/circuits/{name}/activate", "ActivateCircuit",
          _path(pb.ActivateCircuitRequest, name="name")),
    Route("PUT", "/api/circuits/{name}/intensity", "SetCircuitIntensity",
          _intensity(pb.SetCircuitIntensityRequest)),
    Route("DELETE", "/api/circuits/{name}", "DeleteCircuit",
          _path(pb.DeleteCircuitRequest, name="name")),
)


def _endpoint(route: Route):
    async def endpoint(request: Request):
        raw = await read_body(request) if route.method in ("POST", "PUT", "PATCH") else b""
        if route.query:
            message = route.build(request.path_params, raw, dict(request.query_params))
        else:
            message = route.build(request.path_params, raw)
        rpc = getattr(getattr(request.app.state.engine, route.service), route.rpc)
        try:
            reply = await unless_disconnected(
                request, rpc(message, timeout=route.timeout, metadata=call_metadata.get()))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return JSONResponse(to_json(reply), status_code=route.status)

    endpoint.__name__ = f"{route.method.lower()}_{route.rpc}"
    return endpoint


def register(into: APIRouter, routes: tuple[Route, ...]) -> None:
    for route in routes:
        into.add_api_route(route.path, _endpoint(route), methods=[route.method],
                           status_code=route.status)


register(router, ROUTES)
