"""The GGUF engine's one piece of C: the llama.cpp eval callback that steers
and reads the residual stream per row (steer_cb.c), built against the ggml
headers llama-cpp-python installs, so its view of `struct ggml_tensor` is the
library's own.

Built once by `make setup` (and by the container image), into `_native/`
beside this file, under a name that carries a hash of the source and of
ggml.h: a different llama.cpp rebuilds it. Where that folder is read-only
and nothing was built there, a load builds it under the system's temporary
folder. Without a C compiler the GGUF engine serves, and steering fields are
refused on it (steering_unavailable), never ignored.

    python -m service.engines.gguf.native   # build now; prints the path
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import pathlib
import shutil
import subprocess
import sys
import tempfile

log = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("steer_cb.c")
HERE = pathlib.Path(__file__).with_name("_native")


class NativeUnavailable(Exception):
    """The callback library cannot be built or loaded here."""


def _include_dir() -> pathlib.Path:
    import llama_cpp

    site = pathlib.Path(llama_cpp.__file__).resolve().parent.parent
    for candidate in (site / "include", site / "llama_cpp" / "include"):
        if (candidate / "ggml.h").is_file():
            return candidate
    raise NativeUnavailable(f"ggml.h not found beside llama_cpp ({site}/include)")


def _name(include: pathlib.Path) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes() + (include / "ggml.h").read_bytes())
    return f"millm_steer-{digest.hexdigest()[:16]}.so"


def _compile(include: pathlib.Path, target: pathlib.Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise NativeUnavailable("no C compiler (cc) to build the steering callback")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{id(target)}.tmp")
    result = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-std=c11", f"-I{include}", str(SOURCE),
         "-o", str(partial)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise NativeUnavailable(f"building {SOURCE.name} failed: {result.stderr.strip()[:500]}")
    partial.replace(target)  # atomic: a concurrent load sees all of it or none


def library_path(build: bool = True) -> pathlib.Path:
    """The built library, building it if `build` and it is missing."""
    include = _include_dir()
    name = _name(include)
    fallback = pathlib.Path(tempfile.gettempdir()) / "millm-native" / name
    for candidate in (HERE / name, fallback):
        if candidate.is_file():
            return candidate
    if not build:
        raise NativeUnavailable(f"{name} is not built (python -m service.engines.gguf.native)")
    try:
        _compile(include, HERE / name)
        return HERE / name
    except OSError:  # a read-only install
        _compile(include, fallback)
        return fallback


_loaded: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    global _loaded
    if _loaded is None:
        try:
            _loaded = ctypes.CDLL(str(library_path()))
        except OSError as exc:
            raise NativeUnavailable(f"cannot load the steering callback: {exc}") from None
    return _loaded


if __name__ == "__main__":
    try:
        print(library_path())
    except NativeUnavailable as exc:
        print(f"not built: {exc}", file=sys.stderr)
        sys.exit(1)
