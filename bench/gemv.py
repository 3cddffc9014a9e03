"""One-thread float32 matrix-vector products over a Llama's own weight shapes.

At batch 1 a decode step of the transformers engine is, for the most part, one
matrix-vector product per linear layer, each reading its whole weight once; so
the speed at which one thread streams weights through those products bounds
its decode speed, and comparing that with the copy bandwidth says how much of
the machine the products reach. `bench/hardware_limit.py` prints this table
beside the engine's own figure.

Two layouts are measured: PyTorch's default (`F.linear` on the row-major
`[out, in]` weight) and the engine's oneDNN-packed one
(service/engines/transformers/packed_linear.py, called as the engine calls
it). Each shape is measured over enough copies of it to leave the caches
behind (weights stream from memory, as they do at decode), and the whole
model in the order of a decode step.

Usage: python bench/gemv.py [--layers 16] (the 100M shapes of hardware_limit.py)
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SET_BYTES = 256 * 2**20  # copies of one shape: past any cache


def decode_shapes(config: dict, vocab: int) -> list[tuple[int, int]]:
    """(out, in) of each linear a Llama decode step runs, in order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),
             (inter, hidden), (inter, hidden), (hidden, inter)]
    return layer * config["num_hidden_layers"] + [(vocab, hidden)]


def _best(run, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def _rate(weights: list, repeats: int) -> dict[str, float]:
    """Bytes/s through `weights` one row at a time, in each layout."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from service.engines.transformers.packed_linear import PackedLinear

    inputs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    size = sum(w.numel() * w.element_size() for w in weights)
    rates = {"plain": size / _best(lambda: [F.linear(inputs[w.shape[1]], w) for w in weights],
                                   repeats)}
    packed = []
    for i, w in enumerate(weights):  # packed one by one: the plain copy goes as it is packed
        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight = nn.Parameter(w, requires_grad=False)
        packed.append(PackedLinear(linear))
        weights[i] = None
    rates["packed"] = size / _best(lambda: [p(inputs[p.in_features]) for p in packed], repeats)
    return rates


def measure(shapes: list[tuple[int, int]], repeats: int = 5) -> dict[str, dict[str, float]]:
    """{row name: {layout: bytes/s}} for each distinct shape and the whole step,
    on one thread of the calling process's cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            results = {}
            for out, inp in sorted(set(shapes)):
                copies = max(1, SET_BYTES // (out * inp * 4))
                results[f"{out}x{inp}"] = _rate([torch.randn(out, inp) for _ in range(copies)],
                                                repeats)
            results["decode step"] = _rate([torch.randn(s) for s in shapes], repeats)
            return results
    finally:
        torch.set_num_threads(threads)


def report(results: dict[str, dict[str, float]], bandwidth: float, per_token: int | None = None,
           linears: int = 0) -> None:
    print("one-thread float32 matrix-vector products (batch 1, weights from memory), "
          "against the copy bandwidth")
    print("(packed: every shape packed, as MILLM_TORCH_LINEAR=packed does; the default, auto, "
          "packs only a model past packed_linear.AUTO_MIN_BYTES, and a tied output head only "
          "within SHARED_COPY_SHARE)")
    print(f"{'shape (out x in)':<24}{'plain GB/s':>12}{'of copy':>9}{'packed GB/s':>13}"
          f"{'of copy':>9}")
    for name, rates in results.items():
        label = f"whole step ({linears} linears)" if name == "decode step" and linears else name
        print(f"{label:<24}{rates['plain'] / 1e9:>12.2f}{rates['plain'] / bandwidth:>9.0%}"
              f"{rates['packed'] / 1e9:>13.2f}{rates['packed'] / bandwidth:>9.0%}")
    if per_token:
        step = results["decode step"]
        print(f"linears alone at these rates: {step['plain'] / per_token:.1f} tok/s plain, "
              f"{step['packed'] / per_token:.1f} tok/s packed")


def main() -> int:
    import json

    from bench import hardware_limit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    config = dict(hardware_limit.SIZES["100m"], num_hidden_layers=args.layers)
    vocab = json.loads((hardware_limit.harness.models_dir() / "millm-tiny" /
                        "config.json").read_text())["vocab_size"]
    shapes = decode_shapes(config, vocab)
    bandwidth = hardware_limit.copy_bandwidth("cpu")
    results = measure(shapes)
    print(f"copy bandwidth (one thread): {bandwidth / 1e9:.2f} GB/s")
    report(results, bandwidth, sum(o * i * 4 for o, i in shapes), len(shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
