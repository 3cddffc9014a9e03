"""llama.cpp control vectors as steering entries, end to end: a file written
the way cvector-generator writes it (the `gguf` package's GGUFWriter,
architecture `controlvector`) is dropped in the control-vector directory,
listed, and used in profiles, clusters and the live values, dialed like any
entry, with or without an SAE attached. A vector equal to an SAE feature's
W_dec row times its strength steers exactly as that feature does.

The generation tests take the model id as a parameter (MODELS): the
transformers checkpoint and its F32 GGUF export each apply the plan, and
the last test holds the two engines' vector-steered answers equal.
"""

from __future__ import annotations

import functools
import pathlib

import grpc
import numpy as np
import pytest

from millm.v1 import steering_pb2, steering_service_pb2
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import error_info
from tests.http_helpers import call
from tests.steering_helpers import L1, MESSAGES, SteerStack, error, feature_that_changes_the_text

F32 = "millm-tiny-gguf:F32"
MODELS = [MODEL, F32]
STRENGTH = 8.0
HIDDEN, LAYERS = 64, 2  # millm-tiny's residual width and block count


def write_control_vector(path: pathlib.Path, directions: dict[int, np.ndarray],
                         model_hint: str = "llama") -> pathlib.Path:
    """A control-vector file as llama.cpp's cvector-generator writes it:
    direction.<il> is added after block il."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", model_hint)
    writer.add_int32("controlvector.layer_count", len(directions))
    for layer, direction in sorted(directions.items()):
        writer.add_tensor(f"direction.{layer}", np.asarray(direction, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def w_dec_row(feature: int) -> np.ndarray:
    from safetensors.numpy import load_file

    weights = load_file(str(harness.models_dir() / "saes" / "millm-tiny-res-l1" /
                            "sae_weights.safetensors"))
    return weights["W_dec"][feature].astype(np.float32)


@functools.cache
def _feature(port: int) -> int:
    return feature_that_changes_the_text(port, STRENGTH)


def feature_vector(stack: SteerStack, name: str) -> tuple[int, str]:
    """An L1 feature that changes the greedy text, and a control vector
    `cv_<name>` at layer 1 equal to its W_dec row times STRENGTH."""
    feature = _feature(stack.http_port)
    path = stack.vectors_dir / f"{name}.gguf"
    if not path.exists():
        write_control_vector(path, {1: w_dec_row(feature) * np.float32(STRENGTH)})
    return feature, f"cv_{name}"


def answer(stack: SteerStack, model: str, **extra) -> tuple[str, dict]:
    """The greedy answer's text and the response headers."""
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": 16, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"], reply.headers


def activations(stack: SteerStack, model: str, **extra) -> list[dict]:
    """The layer-1 SAE's strongest features at every position of a steered
    greedy answer, read after the steering delta: the numbers steering made."""
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": 8,
        "return_sae_activations": {"sae_id": L1, "positions": "all", "top_k": 8}, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()["millm"]["sae_activations"]["positions"]


def close(a: list[dict], b: list[dict], rtol: float, atol: float = 1e-3) -> bool:
    """Same positions and tokens; each feature both read agrees within
    rtol (and atol)."""
    if [(p["position"], p["token_id"]) for p in a] != [(p["position"], p["token_id"]) for p in b]:
        return False
    for pa, pb in zip(a, b, strict=True):
        want = {f["index"]: f["value"] for f in pb["features"]}
        for f in pa["features"]:
            if f["index"] in want and not np.isclose(f["value"], want[f["index"]], rtol=rtol,
                                                     atol=atol):
                return False
    return True


def vector_profile(stack: SteerStack, name: str, vector: str, scale: float) -> None:
    stack.ok("POST", "/api/profiles", {"name": name, "entries": [
        {"control_vector": vector, "scale": scale}]})


# -- the files -------------------------------------------------------------------------------------


