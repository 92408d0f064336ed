"""What one decode MoE layer would take on GPUs the run never saw: its floors, projected from
spec sheets and routing statistics. Pure: no device, no run folder (a run's measured numbers come
in as plain values, `Measured`).

Per GPU, for a batch of B tokens routed top-k over E experts (`fp4lab.moe.routing` draws, the
mean over steps), with every GPU reading FP4 weights (the format it would run):
- weight floor: the active experts' FP4 weights (gate_up [2I, H] and down [H, I], codes plus
  block scales, `fp4lab.roofline.operand_bytes`) read once at the sheet's memory bandwidth;
- math floor: 2 * B * k * (2I*H + H*I) FLOPs at the sheet's dense peak of the dtype the math runs
  in: FP4 on GPUs with FP4 tensor cores, bf16 elsewhere (FP4 weights there run as weight-only
  kernels, decoded to bf16 in registers);
- launch floor: kernels per layer x one kernel launch (the run's measured graph-replay launch time
  when given, else `DEFAULT_LAUNCH_US`, labelled as a default).
The floors overlap, so the layer's floor is the largest, and it names the bound. Every row says
it is a projection. Given a run's measured layer time of its fastest FP4 method, the projection's
error on that GPU (floor / measured) is shown beside every row, with the time each GPU would take
at that same ratio (which assumes the other GPU's kernels are as far from their floor: they are
other kernels on another architecture, so read it as an order of magnitude).

Shape legend: `S` routing steps, `E` routed experts, `T` tokens (the batch B), `k` top-k,
`H` hidden, `I` moe_intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fp4lab.hardware import SPECS, GpuSpec
from fp4lab.moe import presets, routing
from fp4lab.roofline import operand_bytes

LABEL = "projection from spec sheets, not a measurement"
# one kernel launched from a CUDA graph: the H200's empty-kernel replay in the reference run
# (results/reference/20261203T1155Z-h200-full, run.json ceilings.measured.launch_us: 1.984 us), the
# value the reference pages use, so a run without its own launch time projects with the same floor
DEFAULT_LAUNCH_US = 1.98
DEFAULT_LAUNCH_SOURCE = ("default: the H200's measured graph-replay launch floor (reference run "
                         "20261203T1155Z-h200-full), not measured on this GPU")
# A grouped FP4 MoE layer (FlashInfer's cutlass_fused_moe, for one): route/permute, quantize the
# activations, gate_up grouped GEMM, SiLU*up (re-quantized), down grouped GEMM, finalize (the
# weighted sum back to token order).
KERNELS_PER_LAYER = 6
BOUNDS = ("weight", "math", "launch")


@dataclass(frozen=True)
class Measured:
    """What a run measured, as plain values: the fastest FP4 method's layer time on its GPU."""

    gpu: str                         # SPECS key of the GPU the run measured on
    layer_us: float                  # that method's measured time for one MoE layer at the batch
    method: str
    launch_us: float | None = None   # the run's measured graph-replay launch time
    source: str = ""                 # where these came from (a run folder)

    def __post_init__(self):
        if self.gpu not in SPECS:
            raise ValueError(f"measured gpu {self.gpu!r} is not on the sheet; valid: {', '.join(SPECS)}")
        number = isinstance(self.layer_us, (int, float)) and np.isfinite(self.layer_us)
        if not (number and self.layer_us > 0):
            raise ValueError(f"measured layer_us must be a positive number, got {self.layer_us!r}")
        if self.launch_us is not None and not self.launch_us > 0:
            raise ValueError(f"measured launch_us must be positive, got {self.launch_us!r}")


@dataclass(frozen=True)
class LayerTraffic:
    """One decode step of one MoE layer, from routing statistics (means over steps)."""

    preset: str
    batch: int
    fmt: str
    routing: str
    active_experts: float            # experts with at least one token
    busiest_tokens: float            # tokens of the busiest expert
    expert_bytes: int                # FP4 bytes of one expert (gate_up + down)
    flops: float

    @property
    def weight_bytes(self) -> float:
        return self.active_experts * self.expert_bytes


def layer_traffic(model: presets.ModelPreset, batch: int, fmt: str = "nvfp4",
                  routing_spec: str = "uniform", steps: int = 64, seed: int = 0) -> LayerTraffic:
    """The weights one MoE layer reads and the FLOPs it does at decode batch `batch`."""
    loads = routing.modelled_loads(routing_spec, model.experts, model.top_k, batch, steps, seed)  # [S, E]
    expert_bytes = sum(operand_bytes(n, k, "fp4", fmt) for n, k in model.gemm_shapes().values())
    values_per_token = sum(n * k for n, k in model.gemm_shapes().values())
    return LayerTraffic(preset=model.key, batch=batch, fmt=fmt, routing=str(routing_spec),
                        active_experts=float((loads > 0).sum(axis=1).mean()),
                        busiest_tokens=float(loads.max(axis=1).mean()), expert_bytes=expert_bytes,
                        flops=2.0 * batch * model.top_k * values_per_token)


def math_dtype_on(spec: GpuSpec) -> str:
    """FP4 where the GPU has FP4 tensor cores, else bf16 (weight-only kernels)."""
    return "fp4" if spec.peak_tflops.get("fp4") else "bf16"


