"""llama.cpp control vectors as steering: the files, and what the steering
entries that name them add.

A control vector is what llama.cpp's `cvector-generator` writes: a GGUF file
whose architecture is `controlvector` (with `controlvector.model_hint` and
`controlvector.layer_count`) holding one F32 tensor `direction.<il>` of the
model's width per layer. llama.cpp (common_control_vector_load, and
llama_adapter_cvec at the end of every block) adds direction.<il> to the
output of block il, counted from 0, just before that output is named
`l_out-<il>`; it refuses a file holding direction.0 and never adds anything
after block 0. That is exactly where a steering plan adds its vector for layer
il (SAELens `blocks.<il>.hook_resid_post`), so direction.<il> is our layer il
with no shift, on both engines.

Why a module of its own: SAE entries resolve against attached SAEs
(manager.py); a control vector needs no SAE, only its file, so its entries
resolve here (entry_ops) and the manager adds the result to the plan's layers.
Files sit in one directory (MILLM_CONTROL_VECTORS_DIR, by default
<models dir>/control_vectors) and are read whole, checked and cached until
their size or modification time changes; ids are `cv_<file stem>`, and an
entry may name a vector by its stem too.
"""

from __future__ import annotations

import logging
import math
import pathlib
import re
import threading
from dataclasses import dataclass, field

import numpy as np

from service.errors import EngineError
from service.steering import intensity
from service.steering.documents import SteeringEntry
from service.steering.plan import ADD, CLAMP, Edit

log = logging.getLogger(__name__)

# A Llama 3 405B vector (16384 wide, 125 directions) is 8.2 MB; the limit
# keeps a stray file from being read into memory whole.
MAX_FILE_BYTES = 16 << 20
ARCHITECTURE = "controlvector"
SUFFIX = ".gguf"
_DIRECTION = re.compile(r"^direction\.(\d+)$")
_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_ID = re.compile(r"^cv_[A-Za-z0-9_-][A-Za-z0-9_.-]{0,250}$")


def vector_id_for(path: pathlib.Path) -> str:
    return "cv_" + _ID_CHARS.sub("-", path.name.removesuffix(SUFFIX))


def canonical_id(name: str) -> str:
    """An entry may name a vector by its id (cv_<stem>) or by its stem, the
    name it was built under (vector_builds.py)."""
    return name if name.startswith("cv_") else "cv_" + name


def invalid_vector(message: str, param: str | None = None) -> EngineError:
    return EngineError("invalid_control_vector", message, param)


@dataclass(frozen=True)
class ControlVector:
    """A checked control-vector file: its directions by our layer index."""

    id: str
    path: pathlib.Path
    n_embd: int
    model_hint: str
    layer_count: int
    size_bytes: int
    directions: dict[int, np.ndarray] = field(compare=False, repr=False)  # float32 [n_embd]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.directions))

    def mismatch(self, model: tuple[int, int]) -> str:
        """Why it cannot steer a model of (hidden size, layers); '' when it can."""
        hidden, layers = model
        if self.n_embd != hidden:
            return (f"{self.id} is {self.n_embd} wide, but the model's residual stream has "
                    f"{hidden} dimensions.")
        past = [layer for layer in self.layers if layer >= layers]
        if past:
            return (f"{self.id} has direction.{past[0]}, but the model has blocks "
                    f"0-{layers - 1}.")
        return ""