def test_a_written_file_is_listed_over_rest_and_grpc(clean):
    write_control_vector(clean.vectors_dir / "listed.gguf",
                         {1: np.linspace(-1, 1, HIDDEN, dtype=np.float32)}, "millm")
    listed = {v["id"]: v for v in clean.ok("GET", "/api/control_vectors")["control_vectors"]}
    size = (clean.vectors_dir / "listed.gguf").stat().st_size
    assert listed["cv_listed"] == {
        "id": "cv_listed", "file": "listed.gguf", "n_embd": HIDDEN, "layers": [1],
        "model_hint": "millm", "layer_count": 1, "size_bytes": size, "mismatch": ""}
    with grpc.insecure_channel(clean.grpc_target) as channel:
        reply = steering_grpc.SteeringServiceStub(channel).ListControlVectors(
            steering_service_pb2.ListControlVectorsRequest())
    assert "cv_listed" in [v.id for v in reply.control_vectors]
    # A vector entry written over gRPC reads back as one, over gRPC and REST.
    with grpc.insecure_channel(clean.grpc_target) as channel:
        stub = steering_grpc.SteeringServiceStub(channel)
        stub.CreateProfile(steering_service_pb2.CreateProfileRequest(name="g", entries=[
            steering_pb2.SteeringEntry(control_vector="cv_listed", scale=-0.25)]))
        entry = stub.GetProfile(steering_service_pb2.GetProfileRequest(name="g")).profile.entries[0]
    assert (entry.control_vector, entry.scale, entry.HasField("strength"), entry.layer) == (
        "cv_listed", -0.25, False, 0)
    assert clean.ok("GET", "/api/profiles/g")["profile"]["entries"] == [
        {"control_vector": "cv_listed", "scale": -0.25}]


def test_control_vector_files_are_not_models(tmp_path):
    """At their default place, <models dir>/control_vectors, or anywhere in
    the models dir, the model registry leaves them out."""
    import shutil

    from service.models.registry import ModelRegistry

    (tmp_path / "control_vectors").mkdir()
    write_control_vector(tmp_path / "control_vectors" / "a.gguf", {1: np.ones(HIDDEN)})
    write_control_vector(tmp_path / "b.gguf", {1: np.ones(HIDDEN)})
    assert ModelRegistry(tmp_path).scan() == []
    shutil.copy(harness.gguf_file("millm-tiny-gguf:F32"), tmp_path / "control_vectors")
    assert [e.engine for e in ModelRegistry(tmp_path).scan()] == ["gguf"]


def test_files_llama_cpp_would_refuse_are_listed_as_broken(clean):
    d = clean.vectors_dir
    write_control_vector(d / "non-finite.gguf",
                         {1: np.array([np.nan] + [0.0] * (HIDDEN - 1), dtype=np.float32)})
    write_control_vector(d / "layer-zero.gguf", {0: np.ones(HIDDEN, np.float32)})
    (d / "not-gguf.gguf").write_bytes(b"GGUF but not really")
    with open(d / "huge.gguf", "wb") as f:  # over the size limit: never read
        f.truncate((16 << 20) + 1)
    broken = {b["id"]: b["problem"] for b in clean.ok("GET", "/api/control_vectors")["broken"]}
    assert "non-finite" in broken["cv_non-finite"]
    assert "direction.0" in broken["cv_layer-zero"]
    assert "GGUF" in broken["cv_not-gguf"]
    assert "bytes" in broken["cv_huge"]
    reply = clean.api("POST", "/api/profiles", {"name": "nan", "entries": [
        {"control_vector": "cv_non-finite", "scale": 1.0}]})
    assert reply.status_code == 400, reply.text
    assert error(reply)["code"] == "invalid_control_vector"
    assert error(reply)["param"] == "entries[0].control_vector"


