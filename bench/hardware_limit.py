"""Hardware-limit benchmark: a realistic-size model against what memory allows.

The other benchmarks use the 2-layer, 64-wide demo model, where per-step
Python overhead is everything; they cannot say how close miLLM comes to the
machine. This one builds a ~100M-parameter Llama offline (random weights:
speed does not depend on them), serves it with the transformers engine and,
exported to GGUF as F32, F16 and Q8_0, with the GGUF engine, and measures the
machine's memory bandwidth in the same run (a STREAM-like copy on the
engine's core, one thread, as the engines use). Then it prints, side by side:

  1. decode tokens/s at batch 1 for each, against the bandwidth limit: at
     batch 1 every weight is read once per token, so no engine can beat
     bandwidth / bytes of weights read per token; the ratio says how much of
     that limit each reaches (the KV cache of these short prompts is ignored);
  2. beside the transformers engine, the two bounds it meets on a CPU: a plain
     transformers `generate()` of the same checkpoint (greedy, same prompt and
     tokens, one thread on the engine's core), and a one-thread float32
     matrix-vector microbenchmark over the model's own weight shapes
     (bench/gemv.py), in PyTorch's default layout and in the engine's oneDNN
     packed one, as GB/s and as a share of the copy bandwidth;
  3. aggregate tokens/s of the transformers engine at 1, 4, 16 and 64
     closed-loop clients, continuous batching against the same engine forced
     to one request at a time (MILLM_BATCHING=serial; its throughput does not
     depend on the number of clients, so it is measured once).

Every generation runs to its max_tokens (ignore_eos). With two or more cores
the engines get the first core and this process (the clients) the rest; only
one engine is busy at a time. Takes a few minutes on two cores.

On a machine with CUDA, `bench/gpu.sh` runs the same measurement on the card
(`--device cuda --size 1b --no-gguf`): a ~1B-parameter Llama in bfloat16, the
card's own copy bandwidth, batch 1 and 64.

Usage: python bench/hardware_limit.py [--tokens 32] [--clients 1,4,16,64] [--layers 16]
       [--size 100m|1b] [--device cpu|cuda] [--no-gguf] [--no-baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import gemv  # noqa: E402
from millm.v1 import (  # noqa: E402
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
)
from service.demo_model import gguf_export  # noqa: E402
from service.demo_model.families import TOKENIZER_FILES  # noqa: E402
from tests import harness  # noqa: E402
from tests.grpc_helpers import prompt_request  # noqa: E402

MODEL, GGUF_REPO = "hl-100m", "hl-100m-gguf"
QUANTS = ("F32", "F16", "Q8_0")
SIZES = {
    "100m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 16,
             "num_attention_heads": 12, "num_key_value_heads": 4,
             "max_position_embeddings": 2048},
    # Llama 3.2 1B's shape, with the demo tokenizer's vocabulary.
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 2048},
}
CONFIG = dict(SIZES["100m"])
PROMPTS = ["The river ran", "In the morning the market", "The lighthouse keeper",
           "Gardens need patience", "The train left the station", "Cats sleep"]


def build(models: pathlib.Path, dtype: str, gguf: bool, quants: tuple[str, ...] = QUANTS) -> int:
    """The checkpoint (stored in `dtype`) and its GGUF files in `quants`;
    returns its parameter count."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    demo = harness.models_dir() / "millm-tiny"
    torch.manual_seed(0)
    # The tokenizer's real size (build.VOCAB_SIZE is only its trainer's
    # ceiling): a GGUF's embedding table must have one row per token.
    vocab = json.loads((demo / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(vocab_size=vocab, bos_token_id=None, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=True, **CONFIG)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)
    target = models / MODEL
    model.to(getattr(torch, dtype)).save_pretrained(target)
    for name in (*TOKENIZER_FILES, "chat_template.jinja"):
        if (demo / name).exists():
            shutil.copy(demo / name, target / name)
    (target / gguf_export.METADATA_FILE).write_text(json.dumps({"id": MODEL, "created": 0}))
    if not gguf:
        return sum(p.numel() for p in model.parameters())
    (models / GGUF_REPO).mkdir()
    for quant in quants:
        gguf_export.write_file(target, models / GGUF_REPO / f"{GGUF_REPO}-{quant}.gguf", quant,
                               GGUF_REPO)
    return sum(p.numel() for p in model.parameters())


def copy_bandwidth(device: str, mib: int = 256, repeats: int = 7) -> float:
    """Bytes/s of a copy (read + write counted, as STREAM does): one thread on
    a CPU, the whole card on CUDA (1 GiB there, past any cache)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    try:
        source = torch.ones((mib if device == "cpu" else 1024) * 2**20 // 4, device=device)
        target = torch.empty_like(source)
        best = float("inf")
        for _ in range(repeats):
            sync()
            started = time.perf_counter()
            target.copy_(source)
            sync()
            best = min(best, time.perf_counter() - started)
        return 2 * source.numel() * 4 / best
    finally:
        torch.set_num_threads(threads)


def bytes_per_token(models: pathlib.Path, model: str, params: int, width: int) -> int:
    """Weight bytes one decode step reads: every tensor, but only one row of the
    input embedding. The checkpoint's output head is the (tied) embedding,
    read whole; the GGUF export writes the head as a tensor of its own.
    `width`: bytes per parameter as the transformers engine computes."""
    if ":" not in model:
        return width * (params + CONFIG["hidden_size"])
    import gguf

    quant = model.split(":")[1]
    reader = gguf.GGUFReader(str(models / GGUF_REPO / f"{GGUF_REPO}-{quant}.gguf"))
    total = 0
    for tensor in reader.tensors:
        size = int(tensor.n_bytes)
        if tensor.name == "token_embd.weight":
            size //= int(tensor.n_elements) // CONFIG["hidden_size"]  # one row of the table
        total += size
    return total


async def decode_rate(stub, model: str, tokens: int, ids: list | None = None) -> float:
    """Tokens/s after the first token of one streamed greedy generation; its
    token ids go to `ids` when given."""
    request = prompt_request(PROMPTS[0], model=model, max_tokens=tokens, temperature=0,
                             ignore_eos=True)
    stamps: list[tuple[float, int]] = []
    async for response in stub.Generate(request, timeout=600):
        produced = sum(len(c.token_ids) for c in response.choices)
        if produced:
            stamps.append((time.perf_counter(), produced))
            if ids is not None:
                ids.extend(t for c in response.choices for t in c.token_ids)
    (first, _), (last, _) = stamps[0], stamps[-1]
    return (sum(n for _, n in stamps) - stamps[0][1]) / (last - first)


def generate_rate(path: pathlib.Path, tokens: int) -> tuple[float, list[int]]:
    """A plain transformers `generate()` of the checkpoint, on this process's
    cores with one thread: tokens/s after the first token (as decode_rate
    counts them) and the greedy token ids. Ends only at `tokens` (the end of
    sequence suppressed, as ignore_eos does), and the special tokens the
    engine never generates are suppressed too."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times: list[float] = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        prompt = torch.tensor([tokenizer(PROMPTS[0])["input_ids"]])
        eos = model.generation_config.eos_token_id
        suppress = sorted({*tokenizer.all_special_ids, *(eos if isinstance(eos, list) else [eos]),
                           *range(len(tokenizer), model.config.vocab_size)} - {None})
        kwargs = dict(attention_mask=torch.ones_like(prompt), do_sample=False,
                      max_new_tokens=tokens, suppress_tokens=suppress)
        with torch.inference_mode():
            model.generate(prompt, **dict(kwargs, max_new_tokens=4))  # warm-up
            stamps = Stamps()  # put(): the prompt, then each new token
            out = model.generate(prompt, streamer=stamps, **kwargs)
        first, last = stamps.times[1], stamps.times[-1]
        return (len(stamps.times) - 2) / (last - first), out[0, prompt.shape[1]:].tolist()
    finally:
        torch.set_num_threads(threads)


async def aggregate(stub, model: str, clients: int, requests: int, tokens: int) -> float:
    """Closed-loop clients: aggregate generated tokens/s over `requests` requests."""
    generated = 0

    async def worker(c: int):
        nonlocal generated
        for r in range(c, requests, clients):
            request = prompt_request(PROMPTS[r % len(PROMPTS)], model=model, max_tokens=tokens,
                                     temperature=0, ignore_eos=True)
            async for response in stub.Generate(request, timeout=1200):
                if response.HasField("usage"):
                    generated += response.usage.completion_tokens

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in range(clients)))
    return generated / (time.perf_counter() - started)


