"""humming (`humming-kernels` on PyPI): vLLM's quantized-GEMM backend, fed fp4lab's FP4 weights.

humming reads checkpoints through its own schemas; fp4lab's `QuantizedTensor` maps onto two:
- NVFP4, humming's modelopt schema (`{"quant_method": "modelopt", "quant_algo": "nvfp4"}`):
  `weight` uint8 [N, K/2] (element 2i in the low nibble), `weight_scale` float8_e4m3fn [N, K/16],
  `weight_scale_2` float32 [1] = 1 / global_scale (modelopt stores the DECODE scale, fp4lab the
  encode scale 448*6/amax);
- MXFP4, humming's mxfp4 schema (`{"quant_method": "mxfp4"}`, as gpt-oss checkpoints):
  `weight` uint8 [N, K/2], `weight_scale` uint8 e8m0 [N, K/32].
An expert stack [E, N, K] adds the leading E to each (`weight_scale_2` becomes [E]).
`HummingLayer.transform()` repacks them into humming's kernel layout once, in `prepare`.

On Hopper this is W4A16 (FP4 weights decoded in registers, bf16 tensor-core math); on Blackwell
humming also runs W4A4, NVFP4 activations too (modelopt's static tensor scale; the e4m3 scale of
each 16 activations is computed per call by humming's own quantize kernel, inside the timed call).

Compile cache: humming JIT-compiles the kernels of each new layer shape on its first call (nvcc,
or NVRTC with HUMMING_COMPILER=nvrtc): ~12 s per shape on the H200. The cubins are kept under
$HUMMING_CACHE_DIR (default ~/.humming/cache/), so a later process with the same cache skips the
compile. `prepare` makes that first call, so compilation never lands in a timing, and reports its
seconds as `Prepared.info["compile_s"]` (near 0 when the cache already held the kernels).

Shape legend: `M` activation rows, `N` weight rows (output features), `K` reduction dimension,
`E` experts of a stacked weight.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from fp4lab.backends.base import (
    BF16_MIN_CAPABILITY, BLACKWELL_FP4_CAPABILITIES, OUTPUT_DTYPE, Backend, Requirements,
    prepared_from, resolve_device,
)
from fp4lab.formats import E2M1_MAX, E4M3_MAX, QuantizedTensor

PIP_NAME = "humming-kernels"
DEFAULT_CACHE_DIR = "~/.humming/cache/"
REQUIRES_W4A16 = Requirements(min_capability=BF16_MIN_CAPABILITY, unit="bf16 tensor cores",
                              module="humming", pip_name=PIP_NAME)
REQUIRES_W4A4 = Requirements(capabilities=BLACKWELL_FP4_CAPABILITIES, unit="FP4 tensor cores",
                             module="humming", pip_name=PIP_NAME)
# modelopt NVFP4 activations: a static float32 tensor scale (`input_scale`, the decode scale
# amax/(448*6)), e4m3 scales per 16 computed per call
NVFP4_ACTIVATIONS = {"quant_method": "modelopt", "quant_algo": "nvfp4"}
# every tensor a transformed HummingLayer may hold, as humming_forward names them
CALL_TENSORS = ("weight", "weight_scale", "zero_point", "bias", "weight_scale_2", "input_scale",
                "input_scale_2")


def compile_cache_dir() -> str:
    """Where humming keeps its compiled kernels ($HUMMING_CACHE_DIR, else ~/.humming/cache/)."""
    return os.environ.get("HUMMING_CACHE_DIR") or os.path.expanduser(DEFAULT_CACHE_DIR)


def weight_config(fmt: str) -> dict:
    """humming's checkpoint schema for fp4lab's `fmt` (a fresh dict: HummingLayer edits it)."""
    if fmt == "nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "nvfp4"}
    return {"quant_method": "mxfp4"}


def checkpoint_tensors(w: QuantizedTensor) -> dict[str, torch.Tensor]:
    """`w` ([N, K] or [E, N, K]) as the tensors of humming's schema for its format."""
    tensors = {"weight": w.packed.contiguous(), "weight_scale": w.scales.contiguous()}
    if w.fmt == "nvfp4":
        tensors["weight_scale_2"] = (1.0 / w.global_scale.float()).reshape(-1)   # [1] or [E]
    return tensors


@dataclass
class HummingGemm:
    """One transformed humming layer as a function of its tensors, so that the timer can rotate
    copies of them (cold L2): the call `HummingLayer.forward` makes, with the tensors passed in."""

    config: object                 # the layer's humming_config (a humming LayerConfig)
    names: tuple[str, ...]         # which of CALL_TENSORS the layer holds, in `tensors` order
    tensors: tuple                 # the transformed tensors themselves
    locks: torch.Tensor            # stream-K synchronization state, one per layer

    def __call__(self, inputs: torch.Tensor, tensors: tuple, outputs: torch.Tensor | None,
                 **routing) -> torch.Tensor:
        from humming.forward import humming_forward

        return humming_forward(self.config, inputs=inputs, outputs=outputs, locks=self.locks,
                               **dict(zip(self.names, tensors)), **routing)


