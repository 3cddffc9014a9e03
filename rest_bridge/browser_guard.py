"""What a web page the user happens to open may ask of this server: nothing,
unless the operator says so.

A bridge on loopback with no keys trusts whoever can connect, and every
browser on the machine can connect. Three checks close what a page could do:

- **Host.** DNS rebinding points a page's own name at 127.0.0.1, after which
  the browser treats the bridge as that page's origin and lets it read every
  answer. Such a request still names the page's host in `Host`, so only
  loopback names, the address the bridge listens on (any address literal when
  it listens on a wildcard: a literal is never a rebinding name) and the names
  in MILLM_ALLOWED_HOSTS are served (403 `host_not_allowed`). `*` turns the
  check off.
- **Origin.** A page may send "simple" cross-origin requests without asking
  first; browsers mark them with `Origin`. A request whose Origin is neither
  this server itself (the console at /ui) nor listed in MILLM_CORS_ORIGINS is
  refused (403 `origin_not_allowed`). Listed origins, and only those, get
  CORS headers and a granted preflight, so a browser app can be allowed on
  purpose.
- **Content type.** A POST, PUT or PATCH to a served route must say
  `Content-Type: application/json` (415 `unsupported_media_type`), which is
  what ends `text/plain` and form posts, the two a page can send unasked.
  The one exception is the upload of POST /v1/files, which OpenAI's API
  (and its SDK) sends as `multipart/form-data`: a browser marks a
  cross-origin form post with `Origin`, which the rule above refuses.

Every OPTIONS request is answered here, granted or not, so no route ever runs
for one (which is why the access middleware lets OPTIONS pass without a key).
The gRPC port is not a browser target: browsers cannot speak HTTP/2 gRPC.
"""

from __future__ import annotations

import ipaddress

from starlette.responses import Response
from starlette.routing import Match

from rest_bridge.errors import OpenAIError

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MULTIPART_PATHS = frozenset({"/v1/files"})  # OpenAI's upload is a form
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
# Headers a permitted browser app may read from an answer.
EXPOSED = b"x-request-id, retry-after, x-millm-steering-intensity, x-ratelimit-limit-requests, " \
          b"x-ratelimit-remaining-requests"
PREFLIGHT_MAX_AGE = "600"


def _split_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in value.split(",") if part.strip())


def host_name(host_header: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _ip(name: str):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class HostRule:
    """Which Host names this bridge answers to."""

    def __init__(self, listen_host: str, allowed: str):
        entries = _split_list(allowed)
        self.off = "*" in entries
        self.names = frozenset(e for e in entries if not e.startswith(("*.", ".")))
        self.suffixes = tuple("." + e.lstrip("*.") for e in entries if e.startswith(("*.", ".")))
        listen = listen_host.strip("[]").lower()
        self.any_literal = listen in WILDCARDS
        self.listen_ip = _ip(listen)

    def allows(self, host_header: str | None) -> bool:
        if self.off or host_header is None:
            return True  # HTTP/1.0 without Host: no browser sends that
        name = host_name(host_header)
        if name == "localhost" or name.endswith(".localhost"):
            return True  # browsers resolve these to loopback themselves
        ip = _ip(name)
        if ip is not None:
            return ip.is_loopback or self.any_literal or ip == self.listen_ip
        return name in self.names or name.endswith(self.suffixes)


class OriginRule:
    """Which browser origins may call this bridge."""

    def __init__(self, cors_origins: str):
        entries = tuple(e.rstrip("/") for e in _split_list(cors_origins))
        self.any = "*" in entries
        self.listed = frozenset(entries)

    def cross_origin_allowed(self, origin: str) -> bool:
        return self.any or origin in self.listed


def same_origin(origin: str, host_header: str | None) -> bool:
    if host_header is None or "://" not in origin:
        return False
    return origin.split("://", 1)[1] == host_header.strip().lower()


def _header(headers: list, name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


class BrowserGuard:
    """Pure ASGI: refuses by Host, Origin and content type, answers every
    OPTIONS, and adds CORS headers for the origins the operator listed."""

    def __init__(self, app, hosts: HostRule, origins: OriginRule, routes):
        self.app, self.hosts, self.origins, self.routes = app, hosts, origins, routes

    def _routed(self, scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in self.routes)

    def _refusal(self, scope, headers, host, origin) -> OpenAIError | None:
        if not self.hosts.allows(host):
            return OpenAIError(403, f"Host '{host_name(host)[:253]}' is not served here: add it "
                               "to MILLM_ALLOWED_HOSTS to allow it.", type="permission_error",
                               code="host_not_allowed")
        if origin is not None and not self._origin_allowed(origin, host):
            return OpenAIError(403, f"Requests from the web origin '{origin[:253]}' are not "
                               "allowed: list it in MILLM_CORS_ORIGINS to allow it.",
                               type="permission_error", code="origin_not_allowed")
        if scope["method"] in BODY_METHODS:
            content_type = _header(headers, b"content-type")
            has_body = (_header(headers, b"transfer-encoding") is not None
                        or (_header(headers, b"content-length") or "0").strip() not in ("", "0"))
            wrong = (not is_json(content_type)) if content_type is not None else has_body
            if wrong and scope["path"] in MULTIPART_PATHS and content_type is not None:
                wrong = not content_type.lower().startswith("multipart/form-data")
            if wrong and self._routed(scope):
                return OpenAIError(415, "The request body must be JSON, sent with "
                                   "'Content-Type: application/json' (an upload to /v1/files: "
                                   "multipart/form-data).",
                                   code="unsupported_media_type")
        return None

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        return same_origin(origin, host) or self.origins.cross_origin_allowed(origin)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        host, origin = _header(headers, b"host"), _header(headers, b"origin")
        refusal = self._refusal(scope, headers, host, origin)
        if refusal is None and scope["method"] == "OPTIONS":
            refusal = self._preflight(headers, origin)
        if isinstance(refusal, Response):
            await refusal(scope, receive, send)
            return
        if refusal is not None:
            scope.setdefault("state", {})["error_code"] = refusal.code
            await refusal.response()(scope, receive, send)
            return
        if origin is None or same_origin(origin.strip().lower().rstrip("/"), host):
            await self.app(scope, receive, send)
            return
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-expose-headers", EXPOSED), (b"vary", b"Origin")]

        async def with_cors(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *cors]
            await send(message)

        await self.app(scope, receive, with_cors)

    @staticmethod
    def _preflight(headers, origin: str | None) -> OpenAIError | Response:
        """OPTIONS that passed the checks: granted (204 with CORS headers) when
        it is a preflight, refused otherwise; either way no route runs."""
        method = _header(headers, b"access-control-request-method")
        if origin is None or method is None:
            return OpenAIError(405, "OPTIONS is only answered as a CORS preflight.",
                               code="method_not_allowed")
        asked = _header(headers, b"access-control-request-headers") or ""
        granted = ", ".join(_split_list(asked)[:64]) or "content-type"
        return Response(status_code=204, headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, PUT, PATCH, DELETE",
            "Access-Control-Allow-Headers": granted[:4096],
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            "Vary": "Origin",
        })