def read_vector(path: pathlib.Path) -> ControlVector:
    """Parse and check a control-vector file (invalid_control_vector when
    llama.cpp would refuse it, or it holds a non-finite value)."""
    import gguf

    name = vector_id_for(path)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise invalid_vector(f"{name}: the file is {size} bytes; at most {MAX_FILE_BYTES} are "
                             "read.")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # truncated, not GGUF, an unknown tensor type
        raise invalid_vector(f"{name}: not a readable GGUF file ({type(exc).__name__}: "
                             f"{exc}).") from None

    def text(key: str) -> str:
        found = reader.get_field(key)
        try:
            return str(found.contents()) if found is not None else ""
        except (TypeError, ValueError, IndexError):
            return ""

    arch = text("general.architecture")
    if arch != ARCHITECTURE:
        raise invalid_vector(f"{name}: general.architecture is {arch!r}, not "
                             f"{ARCHITECTURE!r}; this is not a control vector.")
    directions: dict[int, np.ndarray] = {}
    n_embd = -1
    for tensor in reader.tensors:
        match = _DIRECTION.match(tensor.name)
        if match is None:
            raise invalid_vector(f"{name}: tensor {tensor.name!r} is not direction.<layer>.")
        layer = int(match.group(1))
        if layer == 0:
            raise invalid_vector(f"{name}: direction.0 is not a layer llama.cpp steers (its "
                                 "first direction is direction.1, after block 1).")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or len(tensor.shape) != 1:
            raise invalid_vector(f"{name}: {tensor.name} must be a 1-D F32 tensor.")
        data = np.array(tensor.data, dtype=np.float32).reshape(-1)
        if n_embd == -1:
            n_embd = data.size
        elif data.size != n_embd:
            raise invalid_vector(f"{name}: {tensor.name} has {data.size} values, the tensors "
                                 f"before it {n_embd}.")
        if not np.isfinite(data).all():
            raise invalid_vector(f"{name}: {tensor.name} holds a non-finite value.")
        # Two spellings of one layer (direction.1, direction.01) add up, as in llama.cpp.
        directions[layer] = directions[layer] + data if layer in directions else data
    if not directions:
        raise invalid_vector(f"{name}: the file holds no direction tensors.")
    if not all(np.isfinite(v).all() for v in directions.values()):
        raise invalid_vector(f"{name}: its directions overflow float32.")
    count = reader.get_field(f"{ARCHITECTURE}.layer_count")
    try:
        layer_count = int(count.contents()) if count is not None else 0
    except (TypeError, ValueError):
        layer_count = 0
    return ControlVector(name, path, n_embd, text(f"{ARCHITECTURE}.model_hint"), layer_count,
                         size, directions)


class ControlVectorDirectory:
    """The control-vector files in one folder (none when it is not set)."""

    def __init__(self, root: pathlib.Path | None):
        self.root = root
        self._cache: dict[pathlib.Path, tuple[tuple[int, int], ControlVector | str]] = {}
        self._lock = threading.Lock()

    def _read(self, path: pathlib.Path) -> ControlVector | str:
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            found: ControlVector | str = read_vector(path)
        except EngineError as exc:
            found = exc.message
        with self._lock:
            self._cache[path] = (key, found)
        return found

    def _files(self) -> list[pathlib.Path]:
        if self.root is None or not self.root.is_dir():
            return []
        return [p for p in sorted(self.root.iterdir())
                if p.name.endswith(SUFFIX) and not p.name.startswith(".") and p.is_file()]

    def scan(self) -> tuple[list[ControlVector], list[tuple[str, str]]]:
        """(usable vectors, (id, problem) for files that are not)."""
        found, broken = [], []
        for path in self._files():
            try:
                read = self._read(path)
            except OSError as exc:  # removed while scanning, unreadable
                read = f"{vector_id_for(path)}: cannot read the file ({exc})."
            if isinstance(read, str):
                broken.append((vector_id_for(path), read))
            else:
                found.append(read)
        return found, broken

    def get(self, vector_id: str, param: str = "control_vector") -> ControlVector:
        """A vector by id (or stem): control_vector_not_found, or
        invalid_control_vector for a file that is there but unusable."""
        vector_id = canonical_id(vector_id)
        paths: list[pathlib.Path] = []
        if _ID.match(vector_id):  # anything else names no file (ids are sanitized)
            # Per request: the file the id usually names, the whole folder only if not.
            likely = self.root / (vector_id.removeprefix("cv_") + SUFFIX) if self.root else None
            try:
                usual = likely is not None and likely.is_file()
            except (OSError, ValueError):
                usual = False
            paths = [likely] if usual else self._files()
        for path in paths:
            if vector_id_for(path) != vector_id:
                continue
            try:
                read = self._read(path)
            except OSError as exc:
                read = f"{vector_id}: cannot read the file ({exc})."
            if isinstance(read, str):
                raise invalid_vector(read, param)
            return read
        raise EngineError("control_vector_not_found", f"No control vector with id "
                          f"'{vector_id}' is on disk.", param)


