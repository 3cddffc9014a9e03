"""The GGUF models and SAEs the steering and monitoring benchmarks run their
GGUF mode on, and what both modes share to time them.

Two models, both Q8_0 (what a CPU user picks): the demo model's export
(millm-tiny-gguf:Q8_0, 2 layers, 64 wide, where per-step overhead is all
there is) and the ~100M-parameter Llama of bench/hardware_limit.py exported
the same way (16 layers, 768 wide, where the weights' reads dominate a step).
The demo model steers with its trained SAEs; the 100M model gets SAEs of
random weights at the layers asked for (speed does not depend on them).

Each model is served by an engine of its own on one core (the first, where
there are several; the clients get the rest), locked to that model.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass

from tests import harness
from tests.grpc_helpers import chat_request


@dataclass(frozen=True)
class BenchModel:
    name: str  # a short label for the report
    model_id: str
    models_dir: pathlib.Path
    saes_dir: pathlib.Path
    saes: dict[int, str]  # layer -> SAE id
    d_sae: int

    def engine(self, data: pathlib.Path, cpus: set[int] | None, **env: str):
        """Start this model's engine (wait with harness.wait_serving)."""
        return harness.start_engine(
            data, cpus, MILLM_MODELS_DIR=str(self.models_dir), MILLM_MODEL=self.model_id,
            MILLM_LOCK_MODEL=self.model_id, MILLM_SAES_DIR=str(self.saes_dir),
            MILLM_LOG_LEVEL="WARNING", **env)


def demo() -> BenchModel:
    models = harness.models_dir()
    return BenchModel("demo 2L/64", "millm-tiny-gguf:Q8_0", models, models / "saes",
                      {0: "sae_millm-tiny-res-l0", 1: "sae_millm-tiny-res-l1"}, 128)


def _random_sae(directory: pathlib.Path, d_in: int, d_sae: int, layer: int, seed: int) -> None:
    import json

    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d_in, "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_post", "hook_layer": layer}))
    generator = torch.Generator().manual_seed(seed)
    decoder = torch.randn(d_sae, d_in, generator=generator)
    decoder /= decoder.norm(dim=1, keepdim=True)  # unit directions, as trained SAEs keep them
    save_file({"W_enc": decoder.T.contiguous(), "W_dec": decoder,
               "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)},
              str(directory / "sae_weights.safetensors"))


def hundred_million(where: pathlib.Path, layers: tuple[int, ...] = (8, 12),
                    d_sae: int = 1024) -> BenchModel:
    """bench/hardware_limit.py's 100M Llama, exported to Q8_0 only, under
    `where`; random SAEs at `layers`. Takes a minute or two on one core."""
    from bench import hardware_limit

    models, saes = where / "models", where / "saes"
    models.mkdir(parents=True)
    started = time.perf_counter()
    hardware_limit.build(models, "float32", True, quants=("Q8_0",))
    shutil.rmtree(models / hardware_limit.MODEL)  # the checkpoint was only the export's source
    width = hardware_limit.CONFIG["hidden_size"]
    ids = {}
    for i, layer in enumerate(layers):
        _random_sae(saes / f"hl-100m-res-l{layer}", width, d_sae, layer, seed=i)
        ids[layer] = f"sae_hl-100m-res-l{layer}"
    print(f"built {hardware_limit.GGUF_REPO}:Q8_0 and its SAEs in "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    return BenchModel("100M 16L/768", f"{hardware_limit.GGUF_REPO}:Q8_0", models, saes, ids,
                      d_sae)


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(the engines' core, the clients' cores), or (None, None) on one core."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) > 1 else (None, None)


def warmup(model_id: str):
    return chat_request("Hi", model=model_id, max_tokens=4)


async def step_ms(stub, request) -> float:
    """Milliseconds per decode step of one streamed generation: the time from
    its first token to its last over the steps between (prefill left out)."""
    stamps: list[tuple[float, int]] = []
    async for response in stub.Generate(request, timeout=600):
        produced = sum(len(c.token_ids) for c in response.choices)
        if produced:
            stamps.append((time.perf_counter(), produced))
    steps = sum(n for _, n in stamps[1:])
    return (stamps[-1][0] - stamps[0][0]) * 1000 / steps if steps else float("nan")


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def run_models(args, title: str, each) -> int:
    """The GGUF benches' driver: the demo model, then (unless --no-100m) the
    100M one, each served on the engine's CPUs with the clients on the rest;
    `each(tmp, index, model, engine_cpus)` measures one."""
    engine_cpus, client_cpus = split_cpus()
    print(title, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = [demo()]
        if args.big:
            models.append(hundred_million(tmp / "hl"))
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        for i, model in enumerate(models):
            each(tmp, i, model, engine_cpus)
    return 0