def test_vectors_that_do_not_fit_the_model_or_do_not_exist_are_refused_by_field(clean):
    d = clean.vectors_dir
    write_control_vector(d / "narrow.gguf", {1: np.ones(32, np.float32)})
    write_control_vector(d / "deep.gguf", {1: np.ones(HIDDEN, np.float32),
                                           5: np.ones(HIDDEN, np.float32)})
    listed = {v["id"]: v for v in clean.ok("GET", "/api/control_vectors")["control_vectors"]}
    assert "64 dimensions" in listed["cv_narrow"]["mismatch"]
    assert "direction.5" in listed["cv_deep"]["mismatch"]
    good = {"layer": 1, "feature": 3, "strength": 2.0}
    for where, path, body, key in (
            ("entries", "/api/profiles", {"name": "p"}, "entries"),
            ("values", "/api/steering", {}, "values"),
            ("members", "/api/clusters", {"name": "c"}, "members")):
        method = "PUT" if where == "values" else "POST"
        for vector, code, status in (("cv_narrow", "control_vector_mismatch", 400),
                                     ("cv_deep", "control_vector_mismatch", 400),
                                     ("cv_nowhere", "control_vector_not_found", 404)):
            reply = clean.api(method, path, {**body, key: [
                good, {"control_vector": vector, "scale": 1.0}]})
            assert reply.status_code == status, reply.text
            assert error(reply)["code"] == code
            assert error(reply)["param"] == f"{where}[1].control_vector"
    # The shape of an entry: one kind or the other, a scale required.
    for entry, param in (({"control_vector": "cv_narrow", "scale": 1.0, "layer": 1},
                          "entries[0].layer"),
                         ({"control_vector": "cv_narrow"}, "entries[0].scale"),
                         ({"control_vector": "cv_narrow", "scale": 1e9}, "entries[0].scale")):
        reply = clean.api("POST", "/api/profiles", {"name": "p", "entries": [entry]})
        assert reply.status_code == 400 and error(reply)["param"] == param, reply.text
    # gRPC answers alike.
    with grpc.insecure_channel(clean.grpc_target) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        steering_grpc.SteeringServiceStub(channel).CreateProfile(
            steering_service_pb2.CreateProfileRequest(name="p", entries=[
                steering_pb2.SteeringEntry(control_vector="cv_nowhere", scale=1.0)]))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(caught.value)
    assert info.reason == "control_vector_not_found"
    assert info.metadata["param"] == "entries[0].control_vector"


# -- steering with them ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_a_vector_profile_steers_and_scale_zero_does_not(clean, model):
    _, vector = feature_vector(clean, "feature")
    plain, _ = answer(clean, model)
    vector_profile(clean, "v", vector, 1.0)
    vector_profile(clean, "v0", vector, 0.0)
    steered, _ = answer(clean, model, profile="v")
    assert steered != plain
    assert answer(clean, model, profile="v0")[0] == plain
    off, headers = answer(clean, model, profile="v", steering_intensity=0)
    assert off == plain and headers["x-millm-steering-intensity"] == "0.0"
    # The stored entry reads back as a vector entry, nothing else.
    assert clean.ok("GET", "/api/profiles/v")["profile"]["entries"] == [
        {"control_vector": vector, "scale": 1.0}]