def delete_vector(vectors: ControlVectorDirectory, vector_id: str) -> str:
    """Remove a vector's file (a broken file too); its id."""
    try:
        path = vectors.get(vector_id, "id").path
    except EngineError as exc:
        if exc.code != "invalid_control_vector":
            raise
        vector_id = canonical_id(vector_id)
        path = next(p for p in vectors._files() if vector_id_for(p) == vector_id)
    path.unlink(missing_ok=True)
    return vector_id_for(path)


def check_entries(entries: tuple[SteeringEntry, ...], where: str,
                  vectors: ControlVectorDirectory, model: tuple[int, int] | None) -> None:
    """At write time: every vector named exists, is usable, and (when a model
    is loaded) fits it."""
    for i, e in enumerate(entries):
        if not e.control_vector:
            continue
        param = f"{where}[{i}].control_vector"
        vector = vectors.get(e.control_vector, param)
        problem = vector.mismatch(model) if model is not None else ""
        if problem:
            raise EngineError("control_vector_mismatch", problem, param)


def entry_ops(e: SteeringEntry, level: float, vectors: ControlVectorDirectory,
              model: tuple[int, int] | None) -> dict[int, tuple[np.ndarray | None, Edit | None]]:
    """What one vector entry does at dial λ, per layer: (added vector, edit).
    add: the scaled direction; ablate: the stream's component along the
    direction removed (λ of it); clamp: that component set to `value`. A
    vector gone from disk, or one that does not fit the loaded model, steers
    nothing, as an entry at a layer with no SAE attached does; writes refuse
    both, and liveness (unfit) says why."""
    if model is None:
        return {}
    try:
        vector = vectors.get(e.control_vector)
    except EngineError:
        return {}
    if vector.mismatch(model):
        return {}
    out: dict[int, tuple[np.ndarray | None, Edit | None]] = {}
    if e.mode == ADD:
        scale = intensity.scaled(e.strength, level)
        if scale != 0.0:
            for layer, direction in vector.directions.items():
                out[layer] = (direction * np.float32(scale), None)
        return out
    for layer, direction in vector.directions.items():
        norm = float(np.linalg.norm(direction))
        if norm == 0.0:
            continue
        unit = (direction / np.float32(norm)).astype(np.float32)
        target = e.value if e.mode == CLAMP else 0.0
        out[layer] = (None, Edit(unit, 0.0, target, -math.inf, unit * np.float32(level)))
    return out


def unfit(entries: tuple[SteeringEntry, ...], vectors: ControlVectorDirectory,
          model: tuple[int, int] | None) -> str:
    """Why some vector entry of `entries` steers nothing now ('' if none)."""
    if model is None:
        return ""
    for e in entries:
        if not e.control_vector:
            continue
        try:
            problem = vectors.get(e.control_vector).mismatch(model)
        except EngineError as exc:
            problem = exc.message
        if problem:
            return problem
    return ""


def warn_unfit(stored: list[tuple[SteeringEntry, ...]], vectors: ControlVectorDirectory,
               model: tuple[int, int] | None) -> None:
    """Log each stored list whose control vectors will not steer this model."""
    for entries in stored:
        problem = unfit(entries, vectors, model)
        if problem:
            log.warning("a stored control-vector entry will not steer: %s", problem)