async def measure(port: int, serial_port: int | None, args) -> dict:
    out: dict = {"decode": {}, "batched": {}}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        await decode_rate(stub, MODEL, 4)  # warm-up
        out["ids"] = []
        out["decode"][MODEL] = await decode_rate(stub, MODEL, args.decode_tokens, out["ids"])
        if serial_port is not None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{serial_port}") as serial_channel:
                serial = generation_service_pb2_grpc.GenerationServiceStub(serial_channel)
                await aggregate(serial, MODEL, 1, 1, 4)
                out["serial"] = await aggregate(serial, MODEL, 1, args.serial_requests,
                                                args.tokens)
        for clients in args.clients:
            out["batched"][clients] = await aggregate(stub, MODEL, clients, max(clients, 4),
                                                      args.tokens)
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        for quant in QUANTS if args.gguf else ():
            name = f"{GGUF_REPO}:{quant}"
            await models.LoadModel(model_service_pb2.LoadModelRequest(id=name), timeout=600)
            await decode_rate(stub, name, 4)
            out["decode"][name] = await decode_rate(stub, name, args.decode_tokens)
    return out


def report(results: dict, bandwidth: float, params: int, per_token: dict, args) -> None:
    where = "one-thread copy, engine core" if args.device == "cpu" else "device copy"
    print(f"\nmodel: Llama, {params / 1e6:.1f}M parameters ({json.dumps(CONFIG)})")
    print(f"memory bandwidth ({where}): {bandwidth / 1e9:.2f} GB/s\n")
    print("decode at batch 1 against the bandwidth limit (bandwidth / weight bytes per token)")
    print(f"{'engine / file':<28}{'MB/token':>10}{'limit tok/s':>13}{'tok/s':>9}{'ratio':>8}")
    rows = dict(results["decode"])
    if "generate" in results:
        rows["generate"] = results["generate"][0]
    for name, rate in rows.items():
        limit = bandwidth / per_token[MODEL if name == "generate" else name]
        engine = ("gguf " + name.split(":")[1] if ":" in name
                  else f"plain generate() {args.dtype}" if name == "generate"
                  else f"transformers {args.dtype}")
        print(f"{engine:<28}{per_token[MODEL if name == 'generate' else name] / 1e6:>10.1f}"
              f"{limit:>13.1f}{rate:>9.1f}{rate / limit:>8.0%}")
    if "generate" in results:
        rate, ids = results["generate"]
        same = "equal" if ids == results["ids"] else "DIFFERENT"
        layout = os.environ.get("MILLM_TORCH_LINEAR", "auto")
        print(f"transformers engine (MILLM_TORCH_LINEAR={layout}: its weight layout) / plain "
              f"generate() (PyTorch's layout): {results['decode'][MODEL] / rate:.2f}x, "
              f"greedy tokens {same}; the gemv table below shows the layout's own share")
    if "gemv" in results:
        print()
        gemv.report(results["gemv"], bandwidth, per_token[MODEL], results["linears"])
    serial = results.get("serial")
    if serial:
        print(f"\ntransformers engine, serial: {serial:.1f} tok/s (one request at a time, "
              "any number of clients)")
    # N rows share each read of the weights: N x the batch-1 limit, if memory were all.
    limit = bandwidth / per_token[MODEL]
    print(f"{'clients':>8}{'batched tok/s':>15}{'batched/serial':>16}{'of N x limit':>14}")
    for clients, rate in results["batched"].items():
        ratio = f"{rate / serial:>15.1f}x" if serial else f"{'-':>16}"
        print(f"{clients:>8}{rate:>15.1f}{ratio}{rate / (clients * limit):>14.0%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens per batched request")
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--serial-requests", type=int, default=6)
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--layers", type=int, help="fewer for a quick dry run of the script")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-gguf", dest="gguf", action="store_false",
                        help="skip the GGUF files (llama.cpp runs on the CPU here)")
    parser.add_argument("--no-serial", dest="serial", action="store_false",
                        help="skip the one-request-at-a-time engine")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip plain generate() and the matrix-vector microbenchmark")
    args = parser.parse_args()
    CONFIG.clear()
    CONFIG.update(SIZES[args.size])
    if args.layers:
        CONFIG["num_hidden_layers"] = args.layers
    # The transformers engine computes in float32 on a CPU, in the stored dtype on CUDA.
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    args.clients = [int(c) for c in args.clients.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus, client_cpus = ({cpus[0]}, set(cpus[1:])) if len(cpus) > 1 else (None, None)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = tmp / "models"
        models.mkdir()
        started = time.perf_counter()
        params = build(models, args.dtype, args.gguf)
        print(f"built {MODEL} in {time.perf_counter() - started:.0f}s", file=sys.stderr)
        width = 4 if args.dtype == "float32" else 2
        names = (MODEL, *(f"{GGUF_REPO}:{q}" for q in (QUANTS if args.gguf else ())))
        per_token = {name: bytes_per_token(models, name, params, width) for name in names}
        if engine_cpus:
            os.sched_setaffinity(0, engine_cpus)
        bandwidth = copy_bandwidth(args.device)
        baseline = {}
        if args.baseline and args.device == "cpu":
            # On the engine's core, one thread, before the engines start.
            vocab = json.loads((models / MODEL / "config.json").read_text())["vocab_size"]
            shapes = gemv.decode_shapes(CONFIG, vocab)
            baseline["gemv"], baseline["linears"] = gemv.measure(shapes), len(shapes)
            baseline["generate"] = generate_rate(models / MODEL, args.decode_tokens)
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        env = {"MILLM_MODELS_DIR": str(models), "MILLM_MODEL": MODEL,
               "MILLM_DEVICE": args.device}
        for name in ("batched", "serial"):
            (tmp / name).mkdir()
        engines = [harness.start_engine(tmp / "batched", engine_cpus, **env)]
        if args.serial:
            engines.append(harness.start_engine(tmp / "serial", engine_cpus,
                                                MILLM_BATCHING="serial", **env))
        try:
            for process, port in engines:
                harness.wait_serving(process, port, timeout=600)
            serial_port = engines[1][1] if args.serial else None
            results = asyncio.run(measure(engines[0][1], serial_port, args))
            results.update(baseline)
        finally:
            for process, _ in engines:
                process.stop()
    report(results, bandwidth, params, per_token, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
