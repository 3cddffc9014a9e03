#!/usr/bin/env bash
# Build llama.cpp's own C++ server (llama-server) from the llama.cpp source
# that llama-cpp-python's sdist vendors, at the version pinned in this venv,
# with the same CMake flags as our binding (the Makefile's LLAMA_CMAKE_ARGS),
# once: the binary is kept in $OUT and reused while the version matches.
#
# Its CMake embeds the web UI and would otherwise download a pre-built copy
# or build it with npm; offline, it gets a placeholder page instead (the
# benchmarks never open the UI). Takes several minutes on two cores.
#
#   tools/build_llama_server.sh [OUT]   (default .millm/llama-server)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-.millm/llama-server}
VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
if [[ -x "$OUT/bin/llama-server" && "$(cat "$OUT/version" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$OUT/bin/llama-server (llama-cpp-python $VERSION) already built"; exit 0
fi
CMAKE_ARGS=${LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON"}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# pip's own cache keeps the sdist after the first download.
"$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC=$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)
DIST="$SRC/tools/ui/dist"
mkdir -p "$DIST"
echo '<!doctype html><title>llama-server</title><p>UI not built (miLLM benchmark build).' \
  > "$DIST/index.html"
echo '{}' > "$DIST/manifest.webmanifest"
echo '{}' > "$DIST/build.json"
echo '{}' > "$DIST/version.json"
: > "$DIST/sw.js"; : > "$DIST/bundle.js"; : > "$DIST/bundle.css"; : > "$DIST/workbox.js"
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $CMAKE_ARGS \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$WORK/cmake.log"
cmake --build "$WORK/build" --target llama-server -j "${JOBS:-2}" >"$WORK/build.log" \
  || { tail -40 "$WORK/build.log"; exit 1; }
mkdir -p "$OUT/bin"
cp "$WORK/build/bin/llama-server" "$OUT/bin/llama-server"
echo "$VERSION" > "$OUT/version"
echo "built $OUT/bin/llama-server (llama-cpp-python $VERSION)"
