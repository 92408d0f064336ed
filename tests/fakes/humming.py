"""A fake `humming` (humming-kernels 0.1.20's API as fp4lab uses it): `humming.layer.HummingLayer`,
`humming.forward.humming_forward`, `humming.tune.get_heuristics_config`.

The layer checks what it is loaded with against humming's schemas (names, shapes, dtypes: the
real `load_state_dict` would silently cast a wrong dtype), `transform()` keeps the tensors and
renames modelopt's static activation scale as humming does (`input_scale` -> `input_scale_2`).
`humming_forward` binds its arguments to the documented signature, records them, and computes
the GEMM from the tensors it is handed: dense, grouped-contiguous (`expert_layout` offsets) or
indexed (`sorted_ids` in blocks of the kernel's block_shape[0], which it reads from the same
tuning intervals the launcher would use). NVFP4 activations (W4A4) are quantized here the way
humming's reference quantizer describes it, independently of fp4lab's code.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import sys
import types
from dataclasses import dataclass, field

import torch

from fp4lab import formats

SCHEMAS = {   # humming's weight schemas: name -> (shape from (N, K), dtype)
    ("modelopt", "nvfp4"): {"weight": (lambda n, k: (n, k // 2), torch.uint8),
                            "weight_scale": (lambda n, k: (n, k // 16), torch.float8_e4m3fn),
                            "weight_scale_2": (lambda n, k: (1,), torch.float32)},
    ("mxfp4", None): {"weight": (lambda n, k: (n, k // 2), torch.uint8),
                      "weight_scale": (lambda n, k: (n, k // 32), torch.uint8)},
}
BIG = 1 << 30


def documented_humming_forward(config, inputs, weight, weight_scale=None, zero_point=None,
                               bias=None, weight_scale_2=None, outputs=None, input_scale=None,
                               input_scale_2=None, sorted_ids=None, expert_ids=None,
                               num_tokens_padded=None, expert_layout=None, locks=None, top_k=1,
                               valid_shape_m=0, compute_config=None, tuning_config=None,
                               hadamard_block_size=None, use_pdl=None):
    """humming.forward.humming_forward, as in humming-kernels 0.1.20."""


def documented_get_heuristics_config(layer_config, shape_m=None, use_f16_accum=False,
                                     use_batch_invariant=False, use_m_major_input_scale=False,
                                     gemm_type="dense", device=None):
    """humming.tune.get_heuristics_config."""


@dataclass
class FakeLayerConfig:
    fmt: str
    shape_n: int
    shape_k: int
    num_experts: int | None
    nvfp4_activations: bool


@dataclass
class FakeHumming:
    """State shared by the fake's modules: what was built and called, and how to misbehave."""

    layers: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    tune_calls: list = field(default_factory=list)
    ignore_global_scale: bool = False      # a broken kernel: drops weight_scale_2

    def block_intervals(self, config: FakeLayerConfig) -> list:
        """MoE tuning intervals [lo, hi, tuning]: shape_m in (lo, hi] runs block_shape[0] rows
        per block. Different for the two GEMMs of a layer, as humming's heuristics are."""
        if config.shape_n > config.shape_k:
            blocks = ((32, 8), (256, 16), (BIG, 48))
        else:
            blocks = ((16, 16), (BIG, 32))
        intervals, low = [], 0
        for high, block in blocks:
            intervals.append([low, high, {"block_shape": [block, 64, 64]}])
            low = high
        return intervals


def make_module(state: FakeHumming) -> dict[str, types.ModuleType]:
    """The fake package and its submodules, for sys.modules."""
    modules = {name: types.ModuleType(name) for name in
               ("humming", "humming.layer", "humming.forward", "humming.tune")}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["humming"].__version__ = "0.1.20+fake"
    modules["humming"].layer = modules["humming.layer"]
    modules["humming"].forward = modules["humming.forward"]
    modules["humming"].tune = modules["humming.tune"]
    modules["humming.layer"].HummingLayer = layer_class(state)
    modules["humming.forward"].humming_forward = forward_function(state)
    modules["humming.tune"].get_heuristics_config = tune_function(state)
    return modules


