"""Linear layers in oneDNN's packed weight layout, for float32 models on a CPU.

At batch 1 a decode step is matrix-vector products over every weight, so its
speed is how fast the weights stream from memory. PyTorch's default float32
linear (MKL's GEMM/GEMV on the row-major `[out, in]` weight) streams them at
well under the machine's copy bandwidth on one thread, and its small-batch GEMM
(4 to 16 rows, the decode steps of a busy lane) is no better. The same
products through oneDNN, on a weight reordered once at load into the blocked
layout its kernels read, run faster at every batch size measured here
(`bench/hardware_limit.py` prints both beside the copy bandwidth).

The gain is in streaming weights from memory; each packed call also costs
about 12 microseconds more than PyTorch's own, which a model whose weights sit
in the CPU's caches notices (the 64-wide demo model decodes slower packed).
So the default, `auto`, packs only a model whose float32 linear weights reach
`AUTO_MIN_BYTES`; `packed` packs any model.

oneDNN picks a slower matrix-vector kernel below four rows, so a product of
fewer rows is padded with zero rows to four: the weights are read once either
way, and the extra rows cost arithmetic a memory-bound step has to spare.

The results are float32 sums in another order, so they differ from the
default path in the last bits, as the default path's batch-1 and batch-16
results already differ from each other (oneDNN's are closer to being the same
row for row at any batch size). Greedy text was equal on every prompt we
compared (docs/performance.md); MILLM_TORCH_LINEAR=plain keeps PyTorch's own
linear for anyone who needs its exact bits.

`bf16` (MILLM_TORCH_LINEAR=bf16, never the default) packs the weights in
bfloat16 instead, on CPUs whose instructions oneDNN uses for it (AVX512-BF16,
AMX): half the bytes to stream at batch 1 and twice the arithmetic rate of a
busy lane, at the price of inputs rounded to bfloat16 before each product,
and of each product's result (bias added) rounded to bfloat16 before it goes
back to float32. That changes the numbers well past float32 rounding, so
greedy text can differ from the float32 engine's (docs/performance.md has the
measured share); it is there for whoever prefers the speed, and is refused
(float32 packing is used) where the CPU lacks the instructions.

Only exact `nn.Linear` modules holding float32 weights on the CPU are packed;
anything else (CUDA, half precision, a family's own projection class) keeps its
own forward. Each original weight is dropped once packed, but one another
module shares (an output head tied to the input embedding, which looks rows up
in it) must stay, so its packed copy is extra memory: it is made only while it
stays within `SHARED_COPY_SHARE` of the linear weights (the 100M benchmark
model's head, 6 %, is packed; a float32 head of 128k tokens by 2,048 beside a
1B model, a gigabyte and a fifth of it, is not). The load's memory check
does not count that copy: it comes out of the memory headroom, which past
about 4 GiB of linear weights it can outgrow. If the operators are missing
from this build of PyTorch, or a packed product disagrees with the default
one at load, the model is served unpacked and the log says why.
"""

from __future__ import annotations

import collections
import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

AUTO, PACKED, PLAIN, BF16 = "auto", "packed", "plain", "bf16"
LAYOUTS = (AUTO, PACKED, PLAIN, BF16)
AUTO_MIN_BYTES = 64 * 2**20  # past the last-level cache of common CPUs (32 MiB here)
SHARED_COPY_SHARE = 1 / 16  # a shared weight's packed copy may add this much memory
_MIN_ROWS = 4  # below this oneDNN takes its slower matrix-vector kernel


def _available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def _bf16_fast() -> bool:
    """The CPU has bfloat16 arithmetic (AVX512-BF16 or AMX). oneDNN's own
    `_is_mkldnn_bf16_supported` also says yes on AVX512 CPUs without it, where
    bfloat16 is emulated and slower than float32."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None)
              for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and check() for check in checks)


class PackedLinear(nn.Module):
    """An `nn.Linear` whose product runs on a oneDNN-packed copy of its weight."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32,
                 shared: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = dtype  # of the products (inputs and results; float32 outside)
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype))
        self.bias = linear.bias
        self._bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        if shared:
            self.weight = linear.weight  # still another module's (the embedding's)
        else:
            # Who asks for the weight's shape, dtype or device (the vocabulary
            # width is read from the output head) still gets them; no memory.
            self.weight = weight.new_zeros(()).expand(weight.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        given = x.dtype
        x = x.to(self.dtype)
        if rows >= _MIN_ROWS:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self._bias, "none", [], "")
            return out.to(given)
        flat = x.reshape(rows, self.in_features)
        padded = torch.cat([flat, flat.new_zeros(_MIN_ROWS - rows, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(padded, self.packed, self._bias, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], self.out_features).to(given)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"oneDNN packed {str(self.dtype).removeprefix('torch.')}")


def _agrees(packed: PackedLinear, linear: nn.Linear) -> bool:
    """The packed product matches the default one to the rounding of its dtype."""
    tolerance = 1e-4 if packed.dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        for rows in (1, _MIN_ROWS + 1):
            x = torch.randn(rows, linear.in_features, generator=torch.Generator().manual_seed(0))
            want = F.linear(x, linear.weight, linear.bias)
            if not torch.allclose(packed(x), want, rtol=tolerance,
                                  atol=tolerance * float(want.abs().max())):
                return False
    return True


def pack_linears(model: nn.Module, layout: str) -> int:
    """Pack every float32 CPU `nn.Linear` of `model` in place (layouts `packed`
    and `bf16`, and `auto` for a model past AUTO_MIN_BYTES); returns how many
    were packed."""
    if layout not in (AUTO, PACKED, BF16):
        return 0
    if not _available():
        log.info("oneDNN's linear operators are missing from this PyTorch: linears stay plain")
        return 0
    dtype = torch.float32
    if layout == BF16:
        if _bf16_fast():
            dtype = torch.bfloat16
            log.warning("linear layers compute in bfloat16 (MILLM_TORCH_LINEAR=bf16): greedy "
                        "text may differ from the float32 engine's")
        else:
            log.warning("this CPU has no bfloat16 instructions oneDNN uses: linears are "
                        "packed in float32")
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.dtype == torch.float32
               and child.weight.device.type == "cpu"]
    if not targets:
        return 0
    weights = sum(child.weight.numel() * 4 for _, _, child in targets)
    if layout == AUTO and weights < AUTO_MIN_BYTES:
        return 0  # in cache: PyTorch's cheaper calls win
    # How many modules hold each parameter: a shared one stays, and is packed
    # only while its copy is small beside the rest.
    holders = collections.Counter(id(p) for module in model.modules()
                                  for p in module.parameters(recurse=False))
    shared = {id(c.weight) for _, _, c in targets if holders[id(c.weight)] > 1}
    targets = [t for t in targets if id(t[2].weight) not in shared
               or t[2].weight.numel() * 4 <= SHARED_COPY_SHARE * weights]
    if not targets:
        return 0
    first = targets[0][2]
    try:
        probe = PackedLinear(first, dtype=dtype)
        if not _agrees(probe, first):
            log.warning("oneDNN's packed linear disagrees with PyTorch's here: linears stay "
                        "plain")
            return 0
    except RuntimeError as exc:
        log.warning("oneDNN's packed linear failed (%s): linears stay plain", exc)
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, dtype=dtype,
                                           shared=id(child.weight) in shared))
    return len(targets)
