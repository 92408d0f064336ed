"""The tables of a run folder, declared: every column with its dtype and meaning, and each table's
key (the columns that name one measured point, so a rerun or a resume never measures it twice).

Rows store what was measured and the facts needed to read it (dtypes, cache condition, graph or
eager, timer notes); derived numbers (TFLOP/s, TB/s, % of peak, bound) are computed when the
tables are read, in `fp4lab.analysis`, from the run's ceilings. A table is read back with every
declared column present and typed (missing values as NA), whatever version of fp4lab wrote it.

dtypes: "str", "int", "float", "bool", "list" (a JSON list, e.g. per-expert loads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    key: tuple[str, ...]
    columns: tuple[Column, ...]
    doc: str

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def row_key(self, row: dict[str, Any]) -> tuple:
        return tuple(_key_value(row.get(name)) for name in self.key)

    def frame(self, rows: Iterable[dict[str, Any]]):
        """Rows -> a DataFrame with every declared column, typed; undeclared columns are kept
        after them (a newer fp4lab's extra facts survive an older reader)."""
        import pandas as pd

        frame = pd.DataFrame(list(rows))
        return self.typed(frame)

    def typed(self, frame):
        import pandas as pd

        frame = frame.copy()
        for column in self.columns:
            if column.name not in frame:
                frame[column.name] = pd.Series([None] * len(frame), index=frame.index, dtype="object")
            frame[column.name] = _as_dtype(frame[column.name], column.dtype)
        extra = [name for name in frame.columns if name not in self.names]
        return frame[self.names + extra]


def _key_value(value):
    """Key values compare across JSON round trips: NaN/None -> None, 16.0 -> 16."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _as_dtype(series, dtype: str):
    import pandas as pd

    if dtype == "str":
        return series.astype("object").where(series.notna(), None).map(
            lambda v: v if v is None or isinstance(v, str) else str(v))
    if dtype == "int":
        return pd.to_numeric(series, errors="coerce").round().astype("Int64")
    if dtype == "float":
        return pd.to_numeric(series, errors="coerce").astype("float64")
    if dtype == "bool":
        return series.map(lambda v: None if v is None or v != v else bool(v)).astype("boolean")
    if dtype == "list":
        return series.astype("object")
    raise ValueError(f"unknown column dtype {dtype!r}")


def _columns(*specs: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*spec) for spec in specs)


STATUSES = ("ok", "wrong_result", "unavailable", "error", "oom", "timeout")

# Facts of the timer every timed row carries (fp4lab.bench.Timing).
TIMING = (
    ("median_us", "float", "median per-call time over the timed samples"),
    ("p20_us", "float", "20th percentile of the per-call samples"),
    ("p80_us", "float", "80th percentile of the per-call samples"),
    ("samples", "int", "timed samples (graph replays or eager loops)"),
    ("graph", "bool", "CUDA-graph replay (True) or eager launches (False)"),
    ("cold_l2", "bool", "inputs rotated through copies larger than L2 (decode's condition)"),
    ("copies", "int", "input copies rotated (1 = warm L2)"),
    ("calls_per_sample", "int", "calls inside one timed sample"),
    ("timer_note", "str", "what the timer had to do differently (capture failed, copies capped, burst cut)"),
    ("sm_clock_mhz", "float", "SM clock around the timed samples (NVML), None without NVML"),
    ("sm_clock_start_mhz", "float", "SM clock read just before the timed samples (NVML)"),
    ("sm_clock_end_mhz", "float", "SM clock read just after them: lower where the burst met the power limit"),
)
OUTCOME = (
    ("status", "str", "ok | wrong_result | unavailable | error | oom | timeout"),
    ("error", "str", "why the point has no time: the reason, the gate's message or the error line"),
    ("rel_err", "float", "the gate's relative Frobenius error against float64"),
)
ENERGY = (      # a point's energy window: the call replayed back to back for a set time (sweep.gemm)
    ("avg_power_w", "float", "average board power over the point's energy window"),
    ("energy_per_call_j", "float", "board energy per call over that window"),
    ("window_sm_clock_mhz", "float", "median SM clock inside the energy window"),
    ("throttle_reasons", "str", "clocks-event reasons seen in the window"),
    ("window_start_s", "float", "energy window start (epoch s)"),
    ("window_end_s", "float", "energy window end (epoch s)"),
)
GPU = (
    ("device", "str", "cpu or cuda"),
    ("gpu_index", "int", "torch's CUDA index of the GPU measured (None on CPU)"),
    ("pci_bus_id", "str", "NVML's PCI bus id of that GPU"),
)

GEMM = Table("gemm", key=("backend", "fmt", "n", "k", "m", "gpu_index"), doc=(
    "One row per backend x format x weight shape x M: a[M, K] bf16 @ w[N, K]^T (FP4 weights)."),
    columns=_columns(
        ("run_id", "str", "the run folder's id"),
        ("backend", "str", "fp4lab backend name"),
        ("library", "str", "the library behind it"),
        ("fmt", "str", "FP4 format of the weights: nvfp4 or mxfp4"),
        ("m", "int", "tokens: rows of the activations"),
        ("n", "int", "output features: rows of the weights"),
        ("k", "int", "reduction dimension"),
        ("weight_dtype", "str", "what the call reads per weight: fp4, int4, fp8 or bf16"),
        ("act_dtype", "str", "the dtype the activations enter the math as"),
        ("math_dtype", "str", "the dtype the math runs in: whose peak % of peak uses"),
        *OUTCOME, *TIMING, *GPU,
        ("compile_s", "float", "JIT compile time of the shape, kept out of the timing"),
        ("config", "str", "the build the backend chose for the point (fp4lab's kernels: its label)"),
        ("launch", "str", "pdl-tail | pdl-all: launched with programmatic dependent launch (a call "
                          "may start while the one before it finishes); plain or None: not"),
        *ENERGY,
    ))

# the stage variants an anatomy row can hold, in the order the book shows them, and the stages each
# dissected kernel has (what each one does: the kernel module's ANATOMY_STAGES, which holds the same
# keys; "stream" is no stage of a kernel but the same bytes read by one streaming launch, timed once
# per point beside the Triton kernel's stages)
ANATOMY_STAGES = ("stream", "load", "decode", "math", "mma", "full", "decode_x2")
ANATOMY_KERNELS = {
    "triton-w4a16": ("stream", "load", "decode", "math", "full", "decode_x2"),
    "cuda-w4a16": ("load", "decode", "mma", "full"),
}
OWN_GEMM_BACKENDS = tuple(ANATOMY_KERNELS)   # fp4lab's own FP4 GEMM kernels: the ones it dissects

ANATOMY = Table("anatomy", key=("backend", "stage", "fmt", "n", "k", "m", "gpu_index"), doc=(
    "One row per stage variant of one of fp4lab's FP4 decode GEMMs at one point: loads only, decode "
    "without math, math on pre-decoded bf16 (Triton) or the MMAs without the split-K reduction (CUDA), "
    "the full kernel, the decode done twice (Triton); beside them the same weight bytes read once by a "
    "streaming kernel (the floor at this size); each with its own check."),
    columns=_columns(
        ("run_id", "str", "the run folder's id"),
        ("backend", "str", "the kernel dissected (" + " | ".join(ANATOMY_KERNELS) + ")"),
        ("stage", "str", " | ".join(ANATOMY_STAGES)),
        ("what", "str", "what the variant does"),
        ("config", "str", "the tile config the kernel's stages share (the stream's launch shape)"),
        ("fmt", "str", "FP4 format of the weights"),
        ("m", "int", "tokens"), ("n", "int", "output features"), ("k", "int", "reduction dimension"),
        ("weight_bytes", "float", "bytes of weights one call reads (bf16 for the math stage)"),
        *OUTCOME, *TIMING, *GPU,
    ))

# the columns every MoE row starts with: which run, which model preset, whether a CPU stand-in
MOE_RUN = (
    ("run_id", "str", "the run folder's id"),
    ("preset", "str", "model preset key (a '-scaled' suffix for CPU stand-ins)"),
    ("scaled", "bool", "a tiny CPU stand-in preset: its times say nothing of the model"),
)

MOE = Table("moe", key=("preset", "method", "gemm", "fmt", "batch", "routing", "ep", "m", "gpu_index"),
            doc=("One row per MoE method x problem: an expert GEMM (gate_up, down) over every expert "
                 "at routed loads, a whole routed layer (gemm 'layer'), or one point of one expert's "
                 "dense curve (method dense-bf16, batch None, m set)."),
            columns=_columns(
                *MOE_RUN,
                ("method", "str", "MoE method name"),
                ("kind", "str", "gemm (one expert GEMM over all experts), layer, or dense"),
                ("library", "str", "the library behind it"),
                ("gemm_backend", "str", "the GEMM backend a loop method calls once per expert"),
                ("gemm", "str", "gate_up, down or layer"),
                ("fmt", "str", "FP4 format of layer methods' and FP4 methods' weights"),
                ("weight_dtype", "str", "what the method reads per weight"),
                ("act_dtype", "str", "the dtype the activations enter the math as"),
                ("math_dtype", "str", "the dtype the math runs in"),
                ("batch", "int", "decode batch B (tokens per step); None for the dense curve"),
                ("m", "int", "tokens of the dense-curve point; None otherwise"),
                ("routing", "str", "routing model: uniform, zipf:S or trace:PATH"),
                ("ep", "int", "expert-parallel degree: the row times the busiest rank"),
                ("ep_rank", "int", "which rank was the busiest"),
                ("top_k", "int", "experts per token"),
                ("total_experts", "int", "routed experts of the model"),
                ("experts", "int", "experts in this problem (E/P)"),
                ("n", "int", "expert GEMM output features (gemm rows); hidden H for layer rows"),
                ("k", "int", "expert GEMM reduction dim (gemm rows); moe_intermediate I for layer rows"),
                ("tokens", "int", "routed token rows (gemm rows) or tokens (layer rows)"),
                ("max_tokens", "int", "the busiest expert's tokens"),
                ("mean_tokens", "float", "mean tokens per expert of the problem"),
                ("active_experts", "int", "experts with at least one token"),
                ("loads", "list", "tokens per expert of the timed step"),
                ("weight_bytes", "float", "bytes of weights one call reads"),
                ("flops", "float", "useful FLOPs of one call (padding not credited)"),
                ("bytes_moved", "float", "weights read + activations in + output out"),
                ("note", "str", "what the method ran (e.g. '212 torch.mm calls')"),
                *OUTCOME, *TIMING, *GPU, *ENERGY,
            ))

# the anatomy builds of fp4lab's fused MoE kernels (the method's MOE_STAGES): loads only, also
# decoded, the whole launch, each adding work to the one before; then the whole launch's work
# without the weights' read (what the weight stream must hide: on the H200 as long as that stream)
MOE_ANATOMY_METHODS = {"cuda-w4a16-moe": ("load", "decode", "full", "compute")}

MOE_ANATOMY = Table("moe_anatomy", key=("preset", "method", "stage", "fmt", "batch", "routing", "ep",
                                        "gpu_index"), doc=(
    "One row per anatomy build of one of fp4lab's fused MoE kernels at one routed layer (EP 1): both "
    "launches with the weights, block scales and staged activations loaded only (load), also decoded "
    "(decode), or whole (full, the call the moe table times), or whole but for the weights' read "
    "(compute: what was in the kernel's buffers decoded and multiplied, no epilogue); timed in one "
    "worker after the full build passed the gate at the point (the other builds write no output)."),
    columns=_columns(
        *MOE_RUN,
        ("method", "str", "the fused MoE dissected (" + " | ".join(MOE_ANATOMY_METHODS) + ")"),
        ("stage", "str", "load | decode | full | compute"),
        ("what", "str", "what the call ran: its launches, tile config and stage"),
        ("fmt", "str", "FP4 format of the weights"),
        ("batch", "int", "decode batch B (tokens per step)"),
        ("routing", "str", "routing model: uniform, zipf:S or trace:PATH"),
        ("ep", "int", "expert-parallel degree (1: the whole layer)"),
        ("top_k", "int", "experts per token"),
        ("experts", "int", "experts in the problem"),
        ("weight_bytes", "float", "bytes of FP4 weights and scales one call reads"),
        *OUTCOME, *TIMING, *GPU,
    ))

# Samples further apart than this belong to two sampling sessions (a run resumed later appends
# its own): the seconds a run sampled, and its timeline's cut axis, leave such pauses out.
TELEMETRY_SESSION_GAP_S = 5.0

TELEMETRY = Table("telemetry", key=(), doc="NVML samples of every GPU, taken while the sweep ran.",
                  columns=_columns(
                      ("t", "float", "epoch seconds"),
                      ("gpu", "int", "torch's CUDA index of the GPU"),
                      ("power_instant_w", "float", "NVML_FI_DEV_POWER_INSTANT"),
                      ("power_avg_w", "float", "nvmlDeviceGetPowerUsage (~1 s trailing average)"),
                      ("energy_j", "float", "energy since the first sample (wrap-safe)"),
                      ("sm_clock_mhz", "float", "SM clock"),
                      ("mem_clock_mhz", "float", "memory clock"),
                      ("temperature_c", "float", "GPU temperature"),
                      ("gpu_util_pct", "float", "GPU utilisation"),
                      ("mem_util_pct", "float", "memory-controller utilisation"),
                      ("throttle_reasons", "str", "';'-joined clocks-event reasons, 'none'"),
                      ("violation_power_s", "float", "time held back by power since boot"),
                      ("violation_thermal_s", "float", "time held back by temperature since boot"),
                      ("power_limit_w", "float", "enforced power limit"),
                  ))

# (name, dtype, meaning): the comm table's columns, in the vocabulary of a schema declaration
# (dtypes "str", "int", "float", "bool", "list"); a point is named by COMM_KEY.
COMM_COLUMN_SPECS = [
    ("run_id", "str", "the run folder's id"),
    ("op", "str", "all_reduce | all_to_all_dispatch | all_to_all_combine | send_recv"),
    ("world_size", "int", "ranks in the measured group (ranks 0..world_size-1)"),
    ("tokens", "int", "all_reduce: TP batch; all-to-all: tokens per EP rank; send_recv: microbatch"),
    ("dtype", "str", "bf16 | fp8 (e4m3, moved as its bytes); all_reduce and send_recv: bf16"),
    ("routing", "str", "all-to-all: the routing model of the splits (uniform, zipf:S, trace:PATH)"),
    ("hidden", "int", "H: elements per token row"),
    ("top_k", "int", "all-to-all: k rows per token"),
    ("experts", "int", "all-to-all: E routed experts, split contiguously over the ranks"),
    ("preset", "str", "model preset the sizes come from ('' when given by hand)"),
    ("bytes", "int", "nccl-tests' size: the per-rank buffer; uneven all-to-all: busiest rank's"),
    ("imbalance", "float", "all-to-all: busiest rank's rows / mean rows per rank"),
    ("status", "str", "ok | unavailable | wrong_result | oom | error | timeout"),
    ("error", "str", "why the point is not ok, naming the rank"),
    ("median_us", "float", "median over iterations of the slowest rank's time per op"),
    ("p20_us", "float", "20th percentile of the same"),
    ("p80_us", "float", "80th percentile of the same"),
    ("algbw_gbps", "float", "bytes / median time, GB/s of 1e9 bytes"),
    ("busbw_gbps", "float", "algbw x nccl-tests' factor (comm.ops.bus_factor)"),
    ("graph", "bool", "every rank timed CUDA-graph replays (False: eager; see note)"),
    ("backend", "str", "nccl | gloo"),
    ("device", "str", "cuda | cpu"),
    ("n", "int", "timed iterations"),
    ("calls_per_sample", "int", "ops run back to back per timed iteration"),
    ("rank_median_us", "list", "each member rank's own median, rank order"),
    ("note", "str", "timer notes (graph capture failures, CPU timing)"),
]
COMM_COLUMNS = [name for name, _, _ in COMM_COLUMN_SPECS]
COMM_KEY = ("op", "world_size", "tokens", "dtype", "routing", "hidden", "top_k", "experts")

COMM = Table("comm", key=COMM_KEY, columns=_columns(*COMM_COLUMN_SPECS),
             doc="One row per collective x group size x size: torch.distributed under torchrun.")
TABLES: dict[str, Table] = {table.name: table for table in (GEMM, ANATOMY, MOE, MOE_ANATOMY, TELEMETRY,
                                                             COMM)}


def table(name: str) -> Table | None:
    """The declared table `name`, or None for a table fp4lab does not declare (kept as written)."""
    return TABLES.get(name)


def blank_row(table_name: str, **values: Any) -> dict[str, Any]:
    """A row of `table_name` with every declared column, None where not given."""
    declared = TABLES[table_name]
    unknown = set(values) - set(declared.names)
    if unknown:
        raise ValueError(f"{table_name} rows have no column(s) {sorted(unknown)}")
    row = dict.fromkeys(declared.names)
    row.update(values)
    return row