def layer_class(state: FakeHumming):
    class HummingLayer:
        def __init__(self, shape_n, shape_k, weight_config, input_config=None, pad_n_to_multiple=1,
                     pad_k_to_multiple=1, num_experts=None, has_bias=False, torch_dtype=None):
            key = (weight_config["quant_method"], weight_config.get("quant_algo"))
            assert key in SCHEMAS, f"unsupported weight config {weight_config}"
            assert torch_dtype == torch.bfloat16
            self.kwargs = dict(shape_n=shape_n, shape_k=shape_k, weight_config=dict(weight_config),
                               input_config=dict(input_config) if input_config else None,
                               num_experts=num_experts)
            self.schema = SCHEMAS[key]
            self.fmt = "nvfp4" if key[0] == "modelopt" else "mxfp4"
            self.loaded: dict[str, torch.Tensor] = {}
            self.locks = torch.zeros(2048, dtype=torch.int32)
            self.humming_config = None
            state.layers.append(self)

        def expected(self, name):
            shape_of, dtype = self.schema[name]
            shape = shape_of(self.kwargs["shape_n"], self.kwargs["shape_k"])
            experts = self.kwargs["num_experts"]
            if experts:
                shape = (experts,) if shape == (1,) else (experts, *shape)
            return shape, dtype

        def load_from_tensors(self, tensors, prefix=""):
            for name, tensor in tensors.items():
                if name == "input_scale":
                    shape, dtype = (self.kwargs["num_experts"] or 1,), torch.float32
                else:
                    shape, dtype = self.expected(name)
                assert tuple(tensor.shape) == shape, f"{name}: shape {tuple(tensor.shape)} != {shape}"
                assert tensor.dtype == dtype, f"{name}: dtype {tensor.dtype} != {dtype}"
                self.loaded[name] = tensor.clone()

        def transform(self, allow_inplace=False):
            assert set(self.schema) <= set(self.loaded), f"not loaded: {set(self.schema) - set(self.loaded)}"
            for name in self.schema:
                setattr(self, name, torch.nn.Parameter(self.loaded[name], requires_grad=False))
            nvfp4_activations = self.kwargs["input_config"] is not None
            if nvfp4_activations:   # humming keeps one static scale, renamed
                scale = self.loaded["input_scale"].float().amax().reshape(1)
                self.input_scale_2 = torch.nn.Parameter(scale, requires_grad=False)
            self.humming_config = FakeLayerConfig(self.fmt, self.kwargs["shape_n"],
                                                  self.kwargs["shape_k"], self.kwargs["num_experts"],
                                                  nvfp4_activations)

    return HummingLayer