@pytest.mark.parametrize("model", MODELS)
def test_a_vector_equal_to_a_features_direction_steers_exactly_as_the_feature(clean, model):
    feature, vector = feature_vector(clean, "feature")
    clean.ok("POST", "/api/profiles", {"name": "sae", "entries": [
        {"layer": 1, "feature": feature, "strength": STRENGTH}]})
    vector_profile(clean, "vec", vector, 1.0)
    by_sae, _ = answer(clean, model, profile="sae")
    assert answer(clean, model, profile="vec")[0] == by_sae
    # The same float32 vector, added at the same place (the plans are equal
    # byte for byte: test_a_features_vector_makes_the_same_plan_as_the_feature):
    # the same numbers on transformers; on GGUF, but for llama.cpp's run-to-run
    # rounding, which its f16 K/V cache can turn into a half-ULP (4.9e-4
    # relative) of a cached value when a prefix is reused (3.5e-4 absolute
    # measured on one of three builds).
    by_sae_read = activations(clean, model, profile="sae")
    tolerance = (1e-3, 1e-3) if model.startswith("millm-tiny-gguf") else (1e-6, 1e-5)
    assert close(activations(clean, model, profile="vec"), by_sae_read, *tolerance)
    assert not close(by_sae_read, activations(clean, model), 1e-2)
    # The dial scales a vector's scale as it scales a strength.
    half_sae, h1 = answer(clean, model, profile="sae", steering_intensity=0.5)
    half_vec, h2 = answer(clean, model, profile="vec", steering_intensity=0.5)
    assert half_vec == half_sae
    assert h1["x-millm-steering-intensity"] == h2["x-millm-steering-intensity"] == "0.5"
    # λ·(s·w) and (λ·s)·w round differently in the last bit, no more.
    assert close(activations(clean, model, profile="vec", steering_intensity=0.5),
                 activations(clean, model, profile="sae", steering_intensity=0.5), 1e-5, 1e-5)
    # A vector needs no SAE: detached, the feature no longer steers and the vector still does.
    clean.ok("POST", f"/api/saes/{L1}/detach")
    assert answer(clean, model, profile="vec")[0] == by_sae
    assert answer(clean, model, profile="sae")[0] == answer(clean, model)[0]


@pytest.mark.parametrize("model", MODELS)
def test_vectors_in_live_values_and_clusters_follow_the_dial(clean, model):
    feature, vector = feature_vector(clean, "feature")
    plain, _ = answer(clean, model)
    steered, _ = answer(clean, model, profile=_sae_profile(clean, feature))
    # Live values: with no SAE attached they steer every plain request.
    clean.ok("POST", f"/api/saes/{L1}/detach")
    written = clean.ok("PUT", "/api/steering", {"values": [
        {"control_vector": vector, "scale": 1.0}]})
    assert written["liveness"]["live"] is True
    assert written["steering"]["values"] == [{"control_vector": vector, "scale": 1.0}]
    assert answer(clean, model)[0] == steered
    assert answer(clean, model, steering_intensity="off")[0] == plain
    clean.ok("DELETE", "/api/steering")
    assert answer(clean, model)[0] == plain
    # A cluster mixing a vector and a feature: the cluster's dial scales both.
    clean.ok("POST", f"/api/saes/{L1}/attach")
    clean.ok("POST", "/api/clusters", {"name": "mixed", "intensity": 1.0, "members": [
        {"control_vector": vector, "scale": 0.5},
        {"layer": 1, "feature": feature, "strength": STRENGTH / 2}]})
    assert answer(clean, model, profile="mixed")[0] == steered
    assert answer(clean, model, profile="mixed", steering_intensity=0)[0] == plain
    cluster = clean.ok("GET", "/api/clusters/mixed")["cluster"]
    assert cluster["members"][0] == {"control_vector": vector, "scale": 0.5}
    assert cluster["document"]["members"][0] == {"control_vector": vector, "scale": 0.5}


def test_both_engines_give_the_same_vector_steered_answer(clean):
    _, vector = feature_vector(clean, "feature")
    vector_profile(clean, "v", vector, 1.0)
    for extra in ({"profile": "v"}, {"profile": "v", "steering_intensity": 0.5}):
        assert answer(clean, F32, **extra)[0] == answer(clean, MODEL, **extra)[0], extra
        # llama.cpp keeps K and V in f16; the rest is the same float32 arithmetic.
        assert close(activations(clean, F32, **extra), activations(clean, MODEL, **extra),
                     1e-3), extra
    assert answer(clean, F32, profile="v")[0] != answer(clean, F32)[0]


