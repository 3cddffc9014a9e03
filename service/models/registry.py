"""The models on disk.

Two kinds are found in the models dir:

- an HF checkpoint: a directory holding a config.json; its id is the
  directory name, and the transformers engine serves it;
- GGUF files, served by the llama.cpp engine: every `.gguf` file in a
  directory (the directory is the *repository*) or directly in the models dir
  (its repository is the file name without the quantization tag). Each file is
  one model whose id is `<repository>:<QUANT>`, the quantization read from the
  file's own metadata (general.file_type), so several quantizations of one
  repository are served side by side.

A bare repository name resolves while the repository holds one quantization;
with several it is ambiguous, and the refusal names the tags.
"""

from __future__ import annotations

import json
import logging
import pathlib
import re
import threading
from dataclasses import dataclass

from service.errors import EngineError, model_not_found

log = logging.getLogger(__name__)

# Written beside a checkpoint by the project's own builders (the demo model).
METADATA_FILE = "millm_model.json"
TRANSFORMERS, GGUF = "transformers", "gguf"


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: pathlib.Path
    created: int
    owned_by: str
    # A content revision recorded at build time; None when nobody recorded one.
    revision: str | None
    # The engine that serves it.
    engine: str = TRANSFORMERS
    # GGUF: the repository and quantization tag; transformers: the
    # checkpoint's quantization method ("" when unquantized).
    repo: str = ""
    quantization: str = ""
    # Bytes of weights on disk: what loading it needs, at least.
    size_bytes: int = 0
    # Why this engine cannot load it (its quantization, its architecture); ""
    # when it can, and the error code that refusal carries.
    unsupported: str = ""
    unsupported_code: str = "unsupported_quantization"
    # Bytes per parameter as stored (2 for a float16/bfloat16 checkpoint, which
    # the transformers engine widens to float32 on a CPU); 0 when not known.
    stored_bytes_per_param: int = 0
    # GGUF: the trained context, the f16 KV cache bytes one token takes and
    # the attention heads (engines/gguf/kv_plan.py sizes the cache from them).
    context_length: int = 0
    kv_bytes_per_token: int = 0
    attention_heads: int = 0


def _metadata(directory: pathlib.Path) -> dict:
    meta_file = directory / METADATA_FILE
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
            return meta if isinstance(meta, dict) else {}
        except (OSError, ValueError):
            return {}
    return {}


# -- HF checkpoints ---------------------------------------------------------------

# Quantization methods the transformers engine can run here: none yet (every
# method in a checkpoint's quantization_config needs kernels this engine does
# not ship), so a quantized checkpoint is refused before any unload.
TRANSFORMERS_QUANTIZATIONS: frozenset[str] = frozenset()


def _unservable_architecture(config) -> str:
    """Why a checkpoint's architecture cannot be served by the transformers
    engine (it is no causal language model transformers knows); "" when it can.
    What its cache needs is checked when it loads (engines/transformers/kv.py)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        return "its config.json names no model_type"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return (f"its architecture ({model_type[:64]}) is not a causal language model the "
                "transformers engine can generate with")
    return ""


def _checkpoint_entry(path: pathlib.Path) -> ModelEntry:
    meta = _metadata(path)
    created = meta.get("created")
    if not isinstance(created, int):
        created = int((path / "config.json").stat().st_mtime)
    quantization, unsupported = "", ""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    unsupported_code = "unsupported_quantization"
    architecture = _unservable_architecture(config)
    if architecture:
        unsupported, unsupported_code = architecture, "unsupported_architecture"
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if isinstance(quant, dict):
        method = str(quant.get("quant_method") or "unrecorded")
        bits = quant.get("bits")
        quantization = f"{method}{f'-{bits}bit' if bits else ''}"
        if method not in TRANSFORMERS_QUANTIZATIONS and not unsupported:
            unsupported = (f"its quantization ({quantization}) needs kernels the transformers "
                           "engine does not have")
    size = sum(f.stat().st_size for f in path.iterdir()
               if f.suffix in (".safetensors", ".bin") and f.is_file())
    dtype = str((config.get("dtype") or config.get("torch_dtype") or "")
                if isinstance(config, dict) else "")
    stored = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 0)
    return ModelEntry(
        id=path.name,
        path=path,
        created=created,
        owned_by=str(meta.get("owned_by") or "local"),
        revision=str(meta["revision"]) if meta.get("revision") else None,
        quantization=quantization,
        size_bytes=size,
        unsupported=unsupported,
        unsupported_code=unsupported_code,
        stored_bytes_per_param=stored,
    )


# -- GGUF files -------------------------------------------------------------------

_QUANT_TAG = re.compile(r"[-._](I?Q\d[A-Z0-9_]*|F16|F32|BF16|TQ\d_\d)$", re.IGNORECASE)


def _file_type_name(value: int) -> str | None:
    import gguf

    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


@dataclass(frozen=True)
class _GgufFacts:
    quantization: str
    unsupported: str
    context_length: int = 0
    kv_bytes_per_token: int = 0
    attention_heads: int = 0
    # A llama.cpp adapter (a control vector, a LoRA), not a model: never listed.
    adapter: bool = False


class _GgufFactsCache:
    """Reading a GGUF header costs a parse of every tensor's description, and
    the registry is scanned per request for models that are not loaded: keep
    each file's facts until its size or mtime changes."""

    def __init__(self):
        self._facts: dict[tuple, _GgufFacts] = {}
        self._lock = threading.Lock()

    def get(self, path: pathlib.Path) -> _GgufFacts:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if key in self._facts:
                return self._facts[key]
        facts = _read_gguf(path)
        with self._lock:
            self._facts[key] = facts
        return facts