def floors(traffic: LayerTraffic, spec: GpuSpec, launch_us: float,
           kernels: int = KERNELS_PER_LAYER) -> dict:
    """The layer's three floors on `spec` (microseconds), the largest, and the bound it names."""
    dtype = math_dtype_on(spec)
    # bytes / (TB/s * 1e6) = us; FLOPs / (TFLOP/s * 1e6) = us
    values = {"weight": traffic.weight_bytes / (spec.memory_bw_tbps * 1e6),
              "math": traffic.flops / (spec.peak_tflops[dtype] * 1e6),
              "launch": kernels * launch_us}
    bound = max(BOUNDS, key=values.get)
    return {"math_dtype": dtype, **{f"{name}_floor_us": values[name] for name in BOUNDS},
            "floor_us": values[bound], "bound": bound}


def project(model: presets.ModelPreset, batch: int, gpus, fmt: str = "nvfp4",
            routing_spec: str = "uniform", steps: int = 64, seed: int = 0,
            measured: Measured | None = None, kernels: int = KERNELS_PER_LAYER) -> list[dict]:
    """One row per GPU (SPECS keys or GpuSpecs): the floors, labelled as a projection."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch <= 0:
        raise ValueError(f"batch={batch!r}: must be a positive integer")
    if isinstance(kernels, bool) or not isinstance(kernels, int) or kernels <= 0:
        raise ValueError(f"kernels={kernels!r}: must be a positive integer")
    specs = [gpu if isinstance(gpu, GpuSpec) else SPECS.get(gpu) for gpu in gpus]
    if not specs or None in specs:
        raise ValueError(f"gpus {list(gpus)!r}: give one or more of {', '.join(SPECS)}")
    traffic = layer_traffic(model, int(batch), fmt, routing_spec, steps, seed)
    if measured is not None and measured.launch_us is not None:
        launch_us, launch_source = measured.launch_us, f"measured on {measured.gpu} ({measured.source})"
    else:
        launch_us, launch_source = DEFAULT_LAUNCH_US, DEFAULT_LAUNCH_SOURCE
    check = _measured_check(traffic, measured, launch_us, kernels)
    rows = []
    for spec in specs:
        row = {"gpu": spec.key, "name": spec.name, "arch": spec.sm, "preset": model.key,
               "batch": int(batch), "fmt": fmt, "routing": traffic.routing,
               "active_experts": traffic.active_experts, "busiest_tokens": traffic.busiest_tokens,
               "weight_mb": traffic.weight_bytes / 1e6, "gflop": traffic.flops / 1e9,
               "bandwidth_tbps": spec.memory_bw_tbps, "kernels": kernels, "launch_us": launch_us,
               "launch_source": launch_source, **floors(traffic, spec, launch_us, kernels),
               "label": LABEL}
        row.update(_beside(row, check, spec))
        rows.append(row)
    return rows


def _measured_check(traffic: LayerTraffic, measured: Measured | None, launch_us: float,
                    kernels: int) -> dict | None:
    """The projection's error where the run measured: floor there / measured time."""
    if measured is None:
        return None
    floor = floors(traffic, SPECS[measured.gpu], launch_us, kernels)["floor_us"]
    return {"measured_on": measured.gpu, "measured_method": measured.method,
            "measured_layer_us": measured.layer_us, "measured_floor_us": floor,
            "floor_over_measured": floor / measured.layer_us}


def _beside(row: dict, check: dict | None, spec: GpuSpec) -> dict:
    if check is None:
        return {"measured_on": None, "measured_method": None, "floor_over_measured": None,
                "at_measured_ratio_us": None, "measured_us": None}
    return {"measured_on": check["measured_on"], "measured_method": check["measured_method"],
            "floor_over_measured": check["floor_over_measured"],
            "at_measured_ratio_us": row["floor_us"] / check["floor_over_measured"],
            "measured_us": check["measured_layer_us"] if spec.key == check["measured_on"] else None}


def projection_table(model: presets.ModelPreset, batch: int, gpus, **options):
    """The rows as a DataFrame, for the book."""
    import pandas as pd

    return pd.DataFrame(project(model, batch, gpus, **options))


def format_rows(rows: list[dict]) -> str:
    """Fixed-width: one line per GPU, the label last."""
    header = (f"{'gpu':<13} {'arch':<6} {'weights MB':>10} {'TB/s':>5} {'weight us':>9} "
              f"{'math':<4} {'math us':>8} {'launch us':>9} {'floor us':>9} {'bound':<6} "
              f"{'floor/meas':>10} {'at ratio us':>11}")
    lines = [header, "-" * len(header)]
    for row in rows:
        ratio = row["floor_over_measured"]
        lines.append(
            f"{row['gpu']:<13} {row['arch']:<6} {row['weight_mb']:>10.0f} {row['bandwidth_tbps']:>5.2f} "
            f"{row['weight_floor_us']:>9.1f} {row['math_dtype']:<4} {row['math_floor_us']:>8.1f} "
            f"{row['launch_floor_us']:>9.1f} {row['floor_us']:>9.1f} {row['bound']:<6} "
            f"{'-' if ratio is None else format(ratio, '.2f'):>10} "
            f"{'-' if ratio is None else format(row['at_measured_ratio_us'], '.0f'):>11}")
    first = rows[0]
    lines.append(f"{first['preset']}, batch {first['batch']}, {first['fmt']} weights, "
                 f"{first['routing']} routing, {first['active_experts']:.1f} active experts; "
                 f"launch: {first['kernels']} kernels x {first['launch_us']:.2f} us "
                 f"({first['launch_source']})")
    measured = next((row for row in rows if row["floor_over_measured"] is not None), None)
    if measured:
        lines.append(f"floor/meas: projected floor over the {measured['measured_method']} layer "
                     f"measured on {measured['measured_on']}; 'at ratio' = floor / that ratio "
                     f"(assumes the same distance from the floor)")
    lines.append(f"every row: {LABEL}")
    return "\n".join(lines)
