"""What a web page can make a keyless loopback bridge do (rest_bridge/
browser_guard.py): DNS-rebound Hosts, cross-origin simple requests and
text/plain or form posts are refused; the console's own origin, listed CORS
origins and listed host names are served. Raw HTTP on the session engine,
through bridges of these tests' own where settings differ."""

from __future__ import annotations

import http.client
import json

import pytest

from rest_bridge.browser_guard import HostRule, OriginRule, host_name, is_json
from tests import harness
from tests.conftest import MODEL

CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 2}).encode()
PROFILE = json.dumps({"name": "from-a-web-page", "entries": []}).encode()
EVIL = "http://evil.example"
TOKENIZE = json.dumps({"model": "millm-tiny", "prompt": "a river"}).encode()


def send(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    reply = conn.getresponse()
    out = reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    conn.close()
    return out


def code(content: bytes) -> str:
    return json.loads(content)["error"]["code"]


def profile_names(port: int) -> list[str]:
    status, _, content = send(port, "GET", "/api/profiles")
    assert status == 200
    return [p["name"] for p in json.loads(content)["profiles"]]


@pytest.fixture(scope="module")
def permissive(stack, tmp_path_factory):
    """A bridge on the session engine that lists one web app and one domain."""
    bridge, port = harness.start_bridge(
        tmp_path_factory.mktemp("guard"), stack.grpc_port,
        MILLM_CORS_ORIGINS="http://app.example:3000, https://playground.example",
        MILLM_ALLOWED_HOSTS="millm.internal,.corp.example")
    try:
        harness.wait_http(bridge, f"http://127.0.0.1:{port}/readyz")
        yield port
    finally:
        bridge.stop()


def test_rebound_host_is_refused_everywhere(stack):
    port = stack.http_port
    for method, path, body in (("GET", "/api/profiles", None), ("GET", "/v1/models", None),
                               ("POST", "/v1/chat/completions", CHAT), ("GET", "/metrics", None),
                               ("GET", "/ui/", None), ("GET", "/api/capabilities", None),
                               ("POST", "/tokenize", TOKENIZE)):
        status, headers, content = send(port, method, path, body, {
            "Host": f"evil.example:{port}", "Content-Type": "application/json"})
        assert (status, code(content)) == (403, "host_not_allowed"), path
        assert "access-control-allow-origin" not in headers
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST",
                 f"app.localhost:{port}"):
        status, _, _ = send(port, "GET", "/v1/models", headers={"Host": host})
        assert status == 200, host


def test_simple_cross_origin_posts_are_refused_and_change_nothing(stack):
    port = stack.http_port
    before = profile_names(port)
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):
        status, headers, content = send(port, "POST", "/api/profiles", PROFILE,
                                        {"Origin": EVIL, "Content-Type": content_type})
        assert (status, code(content)) == (403, "origin_not_allowed")
        assert "access-control-allow-origin" not in headers
    status, _, content = send(port, "POST", "/v1/chat/completions", CHAT,
                              {"Origin": EVIL, "Content-Type": "text/plain"})
    assert (status, code(content)) == (403, "origin_not_allowed")
    # Even a JSON body from a foreign page (it would need a preflight, but a
    # page's own server may send one) is refused by its Origin alone.
    status, _, content = send(port, "POST", "/v1/chat/completions", CHAT,
                              {"Origin": EVIL, "Content-Type": "application/json"})
    assert (status, code(content)) == (403, "origin_not_allowed")
    for path in ("/tokenize", "/detokenize"):
        status, _, content = send(port, "POST", path, TOKENIZE,
                                  {"Origin": EVIL, "Content-Type": "text/plain"})
        assert (status, code(content)) == (403, "origin_not_allowed"), path
    assert profile_names(port) == before