def _read_gguf(path: pathlib.Path) -> _GgufFacts:
    import gguf

    tagged = _QUANT_TAG.search(path.stem)
    fallback = tagged.group(1).upper() if tagged else "unrecorded"
    try:
        reader = gguf.GGUFReader(path)
    except ValueError as exc:
        if "GGMLQuantizationType" in str(exc):
            # A tensor type this llama.cpp does not know: refused before any unload.
            return _GgufFacts(fallback, f"it holds a tensor type llama.cpp cannot load ({exc})")
        # A damaged file: listed; its load fails with llama.cpp's own reason.
        return _GgufFacts(fallback, "")
    except (KeyError, OSError):
        return _GgufFacts(fallback, "")
    def per_layer(key: str, layers: int) -> list[int]:
        """A hyperparameter for each layer (a file may give one value, or one a layer)."""
        found = reader.get_field(key)
        if found is None:
            return [0] * layers
        try:
            return [int(found.contents())] * layers
        except (TypeError, ValueError):  # an array: one value a layer
            return [int(v) for v in found.contents()][:layers]

    def number(key: str) -> int:
        return max(per_layer(key, 1), default=0)

    field = reader.get_field("general.file_type")
    name = _file_type_name(int(field.contents())) if field is not None else None
    arch_field = reader.get_field("general.architecture")
    arch = str(arch_field.contents()) if arch_field is not None else "llama"
    kind = reader.get_field("general.type")
    if arch == "controlvector" or (kind is not None and str(kind.contents()) == "adapter"):
        return _GgufFacts(fallback, "", adapter=True)
    layers = number(f"{arch}.block_count")
    heads = per_layer(f"{arch}.attention.head_count", layers)
    kv_heads = [kv or h for kv, h in zip(per_layer(f"{arch}.attention.head_count_kv", layers),
                                         heads, strict=False)]
    widest = max(heads, default=0)
    head_dim = number(f"{arch}.attention.key_length") or (
        number(f"{arch}.embedding_length") // widest if widest else 0)
    value_dim = number(f"{arch}.attention.value_length") or head_dim
    # K and V of one cell, f16 (2 bytes), summed over the layers (as llama.cpp sizes it).
    per_cell = sum(kv_heads) * (head_dim + value_dim) * 2
    return _GgufFacts(name or fallback, "", number(f"{arch}.context_length"), per_cell, widest)


_GGUF_FACTS = _GgufFactsCache()


def _gguf_entry(path: pathlib.Path, repo: str, meta: dict) -> ModelEntry | None:
    facts = _GGUF_FACTS.get(path)
    if facts.adapter:
        return None
    revisions = meta.get("revisions") if isinstance(meta.get("revisions"), dict) else {}
    created = meta.get("created")
    if not isinstance(created, int):
        created = int(path.stat().st_mtime)
    return ModelEntry(
        id=f"{repo}:{facts.quantization}",
        path=path,
        created=created,
        owned_by=str(meta.get("owned_by") or "local"),
        revision=str(revisions[path.name]) if revisions.get(path.name) else None,
        engine=GGUF,
        repo=repo,
        quantization=facts.quantization,
        size_bytes=path.stat().st_size,
        unsupported=facts.unsupported,
        context_length=facts.context_length,
        kv_bytes_per_token=facts.kv_bytes_per_token,
        attention_heads=facts.attention_heads,
    )


def _repo_of_file(path: pathlib.Path) -> str:
    tagged = _QUANT_TAG.search(path.stem)
    return path.stem[: tagged.start()] if tagged else path.stem


class ModelRegistry:
    def __init__(self, models_dir: pathlib.Path):
        self.models_dir = models_dir

    def scan(self) -> list[ModelEntry]:
        if not self.models_dir.is_dir():
            return []
        entries: dict[str, ModelEntry] = {}

        def add(entry: ModelEntry | None) -> None:
            if entry is None:
                return
            if entry.id in entries:
                # Two files of one repository with the same quantization: the
                # id would be ambiguous, so only the first by name is served.
                log.warning("%s and %s are both %s; serving the first", entries[entry.id].path,
                            entry.path, entry.id)
                return
            entries[entry.id] = entry

        for child in sorted(self.models_dir.iterdir()):
            if child.name.startswith("."):
                continue
            try:
                if child.is_dir() and (child / "config.json").is_file():
                    add(_checkpoint_entry(child))
                elif child.is_dir():
                    meta = _metadata(child)
                    for path in sorted(child.glob("*.gguf")):
                        add(_gguf_entry(path, child.name, meta))
                elif child.suffix == ".gguf" and child.is_file():
                    add(_gguf_entry(child, _repo_of_file(child), {}))
            except OSError as exc:  # removed while scanning, unreadable: skip it
                log.warning("skipping %s: %s", child, exc)
        return sorted(entries.values(), key=lambda e: e.id)

    def get(self, model_id: str) -> ModelEntry | None:
        # Look the id up among scanned entries rather than joining it onto a
        # path, so a request can never name something outside the models dir.
        return next((e for e in self.scan() if e.id == model_id), None)

    def resolve(self, name: str) -> ModelEntry:
        """The entry a request's model name means: an exact id, or a bare GGUF
        repository name while it holds one quantization."""
        entries = self.scan()
        exact = next((e for e in entries if e.id == name), None)
        if exact is not None:
            return exact
        tagged = [e for e in entries if e.engine == GGUF and e.repo == name]
        if len(tagged) == 1:
            return tagged[0]
        if tagged:
            tags = ", ".join(f"'{e.id}'" for e in tagged)
            raise EngineError("AMBIGUOUS_MODEL_NAME", f"The model name '{name}' is ambiguous: "
                              f"the repository holds several quantizations ({tags}). Name one "
                              "of them.", "model", details={"candidates": ",".join(
                                  e.id for e in tagged)})
        raise model_not_found(name)
