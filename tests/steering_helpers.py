"""What the steering tests share: their own engine and bridge (SteerStack, on
an SAE dir of theirs), the reset each test starts from, and small helpers
(a greedy chat, writing a profile, a circuit document, an error's body).

Why a module of its own: SAE steering's end-to-end tests are split by topic
(test_steering.py, test_steering_management.py, test_steering_readout.py) but
run against one stack. conftest.py's session-scoped `steer` fixture builds it
from steer_stack() here, so the three files share one engine, as they did
when they were one file; each file's `clean` fixture calls reset().
"""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable

import openai
import torch

from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import Reply, call

L1 = "sae_millm-tiny-res-l1"  # standard, layer 1, 256 features
L0 = "sae_millm-tiny-res-l0"  # jumprelu, layer 0, 128 features
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


class SteerStack(harness.OwnStack):
    """An engine and bridge of the steering tests' own, on an SAE dir of theirs."""

    def __init__(self, tmp: pathlib.Path, saes_dir: pathlib.Path):
        vectors_dir = tmp / "control_vectors"
        vectors_dir.mkdir(exist_ok=True)
        super().__init__(tmp, MILLM_SAES_DIR=str(saes_dir),
                         MILLM_CONTROL_VECTORS_DIR=str(vectors_dir))
        self.saes_dir = saes_dir
        self.vectors_dir = vectors_dir  # test_control_vectors.py writes its files here

    def api(self, method: str, path: str, body=None, raw: bytes | None = None) -> Reply:
        return call(self.http_port, method, path, body, raw)

    def ok(self, method: str, path: str, body=None) -> dict:
        reply = self.api(method, path, body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0,
                             timeout=60)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused",
                                  max_retries=0, timeout=60)


def _write_sae(directory: pathlib.Path, d_in: int, layer: int, d_sae: int = 16) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d_in, "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_post"}))
    save_file({"W_enc": torch.zeros(d_in, d_sae), "W_dec": torch.zeros(d_sae, d_in),
               "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)},
              str(directory / "sae_weights.safetensors"))


def steer_stack(tmp: pathlib.Path) -> SteerStack:
    """The demo SAEs plus three that do not fit (the wrong width, a layer
    past the last, a broken cfg.json), served by a stack of their own."""
    saes_dir = tmp / "saes"
    shutil.copytree(harness.models_dir() / "saes", saes_dir)
    _write_sae(saes_dir / "wrong-width", d_in=32, layer=1)
    _write_sae(saes_dir / "past-last-layer", d_in=64, layer=5)
    (saes_dir / "broken").mkdir()
    (saes_dir / "broken" / "cfg.json").write_text('{"d_in": 64}')
    return SteerStack(tmp, saes_dir)


def reset(steer: SteerStack) -> None:
    """No steering at all, with the layer-1 SAE attached."""
    steer.ok("DELETE", "/api/steering")
    steer.ok("PUT", "/api/steering", {"enabled": True})
    steer.ok("DELETE", "/api/profiles/active")
    for circuit in steer.ok("GET", "/api/circuits")["circuits"]:
        steer.ok("DELETE", f"/api/circuits/{circuit['name']}")
    for cluster in steer.ok("GET", "/api/clusters")["clusters"]:
        steer.ok("DELETE", f"/api/clusters/{cluster['name']}")
    for profile in steer.ok("GET", "/api/profiles")["profiles"]:
        steer.ok("DELETE", f"/api/profiles/{profile['name']}")
    for sae in steer.ok("GET", "/api/saes")["saes"]:
        if sae["attached"] and sae["id"] != L1:
            steer.ok("POST", f"/api/saes/{sae['id']}/detach")
    steer.ok("POST", f"/api/saes/{L1}/attach")


def chat(stack: SteerStack, **extra):
    """A greedy chat completion; returns (text, headers)."""
    body = {"temperature": 0, "max_tokens": 24, "seed": 7, **extra}
    raw = stack.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, **{k: body.pop(k) for k in ("temperature", "max_tokens",
                                                                   "seed")}, extra_body=body)
    return raw.parse().choices[0].message.content, raw.headers


def profile(stack: SteerStack, name: str, *entries: tuple[int, int, float]) -> None:
    stack.ok("POST", "/api/profiles", {"name": name, "entries": [
        {"layer": layer, "feature": feature, "strength": strength}
        for layer, feature, strength in entries]})


def first_feature_that_changes(d_sae: int, plain: str, steered: Callable[[int], str],
                               skip: tuple[int, ...] = ()) -> int:
    """The lowest-numbered of `d_sae` features whose `steered` text (the
    greedy answer under a profile of that feature alone) is not `plain`.

    A test that must see steering take effect steers with it: a trained SAE
    has features that this tiny model's greedy text ignores at a given
    strength, and which ones changes with every rebuild of the demo model, so
    the tests ask the model rather than name one. If steering has no effect
    at all, no feature qualifies and the calling test fails here."""
    for feature in range(d_sae):
        if feature not in skip and steered(feature) != plain:
            return feature
    raise AssertionError(f"no feature changes the greedy text {plain!r}")


def feature_that_changes_the_text(port: int, strength: float, layer: int = 1,
                                  messages: list[dict] = MESSAGES, skip: tuple[int, ...] = (),
                                  unlike: tuple[int, ...] = ()) -> int:
    """first_feature_that_changes for the SAE attached at `layer`, through
    the bridge on `port`: steering at `strength` changes the first eight
    tokens of the greedy answer to `messages`, and makes them differ from
    what each feature in `unlike` makes of them."""
    attached = [s for s in call(port, "GET", "/api/saes").json()["saes"]
                if s["attached"] and s["layer"] == layer]
    assert attached, f"no SAE attached at layer {layer}"

    def text(**extra) -> str:
        reply = call(port, "POST", "/v1/chat/completions", {
            "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8, **extra})
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    def steered(feature: int) -> str:
        name = f"changes-the-text-{feature}"
        written = call(port, "POST", "/api/profiles", {"name": name, "entries": [
            {"layer": layer, "feature": feature, "strength": strength}]})
        assert written.status_code == 200, written.text
        try:
            return text(profile=name)
        finally:
            call(port, "DELETE", f"/api/profiles/{name}")

    plain = text()
    others = {steered(feature) for feature in unlike}

    def distinct(feature: int) -> str:
        changed = steered(feature)
        return plain if changed in others else changed

    return first_feature_that_changes(attached[0]["d_sae"], plain, distinct, skip + unlike)


def circuit_document(name: str, rung: int, **extra) -> dict:
    return {"format": "millm.circuit.v1", "name": name, "rung": rung, "members": [
        {"layer": 0, "feature": 5, "strength": 6.0}, {"layer": 1, "feature": 3, "strength": 8.0}],
        **extra}


def error(reply: Reply) -> dict:
    return reply.json()["error"]