def tune_function(state: FakeHumming):
    signature = inspect.signature(documented_get_heuristics_config)

    def get_heuristics_config(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        state.tune_calls.append(bound.arguments)
        assert bound.arguments["shape_m"] is None  # fp4lab asks for the whole interval list
        return state.block_intervals(bound.arguments["layer_config"])

    return get_heuristics_config


def decoded_weights(config: FakeLayerConfig, call: dict, ignore_global_scale: bool) -> torch.Tensor:
    """float32 [E, N, K] (E = 1 for a dense layer) from the tensors of this call."""
    experts = config.num_experts or 1
    n, k = config.shape_n, config.shape_k
    codes = formats.unpack_nibbles(call["weight"].reshape(experts, n, k // 2))
    values = formats.e2m1_decode(codes)                                          # [E, N, K]
    if config.fmt == "nvfp4":
        scales = call["weight_scale"].reshape(experts, n, k // 16).float()
        if not ignore_global_scale:
            scales = scales * call["weight_scale_2"].float().reshape(experts, 1, 1)
        block = 16
    else:
        scales = formats.exp2_exact(call["weight_scale"].reshape(experts, n, k // 32).to(torch.int32) - 127)
        block = 32
    return (values.reshape(experts, n, k // block, block) * scales.unsqueeze(-1)).reshape(experts, n, k)


def e4m3_round_up(values: torch.Tensor) -> torch.Tensor:
    """The smallest e4m3 value >= each value (a table search, not fp4lab's bit trick)."""
    table = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    index = torch.searchsorted(table, values.contiguous())
    return table[index.clamp(max=len(table) - 1)]


def quantized_activations(inputs: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """float32 [R, K]: humming's static-tensor NVFP4 activations (group scale rounded up)."""
    blocks = inputs.float().reshape(inputs.shape[0], -1, 16)
    group = e4m3_round_up(blocks.abs().amax(-1) / 6 / tensor_scale)
    scale = (group * tensor_scale).unsqueeze(-1)
    values = formats.e2m1_decode(formats.e2m1_encode(blocks / torch.where(scale > 0, scale, 1)))
    return (values * scale).reshape(inputs.shape)


def forward_function(state: FakeHumming):
    signature = inspect.signature(documented_humming_forward)

    def humming_forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = bound.arguments
        state.calls.append(call)
        config = call["config"]
        inputs = call["inputs"]
        assert inputs.dtype == torch.bfloat16 and inputs.is_contiguous()
        weights = decoded_weights(config, call, state.ignore_global_scale)      # [E, N, K]
        x = inputs.float()
        if config.nvfp4_activations:
            x = quantized_activations(inputs, call["input_scale_2"].float())
        gemm_type = (call["compute_config"] or {}).get("gemm_type", "dense")
        result = ROUTINES[gemm_type](x, weights, call, state)                 # float32
        outputs = call["outputs"]
        if outputs is None:
            return result.to(torch.bfloat16)
        assert tuple(outputs.shape) == tuple(result.shape), (outputs.shape, result.shape)
        return outputs.copy_(result)

    return humming_forward


def dense(x, weights, call, state):
    assert weights.shape[0] == 1
    return x @ weights[0].T


def grouped_contiguous(x, weights, call, state):
    layout = call["expert_layout"]
    assert layout.dtype in (torch.int32, torch.int64) and tuple(layout.shape) == (weights.shape[0] + 1,)
    assert int(layout[-1]) == x.shape[0], "expert_layout must end at the row count"
    out = torch.zeros(x.shape[0], weights.shape[1])
    for e in range(weights.shape[0]):
        start, end = int(layout[e]), int(layout[e + 1])
        out[start:end] = x[start:end] @ weights[e].T
    return out


def indexed(x, weights, call, state):
    for name in ("sorted_ids", "expert_ids", "num_tokens_padded"):
        assert call[name].dtype == torch.int32, f"{name} must be int32"
    top_k = call["top_k"]
    routes = x.shape[0] * top_k                                               # valid_shape_m
    intervals = call["tuning_config"]
    assert intervals is not None, "fp4lab passes the tuning intervals it aligned to"
    [block] = [tuning["block_shape"][0] for low, high, tuning in intervals if low < routes <= high]
    padded = int(call["num_tokens_padded"].reshape(-1)[0])
    sorted_ids, expert_ids = call["sorted_ids"].long(), call["expert_ids"].long()
    assert padded % block == 0 and len(expert_ids) == padded // block
    out = torch.zeros(routes, weights.shape[1])
    for b, e in enumerate(expert_ids.tolist()):
        ids = sorted_ids[b * block:(b + 1) * block]
        ids = ids[ids < routes]
        out[ids] = x[ids // top_k] @ weights[e].T
    return out


ROUTINES = {"dense": dense, "grouped_contiguous": grouped_contiguous, "indexed": indexed}


def install(monkeypatch) -> FakeHumming:
    """Put a fresh fake humming into sys.modules for one test; returns its state."""
    state = FakeHumming()
    for name, module in make_module(state).items():
        monkeypatch.setitem(sys.modules, name, module)
    return state