def _sae_profile(stack: SteerStack, feature: int) -> str:
    stack.ok("POST", "/api/profiles", {"name": "by-feature", "entries": [
        {"layer": 1, "feature": feature, "strength": STRENGTH}]})
    return "by-feature"


# -- the manager: the plan a vector makes ---------------------------------------------------------


class _Runtime:
    """What SteeringManager.bind reads of an engine."""

    def __init__(self, hidden: int, layers: int):
        import torch

        self.steering = self
        self.hidden_size, self.num_layers = hidden, layers
        self.device, self.dtype = torch.device("cpu"), torch.float32


def test_a_features_vector_makes_the_same_plan_as_the_feature(tmp_path):
    import asyncio

    from service.steering.documents import parse_entries
    from service.steering.manager import SteeringManager
    from service.steering.store import SteeringStore

    feature = 5
    write_control_vector(tmp_path / "f.gguf", {1: w_dec_row(feature) * np.float32(STRENGTH)})

    async def run() -> None:
        manager = SteeringManager(SteeringStore(tmp_path / "s.sqlite3"),
                                  harness.models_dir() / "saes", vectors_dir=tmp_path)
        await manager.bind(_Runtime(HIDDEN, LAYERS))
        await manager.attach(L1)
        by_feature = parse_entries([{"layer": 1, "feature": feature, "strength": STRENGTH}], "e")
        by_vector = parse_entries([{"control_vector": "cv_f", "scale": 1.0}], "e")
        for level in (1.0, 0.5, 2.0):
            a, b = manager._plan(by_feature, level, "e"), manager._plan(by_vector, level, "e")
            assert [s.layer for s in a.layers] == [s.layer for s in b.layers] == [1]
            assert np.allclose(a.vectors()[1], b.vectors()[1], rtol=1e-6, atol=0)
            if level == 1.0:
                assert a.key == b.key  # byte for byte: any engine computes the same
        # Both at once add up, on the SAE's layer entry.
        both = manager._plan(by_feature + by_vector, 1.0, "e").layers[0]
        assert (both.sae_id, both.features) == (L1, (feature,))
        assert np.array_equal(both.vector, 2 * manager._plan(by_feature, 1.0, "e").vectors()[1])
        manager.store.close()

    asyncio.run(run())


# -- the manager, with a model the stored vectors do not fit ---------------------------------------


def test_stored_vectors_that_do_not_fit_a_newly_bound_model_steer_nothing(tmp_path):
    import asyncio

    from service.steering.manager import SteeringManager
    from service.steering.store import SteeringStore

    vectors = tmp_path / "control_vectors"
    vectors.mkdir()
    write_control_vector(vectors / "v.gguf", {1: np.ones(HIDDEN, np.float32)})

    async def run() -> None:
        manager = SteeringManager(SteeringStore(tmp_path / "s.sqlite3"), tmp_path / "saes",
                                  vectors_dir=vectors)

        await manager.bind(_Runtime(HIDDEN, LAYERS))
        from service.steering.documents import parse_entries
        await manager.set_steering(parse_entries(
            [{"control_vector": "cv_v", "scale": 2.0}], "values"), True)
        plan = manager.resolve(None, None).plan
        assert plan is not None and [s.layer for s in plan.layers] == [1]
        assert plan.layers[0].sae_id == "" and plan.layers[0].features == ()
        assert np.array_equal(plan.vectors()[1], np.full(HIDDEN, 2.0, np.float32))
        await manager.bind(_Runtime(32, LAYERS))  # a narrower model
        assert manager.resolve(None, None).plan is None
        live = manager.default_live()
        assert not live.live and "32 dimensions" in live.reason
        await manager.bind(_Runtime(HIDDEN, 1))  # a shallower one
        assert manager.resolve(None, None).plan is None
        assert "blocks 0-0" in manager.default_live().reason
        manager.store.close()

    asyncio.run(run())
