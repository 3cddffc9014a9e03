#!/usr/bin/env bash
# The hardware-limit measurement on a CUDA card (bench/hardware_limit.py):
# builds a ~1B-parameter random Llama (Llama 3.2 1B's shape, the demo
# tokenizer) locally in bfloat16, serves it with the transformers engine on the
# card, measures the card's copy bandwidth with torch, and prints decode
# tokens/s at batch 1 and at 64 clients against the bandwidth limit. Downloads
# nothing: it needs the repository's venv (make setup) and the demo model
# (make model), both built offline.
#
#   bench/gpu.sh            on a machine with CUDA
#   bench/gpu.sh --dry-run  anywhere: a 1-layer 100M-shape model on the CPU,
#                           to check the script itself in a minute
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD:$PWD/clients/python/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${1:-}" == "--dry-run" ]]; then
  exec "$PY" bench/hardware_limit.py --device cpu --size 100m --layers 1 --no-gguf \
    --no-serial --clients 1,4 --tokens 8 --decode-tokens 8
fi

"$PY" - <<'PYCHECK'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("bench/gpu.sh: no CUDA device (torch.cuda.is_available() is False); "
             "use --dry-run to check the script on a CPU")
print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}", file=sys.stderr)
PYCHECK
"$PY" -m service.demo_model >/dev/null  # the demo tokenizer the model reuses
exec "$PY" bench/hardware_limit.py --device cuda --size 1b --no-gguf --no-serial \
  --clients 1,64 --tokens 64 --decode-tokens 128 "$@"
