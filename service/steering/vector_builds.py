"""Steering vectors from examples (issue 43): contrasting prompts run through
the served model, their residual stream read at one layer, the difference
saved as a llama.cpp control vector.

What people do offline with repeng, steering-vectors or llama.cpp's
`cvector-generator` happens here on the engine that serves the traffic, so
the vector is read from exactly the model (and quantization) it will steer.
Each prompt is run once, unsteered, as a scoring pass is (engine.score), and
a recorder at the layer (`ResidualMean`, fed the raw rows the readout's
recorder is fed on both engines) keeps the mean of the residual over the
prompt's tokens: the output of block L, where direction.L is added
(steering/control_vectors.py), so the vector is measured where it acts.

From the per-prompt means (vector_math.py): `mean_difference` (contrastive
activation addition) or `pca` (the first principal component of the pairs'
differences, scaled to their mean projection so both methods give a vector
of the size the examples differ by). The file is what cvector-generator
writes (architecture `controlvector`, `controlvector.model_hint`,
`controlvector.layer_count`, one F32 `direction.<L>`), so llama.cpp's own
`--control-vector` loads it too. Layer 0 is refused: llama.cpp refuses a
file holding direction.0.

The work is bounded (pairs, bytes, tokens, seconds), cancellable (between
prompts, by the caller going away or by CancelControlVectorBuild), one build
at a time per replica, and its progress is readable while it runs. Nothing
is written unless the whole build succeeds.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from service.errors import EngineError, invalid_parameter
from service.steering import plan as runtime
from service.steering.control_vectors import (
    ARCHITECTURE,
    SUFFIX,
    ControlVector,
    ControlVectorDirectory,
    read_vector,
)
from service.steering.recording import ActivationRecorder
from service.steering.vector_math import METHODS, Combined, combine

MAX_PAIRS = 64
MAX_SET = 128  # prompts on each side when given as two sets
MAX_TEXT_BYTES = 4000
MAX_TOKENS = 65536  # over every prompt of a build
DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 600.0
NEAREST = 8  # SAE features reported per attached SAE at the layer
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def stopped(message: str) -> EngineError:
    return EngineError("vector_build_stopped", message)


@dataclass(frozen=True)
class BuildRequest:
    name: str
    model: str
    layer: int
    method: str
    positives: tuple[str, ...]
    negatives: tuple[str, ...]
    paired: bool
    timeout_s: float


def check(name: str, model: str, layer: int, method: str, pairs: list[tuple[str, str]],
          positives: list[str], negatives: list[str], timeout_s: float | None) -> BuildRequest:
    """Everything that needs no model: 400 naming the field."""
    if not _NAME.match(name or ""):
        raise invalid_parameter("name", "'name' is 1-64 letters, digits, '_' or '-', starting "
                                "with a letter or digit (the vector's id is cv_<name>).")
    if name.startswith("cv_"):
        raise invalid_parameter("name", "'name' must not start with 'cv_': the id adds it.")
    method = method or "mean_difference"
    if method not in METHODS:
        raise invalid_parameter("method", f"'method' is one of {', '.join(METHODS)}.")
    if pairs and (positives or negatives):
        raise invalid_parameter("pairs", "Give 'pairs' or the two sets 'positives' and "
                                "'negatives', not both.")
    paired = bool(pairs)
    if paired:
        if len(pairs) > MAX_PAIRS:
            raise invalid_parameter("pairs", f"At most {MAX_PAIRS} pairs.")
        pos, neg = [p for p, _ in pairs], [n for _, n in pairs]
        fields = [(f"pairs[{i}].positive", p) for i, p in enumerate(pos)] + [
            (f"pairs[{i}].negative", n) for i, n in enumerate(neg)]
    else:
        if not positives and not negatives:
            raise invalid_parameter("pairs", "'pairs' (or 'positives' and 'negatives') must "
                                    "not be empty.")
        for where, side in (("positives", positives), ("negatives", negatives)):
            if not side:
                raise invalid_parameter(where, f"'{where}' must not be empty.")
            if len(side) > MAX_SET:
                raise invalid_parameter(where, f"'{where}' holds at most {MAX_SET} texts.")
        pos, neg = list(positives), list(negatives)
        fields = [(f"positives[{i}]", p) for i, p in enumerate(pos)] + [
            (f"negatives[{i}]", n) for i, n in enumerate(neg)]
    if method == "pca" and paired and len(pairs) < 2:
        raise invalid_parameter("pairs", "'pca' needs at least 2 pairs (the component of one "
                                "difference is that difference: use mean_difference).")
    for where, text in fields:
        if not text:
            raise invalid_parameter(where, "A prompt must not be empty.")
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise invalid_parameter(where, f"A prompt is at most {MAX_TEXT_BYTES} bytes of "
                                    "UTF-8.")
    if layer < 1:
        raise invalid_parameter("layer", "'layer' must be 1 or more: llama.cpp's control "
                                "vectors have no direction.0 (it refuses a file holding one).")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise invalid_parameter("timeout_s", f"'timeout_s' is above 0 and at most "
                                f"{MAX_TIMEOUT_S:g} seconds.")
    return BuildRequest(name, model, layer, method, tuple(pos), tuple(neg), paired, timeout)


@dataclass(frozen=True)
class ResidualSpec:
    """What the engines' capture hooks read of a recorder's spec: a layer's
    residual after its block (where direction.<layer> is added), at every
    prompt position."""

    layer: int
    read_point: str = runtime.POST_STEERING
    positions: str = runtime.PROMPT
    start: int = 0
    end: int = 0

    def reads_prompt(self, prompt_len: int) -> bool:
        return True


class ResidualMean(ActivationRecorder):
    """Keeps the sum and count of the raw residual rows handed to it (one
    prompt's, in one chunk or several)."""

    def __init__(self, layer: int, prompt_len: int):
        super().__init__(ResidualSpec(layer), prompt_len)
        self.total: torch.Tensor | None = None
        self.count = 0

    def record(self, hidden: torch.Tensor, positions: list[int], token_ids: list[int]) -> None:
        rows = hidden.detach().to("cpu", torch.float64).sum(dim=0)
        self.total = rows if self.total is None else self.total + rows
        self.count += hidden.shape[0]

    def mean(self) -> np.ndarray:
        if self.total is None or self.count == 0:
            raise EngineError("internal_error", "The layer's residual was not read.")
        return (self.total / self.count).numpy()


@dataclass
class Progress:
    """The running build, as GetControlVectorBuild reports it."""

    request: BuildRequest
    model: str
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Near:
    sae_id: str
    index: int
    cosine: float


@dataclass(frozen=True)
class Built:
    vector: ControlVector
    model: str
    combined: Combined
    tokens: int
    nearest: tuple[Near, ...]


def write_vector(path: pathlib.Path, layer: int, direction: np.ndarray, hint: str) -> None:
    """cvector-generator's file (export_gguf): written beside, then renamed."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".building-", suffix=SUFFIX, dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(temp, ARCHITECTURE)
        writer.add_string(f"{ARCHITECTURE}.model_hint", hint)
        writer.add_int32(f"{ARCHITECTURE}.layer_count", 1)
        writer.add_tensor(f"direction.{layer}", direction.astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        try:
            os.link(temp, path)  # fails if a vector of that name appeared meanwhile
        except FileExistsError:
            raise EngineError("already_exists", f"A control vector named '{path.stem}' "
                              "already exists.", "name") from None
    finally:
        pathlib.Path(temp).unlink(missing_ok=True)


def nearest_features(direction: np.ndarray, layer: int, attached: dict, decoder) -> list[Near]:
    """The attached SAEs' features at `layer` whose decoder rows point most
    nearly the vector's way (cosine), NEAREST per SAE."""
    out = []
    v = torch.nn.functional.normalize(torch.from_numpy(direction).float(), dim=0)
    for sae_id, sae in sorted(attached.items()):
        if sae.info.layer != layer or sae.info.d_in != direction.size:
            continue
        rows = torch.nn.functional.normalize(decoder(sae.info).float().cpu(), dim=1)
        cosines = rows @ v
        best = torch.topk(cosines, min(NEAREST, cosines.numel()))
        out.extend(Near(sae_id, int(i), round(float(c), 6))
                   for c, i in zip(best.values.tolist(), best.indices.tolist(), strict=True))
    return out


class VectorBuilds:
    """One build at a time on this replica, and its progress."""

    def __init__(self, vectors: ControlVectorDirectory):
        self._vectors = vectors
        self.running: Progress | None = None

    def cancel(self) -> bool:
        if self.running is None:
            return False
        self.running.cancel.set()
        return True

    def _path(self, name: str) -> pathlib.Path:
        if self._vectors.root is None:
            raise EngineError("steering_unavailable", "No control-vector directory is set "
                              "(MILLM_CONTROL_VECTORS_DIR).")
        return self._vectors.root / f"{name}{SUFFIX}"

    async def build(self, request: BuildRequest, inference, attached: dict, decoder) -> Built:
        if self.running is not None:
            raise EngineError("vector_build_busy", f"The control vector "
                              f"'{self.running.request.name}' is being built on this replica; "
                              "one build runs at a time.")
        path = self._path(request.name)
        if path.exists():
            raise EngineError("already_exists", f"A control vector named '{request.name}' "
                              "already exists.", "name")
        lease = await inference.lifecycle.acquire(request.model)
        try:
            engine, info = lease.engine, lease.info
            shape = engine.steering
            if shape is None:
                raise EngineError("steering_unavailable", f"{info.id} cannot be steered, so "
                                  "its residual stream cannot be read.", "model")
            if request.layer >= shape.num_layers:
                raise invalid_parameter("layer", f"{info.id} has blocks 0-"
                                        f"{shape.num_layers - 1}; 'layer' must be 1-"
                                        f"{shape.num_layers - 1}.")
            prompts = request.positives + request.negatives
            ids = await inference.tokenizer_calls.run(None, lambda: [
                engine.encode_text(p, parse_special=False, add_special=True) for p in prompts])
            self._check_fit(request, ids, info.context_window)
            progress = Progress(request, info.id, len(ids))
            self.running = progress
            try:
                means = await self._read(engine, request, ids, progress)
            finally:
                self.running = None
        finally:
            lease.release()
        half = len(request.positives)
        combined = combine(request.method, np.stack(means[:half]), np.stack(means[half:]),
                           request.paired)
        await asyncio.to_thread(write_vector, path, request.layer, combined.vector, info.id)
        vector = await asyncio.to_thread(read_vector, path)
        nearest = await asyncio.to_thread(nearest_features, combined.vector, request.layer,
                                          attached, decoder)
        return Built(vector, info.id, combined, sum(len(i) for i in ids), tuple(nearest))

    @staticmethod
    def _check_fit(request: BuildRequest, ids: list[list[int]], window: int) -> None:
        half = len(request.positives)
        for i, tokens in enumerate(ids):
            if len(tokens) > window:
                side = i < half
                k = i if side else i - half
                where = (f"pairs[{k}].{'positive' if side else 'negative'}" if request.paired
                         else f"{'positives' if side else 'negatives'}[{k}]")
                raise invalid_parameter(where, f"This prompt is {len(tokens)} tokens; the "
                                        f"model's window is {window}.")
        total = sum(len(t) for t in ids)
        if total > MAX_TOKENS:
            raise invalid_parameter("pairs", f"The prompts hold {total} tokens; a build reads "
                                    f"at most {MAX_TOKENS}.")

    @staticmethod
    async def _read(engine, request: BuildRequest, ids: list[list[int]],
                    progress: Progress) -> list[np.ndarray]:
        means = []
        deadline = progress.started + request.timeout_s
        for tokens in ids:
            if progress.cancel.is_set():
                raise stopped(f"The build of '{request.name}' was cancelled; nothing was "
                              "saved.")
            if time.monotonic() > deadline:
                raise stopped(f"The build of '{request.name}' ran past its {request.timeout_s:g}"
                              " s; nothing was saved. Use fewer or shorter prompts, or raise "
                              "'timeout_s'.")
            recorder = ResidualMean(request.layer, len(tokens))
            await engine.score([tokens], temperature=1.0, allowed=None, top=0, echo=False,
                               next_token=True, recorder=recorder)
            means.append(recorder.mean())
            progress.done += 1
        return means