def test_json_is_required_on_body_routes(stack):
    port = stack.http_port
    for headers in ({"Content-Type": "text/plain"},
                    {"Content-Type": "application/x-www-form-urlencoded"}, {}):
        status, _, content = send(port, "POST", "/v1/chat/completions", CHAT, headers)
        assert (status, code(content)) == (415, "unsupported_media_type"), headers
        status, _, content = send(port, "POST", "/api/profiles", PROFILE, headers)
        assert (status, code(content)) == (415, "unsupported_media_type"), headers
        status, _, content = send(port, "POST", "/tokenize", TOKENIZE, headers)
        assert (status, code(content)) == (415, "unsupported_media_type"), headers
    for content_type in ("application/json", "application/json; charset=utf-8",
                         "Application/JSON"):
        status, _, content = send(port, "POST", "/v1/chat/completions", CHAT,
                                  {"Content-Type": content_type})
        assert status == 200, content
        assert json.loads(content)["object"] == "chat.completion"
    # An endpoint miLLM does not serve still says so, whatever its body.
    status, _, content = send(port, "POST", "/v1/audio/transcriptions", b"--x--",
                              {"Content-Type": "multipart/form-data; boundary=x"})
    assert status == 404 and "not served" in json.loads(content)["error"]["message"]


def test_the_console_origin_is_its_own(stack):
    port = stack.http_port
    status, headers, content = send(port, "POST", "/v1/chat/completions", CHAT, {
        "Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"})
    assert status == 200 and json.loads(content)["choices"][0]["message"]["role"] == "assistant"
    assert "access-control-allow-origin" not in headers  # same origin needs no CORS
    status, _, _ = send(port, "GET", "/ui/", headers={"Origin": f"http://127.0.0.1:{port}"})
    assert status == 200


def test_preflights(stack, permissive):
    refused = {"Origin": EVIL, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type, authorization"}
    for port in (stack.http_port, permissive):
        status, headers, content = send(port, "OPTIONS", "/v1/chat/completions",
                                        headers=refused)
        assert (status, code(content)) == (403, "origin_not_allowed")
        assert "access-control-allow-origin" not in headers
    status, _, content = send(stack.http_port, "OPTIONS", "/v1/models")
    assert (status, code(content)) == (405, "method_not_allowed")
    granted = {**refused, "Origin": "http://app.example:3000"}
    status, headers, content = send(permissive, "OPTIONS", "/v1/chat/completions",
                                    headers=granted)
    assert status == 204 and content == b""
    assert headers["access-control-allow-origin"] == "http://app.example:3000"
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "content-type, authorization"


def test_listed_origins_and_hosts_are_served(permissive):
    for origin in ("http://app.example:3000", "https://playground.example"):
        status, headers, content = send(permissive, "POST", "/v1/chat/completions", CHAT, {
            "Origin": origin, "Content-Type": "application/json"})
        assert status == 200, content
        assert headers["access-control-allow-origin"] == origin
        assert "x-request-id" in headers["access-control-expose-headers"]
    # A listed origin is still held to JSON.
    status, _, content = send(permissive, "POST", "/v1/chat/completions", CHAT, {
        "Origin": "http://app.example:3000", "Content-Type": "text/plain"})
    assert (status, code(content)) == (415, "unsupported_media_type")
    # An origin differing only by port is another origin.
    status, _, _ = send(permissive, "GET", "/v1/models",
                        headers={"Origin": "http://app.example:3001"})
    assert status == 403
    for host, want in (("millm.internal:8000", 200), ("api.corp.example", 200),
                       ("corp.example", 403), ("millm.internal.evil.example", 403),
                       ("evil.example", 403)):
        status, _, _ = send(permissive, "GET", "/v1/models", headers={"Host": host})
        assert status == want, host


def test_rules_unit():
    assert host_name("Example.COM:8000") == "example.com"
    assert host_name("[::1]:8000") == "::1" and host_name("::1") == "::1"
    assert host_name("localhost.") == "localhost"
    loopback = HostRule("127.0.0.1", "")
    assert loopback.allows("127.0.0.2:8000") and not loopback.allows("10.0.0.5:8000")
    assert not loopback.allows("evil.example") and loopback.allows(None)
    wildcard = HostRule("0.0.0.0", "")
    assert wildcard.allows("10.0.0.5:8000") and not wildcard.allows("evil.example:8000")
    assert HostRule("127.0.0.1", "*").allows("evil.example")
    assert HostRule("10.1.2.3", "").allows("10.1.2.3:80")
    assert OriginRule("*").cross_origin_allowed("http://anything.example")
    assert not OriginRule("").cross_origin_allowed("null")
    assert is_json("application/vnd.api+json") and not is_json("text/json")