def load_layer(w: QuantizedTensor, device: str, input_config: dict | None = None,
               input_tensors: dict[str, torch.Tensor] | None = None) -> HummingGemm:
    """A HummingLayer built on `device`, loaded with `w` through humming's schema, transformed."""
    from humming.layer import HummingLayer

    experts = w.shape[0] if len(w.shape) == 3 else None
    with torch.device(device):   # HummingLayer allocates its parameters with torch.empty
        layer = HummingLayer(shape_n=w.shape[-2], shape_k=w.shape[-1],
                             weight_config=weight_config(w.fmt),
                             input_config=dict(input_config) if input_config else None,
                             num_experts=experts, torch_dtype=torch.bfloat16)
    layer.load_from_tensors({**checkpoint_tensors(w.to(device)), **(input_tensors or {})})
    layer.transform()
    names = tuple(name for name in CALL_TENSORS if getattr(layer, name, None) is not None)
    return HummingGemm(config=layer.humming_config, names=names,
                       tensors=tuple(getattr(layer, name).data for name in names),
                       locks=layer.locks)


def timed_first_call(call: Callable[[], torch.Tensor]) -> float:
    """Seconds the first call takes to finish (humming compiles, or loads from its cache, here)."""
    start = time.perf_counter()
    result = call()
    if result.is_cuda:
        torch.cuda.synchronize(result.device)
    return time.perf_counter() - start


# -- NVFP4 activations as humming quantizes them (W4A4) -------------------------------------------

def activation_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """modelopt's static activation scale: the DECODE scale amax(|x|) / (448 * 6), float32 [1]."""
    amax = x.float().abs().amax().clamp(min=1e-12)
    return (amax / (E4M3_MAX * E2M1_MAX)).reshape(1)


def round_up_e4m3(values: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn of non-negative float32 `values` <= 448, rounded up (never below the value),
    as humming rounds its activation group scales so that no scaled value passes 6."""
    nearest = values.to(torch.float8_e4m3fn)
    below = nearest.float() < values
    bumped = (nearest.view(torch.uint8) + below.to(torch.uint8)).view(torch.float8_e4m3fn)
    return bumped


def nvfp4_static_activations(x: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """float32 x [..., K] as a W4A4 kernel multiplies it: e2m1 values times e4m3 group scales
    (per 16, rounded up) times the static decode `tensor_scale`."""
    from fp4lab.formats import e2m1_decode, e2m1_encode

    k = x.shape[-1]
    blocks = x.float().reshape(-1, k // 16, 16)                                 # [R, K/16, 16]
    ideal = blocks.abs().amax(dim=-1) / E2M1_MAX / tensor_scale                 # [R, K/16]
    decode = round_up_e4m3(ideal.clamp(max=E4M3_MAX)).float() * tensor_scale   # [R, K/16]
    inverse = torch.where(decode > 0, 1.0 / decode, torch.zeros_like(decode)).unsqueeze(-1)
    values = e2m1_decode(e2m1_encode(blocks * inverse))                         # [R, K/16, 16]
    return (values * decode.unsqueeze(-1)).reshape(x.shape)


# -- the backends ---------------------------------------------------------------------------------

class HummingW4A16(Backend):
    """humming's dense GEMM of bf16 activations and FP4 weights (W4A16: what runs on Hopper)."""

    name = "humming-w4a16"
    formats = ("nvfp4", "mxfp4")
    library = "humming"
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = REQUIRES_W4A16
    what = ("humming W4A16: FP4 weights (modelopt NVFP4 / MXFP4 schema) decoded in registers, "
            "bf16 tensor-core math; JIT-compiled in prepare")

    def activations(self, a: torch.Tensor) -> tuple[dict | None, dict, torch.Tensor]:
        """(humming input config, its input tensors, what the kernel multiplies) for a [M, K]."""
        return None, {}, a.float()

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        device = resolve_device(device)
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()             # [M, K]
        input_config, input_tensors, ref_a = self.activations(a_bf16)
        gemm = load_layer(w, device, input_config, input_tensors)
        out = torch.empty(a.shape[0], w.shape[0], dtype=OUTPUT_DTYPE, device=device)  # [M, N]

        def run(a_arg, *tensors_then_out):
            return gemm(a_arg, tensors_then_out[:-1], tensors_then_out[-1])

        prepared = prepared_from(run, (a_bf16, *gemm.tensors), out, ref_a=ref_a,
                                 ref_w=formats.dequantize(w.to(device)))
        prepared.info.update(compile_s=round(timed_first_call(prepared.call), 3),
                             compile_cache=compile_cache_dir())
        return prepared


class HummingW4A4(HummingW4A16):
    """humming's dense GEMM with NVFP4 activations too: FP4 tensor cores, so Blackwell only."""

    name = "humming-w4a4"
    formats = ("nvfp4",)
    act_dtype = "fp4"
    requires = REQUIRES_W4A4
    what = ("humming W4A4: NVFP4 weights and activations (static tensor scale, group scales "
            "computed per call inside the timed call), FP4 tensor-core math")

    def activations(self, a):
        scale = activation_tensor_scale(a)
        return NVFP4_ACTIVATIONS, {"input_scale": scale}, nvfp4_static_activations(a, scale)
