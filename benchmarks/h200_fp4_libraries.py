"""FP4 on Hopper as users run it: humming, gemlite and tinygemm beside cuBLAS bf16, and humming's
MoE layer, each gated against float64 before it is timed (issue 12).

Parts, run in this order of priority (`--parts`, default all):
- dense:   humming-w4a16 (nvfp4, mxfp4), then torch-bf16 (cuBLAS) and tinygemm-int4, on the
           shapes (--shapes) at every M (--m);
- moe:     humming's MoE layer: GLM-5 nvfp4 grouped-contiguous, nvfp4 indexed, mxfp4 grouped at
           each B (--batches, B=512 first), then DeepSeek-V3 nvfp4 grouped at B=512; uniform
           routing (fp4lab.moe.routing), weights built on the GPU (5.4 GB NVFP4 for GLM-5);
- gemlite: gemlite-w4a16 nvfp4 (expected not to compile on sm_90: its error row carries the
           compiler's cause, and the shape's other M are skipped), then mxfp4, smallest M first.
Every point: `prepare` (humming JIT-compiles there, ~12 s per new layer shape; gemlite compiles
and autotunes, 13-21 s), the correctness gate, then `fp4lab.bench.time_call` with
TimerConfig(repeats=30, warmup_s=1.0): cold L2, CUDA-graph replay. One JSON line per point in
$OUT/fp4_libraries.jsonl (flushed as it goes), provenance in $OUT/run.json, and the compact
table last on stdout and in $OUT/summary.txt.

Time: the whole run stays inside --budget-s (SIGALRM; each point also stops after --case-s);
what no longer fits is written as `skipped` rows, never silently left out. The three parts do
not fit in one 200 s call: run them as three calls (`--parts dense`, `--parts moe`,
`--parts gemlite`). humming's compiled kernels go to $HUMMING_CACHE_DIR (default here:
.devbuild/humming-cache in the work tree, which a warm device machine keeps between calls).

On the H200 (no network; the two wheels carried in .whl/fp4libs):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fp4libs/*.whl
    PYTHONPATH=src:/tmp/site python3 benchmarks/h200_fp4_libraries.py --out $OUT --parts dense
On a CPU, for a logic check only (the tests run it with fake libraries):
    ... --device cpu --shapes 64x128 --m 1 --batches 8 --models glm-5 --scaled
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# kept between device calls on a warm machine (an ignored build folder of the work tree)
os.environ.setdefault("HUMMING_CACHE_DIR", str(ROOT / ".devbuild" / "humming-cache"))

import torch  # noqa: E402

from fp4lab import bench, ceilings, correctness, formats, hardware, roofline  # noqa: E402
from fp4lab.backends import get as get_backend  # noqa: E402
from fp4lab.backends import moe as moe_methods  # noqa: E402
from fp4lab.backends.moe import base as moe_base  # noqa: E402
from fp4lab.moe import presets, routing  # noqa: E402

PARTS = ("dense", "moe", "gemlite")
DEFAULT_SHAPES = "8192x8192,4096x6144,6144x2048"
DEFAULT_M = "1,4,16,64,256"
DEFAULT_BATCHES = "512,16,64,2048"
DEFAULT_MODELS = "glm-5,deepseek-v3"
DENSE_BACKENDS = (("humming-w4a16", "nvfp4"), ("humming-w4a16", "mxfp4"),
                  ("torch-bf16", "nvfp4"), ("tinygemm-int4", "nvfp4"))
# nvfp4 first: its expected compile failure is one cheap row per shape (the rest skipped)
GEMLITE_BACKENDS = (("gemlite-w4a16", "nvfp4"), ("gemlite-w4a16", "mxfp4"))
# (method, fmt, model index, batches): the first model at every B, the second at B=512 only
MOE_PLAN = (("humming-moe-grouped", "nvfp4", 0, None), ("humming-moe-indexed", "nvfp4", 0, None),
            ("humming-moe-grouped", "mxfp4", 0, None), ("humming-moe-grouped", "nvfp4", 1, (512,)))
TIMER = bench.TimerConfig(repeats=30, warmup_s=1.0)
SEED = 0
FILE_JSONL, FILE_RUN, FILE_SUMMARY = "fp4_libraries.jsonl", "run.json", "summary.txt"


class OutOfTime(BaseException):
    """The run's budget or one point's cap ran out. A BaseException, so that no library's (or
    the timer's) `except Exception` mistakes it for a failure of its own and carries on."""


@contextlib.contextmanager
def time_limit(seconds: float):
    if seconds <= 1:
        raise OutOfTime("no time left in the budget")

    def fire(signum, frame):
        raise OutOfTime(f"stopped after {seconds:.0f} s (time limit)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class DenseCase:
    part: str
    backend: str
    fmt: str
    n: int
    k: int
    m: int

    @property
    def group(self) -> tuple:      # a compile failure skips the rest of its group
        return (self.backend, self.fmt, self.n, self.k)


@dataclass(frozen=True)
class MoeCase:
    part: str
    method: str
    fmt: str
    model: str
    batch: int

    @property
    def group(self) -> tuple:
        return (self.method, self.fmt, self.model)


def plan(parts, shapes, ms, batches, models) -> list:
    """Every case, in the order they run (most wanted first)."""
    cases = []
    if "dense" in parts:
        for backend, fmt in DENSE_BACKENDS:
            cases += [DenseCase("dense", backend, fmt, n, k, m) for n, k in shapes for m in ms]
    if "moe" in parts:
        for method, fmt, index, fixed in MOE_PLAN:
            if index < len(models):
                cases += [MoeCase("moe", method, fmt, models[index], b) for b in fixed or batches]
    if "gemlite" in parts:   # M-major: each autotune costs 13-21 s, the decode sizes first
        for backend, fmt in GEMLITE_BACKENDS:
            cases += [DenseCase("gemlite", backend, fmt, n, k, m) for m in ms for n, k in shapes]
    return cases


# --- one point -----------------------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def timing_fields(timing: bench.Timing) -> dict:
    fields = dataclasses.asdict(timing)
    del fields["samples_us"]
    # renamed: a dense row's "n" is its N
    fields["timer_note"], fields["samples"] = fields.pop("note"), fields.pop("n")
    return fields


class Operands:
    """Weights built once on the device: every dense (shape, fmt) is kept (tens of MB); the MoE
    experts of one (model, fmt) at a time (GLM-5's NVFP4 experts are 5.4 GB)."""

    def __init__(self, device: str, scaled: bool):
        self.device, self.scaled = device, scaled
        self.dense_weights: dict = {}
        self.layer_key, self.layer_weights = None, None

    def layer_weights_for(self, key, build):
        if key != self.layer_key:
            self.layer_key, self.layer_weights = None, None
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            self.layer_weights, self.layer_key = build(), key
        return self.layer_weights

    def dense(self, case: DenseCase):
        def build():
            gen = torch.Generator(device=self.device).manual_seed(SEED)
            return formats.quantize(torch.randn(case.n, case.k, generator=gen, device=self.device)
                                    * case.k ** -0.5, case.fmt)
        key = (case.fmt, case.n, case.k)
        if key not in self.dense_weights:
            self.dense_weights[key] = build()
        w = self.dense_weights[key]
        gen = torch.Generator(device=self.device).manual_seed(SEED + case.m)
        a = torch.randn(case.m, case.k, generator=gen, device=self.device).to(torch.bfloat16)
        return a, w

    def preset(self, name: str):
        preset = presets.get(name)
        return presets.scaled_down(preset) if self.scaled else preset

    def layer(self, case: MoeCase):
        p = self.preset(case.model)

        def build():
            return (moe_base.quantized_expert_weights(p.experts, 2 * p.moe_intermediate, p.hidden,
                                                      case.fmt, self.device, SEED),
                    moe_base.quantized_expert_weights(p.experts, p.hidden, p.moe_intermediate,
                                                      case.fmt, self.device, SEED + 1))
        weights = self.layer_weights_for((case.model, case.fmt), build)
        ids = routing.sample_expert_ids("uniform", p.experts, p.top_k, case.batch, 1, seed=SEED)[0]
        problem = moe_base.make_layer_problem(ids, p.experts, p.hidden, p.moe_intermediate,
                                              case.fmt, self.device, SEED, weights=weights)
        return p, problem


def measure_dense(case: DenseCase, operands: Operands, bandwidth_tbps: float) -> dict:
    backend = get_backend(case.backend)
    row = {**dataclasses.asdict(case), "kind": "gemm", **backend.describe(),
           "nvfp4_floor_us": roofline.gemm_bytes(case.m, case.n, case.k, "fp4", "nvfp4",
                                                 act_dtype="bf16") / bandwidth_tbps / 1e6}
    available, reason = backend.availability(operands.device)
    if not available:
        return {**row, "status": "unavailable", "message": reason}
    a, w = operands.dense(case)
    start = time.perf_counter()
    prepared = backend.prepare(a, w, operands.device)
    row.update(prepare_s=time.perf_counter() - start, **prepared.info)
    gate = correctness.check_backend(prepared, correctness.TOLERANCE[
        "bf16" if backend.weight_dtype in ("bf16", "int4") else case.fmt])
    row.update(rel_err=gate.rel_err, message=gate.message)
    if not gate.ok:
        return {**row, "status": gate.status}
    timing = bench.time_call(prepared.make_call, prepared.args, prepared.out, TIMER, operands.device)
    moved = roofline.gemm_bytes(case.m, case.n, case.k, backend.weight_dtype, case.fmt,
                                act_dtype="bf16")
    return {**row, "status": "ok", **timing_fields(timing),
            "tbps": moved / timing.median_us / 1e6,
            "x_floor": timing.median_us / row["nvfp4_floor_us"]}


def measure_moe(case: MoeCase, operands: Operands, bandwidth_tbps: float) -> dict:
    method = moe_methods.get(case.method)
    row = {**dataclasses.asdict(case), "kind": "layer", **method.describe()}
    available, reason = method.availability(operands.device)
    if not available:
        return {**row, "status": "unavailable", "message": reason}
    preset, problem = operands.layer(case)
    loads = problem.loads
    row.update(experts=preset.experts, top_k=preset.top_k, hidden=preset.hidden,
               intermediate=preset.moe_intermediate, scaled=preset.scaled,
               active_experts=int((loads > 0).sum()), max_load=int(loads.max()))
    start = time.perf_counter()
    call = method.prepare(problem)
    row.update(prepare_s=time.perf_counter() - start, note=call.note,
               weight_bytes=call.weight_bytes,
               floor_us=call.weight_bytes / bandwidth_tbps / 1e6)
    gate = moe_methods.check_call(call, problem)
    row.update(rel_err=gate.rel_err, message=gate.message)
    if not gate.ok:
        return {**row, "status": gate.status}
    timer = TIMER if call.graph else dataclasses.replace(TIMER, use_graph=False)
    timing = bench.time_call(call.make_call, call.args, call.out, timer, operands.device)
    return {**row, "status": "ok", **timing_fields(timing),
            "x_floor": timing.median_us / row["floor_us"]}


def context_alive(device: str) -> bool:
    if not device.startswith("cuda"):
        return True
    try:
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


# --- the run -------------------------------------------------------------------------------------

def run(cases, device: str, scaled: bool, budget_s: float, case_s: float, out_dir: Path,
        bandwidth_tbps: float) -> list[dict]:
    started = time.monotonic()
    operands = Operands(device, scaled)
    failed_groups: dict[tuple, str] = {}
    rows = []
    with open(out_dir / FILE_JSONL, "w") as sink:
        for case in cases:
            left = budget_s - (time.monotonic() - started)
            row = {**dataclasses.asdict(case), "status": "skipped"}
            if case.group in failed_groups:
                row["message"] = f"not tried: {failed_groups[case.group]}"
            elif left <= 1:
                row["message"] = f"time budget ({budget_s:.0f} s) spent"
            else:
                measure = measure_dense if isinstance(case, DenseCase) else measure_moe
                cap = min(left, case_s)
                try:
                    with time_limit(cap):
                        row = measure(case, operands, bandwidth_tbps)
                except torch.cuda.OutOfMemoryError as exc:
                    row.update(status="oom", message=first_line(exc))
                except (OutOfTime, Exception) as exc:  # noqa: BLE001 - a failed point is a result
                    row.update(status="error", message=first_line(exc))
                    # a compile that failed (or outran its own cap) fails the same at the next M
                    if not (isinstance(exc, OutOfTime) and cap < case_s):
                        failed_groups[case.group] = (f"{case.group[0]} {case.fmt} failed first: "
                                                     f"{row['message'][:160]}")
            row["elapsed_s"] = time.monotonic() - started
            rows.append(row)
            sink.write(json.dumps(row, default=str) + "\n")
            sink.flush()
            print(progress_line(row), flush=True)
            if not context_alive(device):
                print("the CUDA context is gone: stopping", flush=True)
                break
    return rows


def progress_line(row: dict) -> str:
    where = (f"{row['n']}x{row['k']} M={row['m']}" if "m" in row
             else f"{row['model']} B={row['batch']}")
    what = row.get("backend") or row.get("method")
    if row["status"] == "ok":
        return (f"{what:<20} {row['fmt']:<5} {where:<22} {row['median_us']:>10.2f} us  "
                f"x{row['x_floor']:.2f} floor  prepare {row.get('prepare_s', 0):.1f} s")
    return f"{what:<20} {row['fmt']:<5} {where:<22} {row['status']:>10}  {row.get('message', '')[:120]}"


# --- the summary ---------------------------------------------------------------------------------

def cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] == "ok":
        return f"{row['median_us']:.1f}"
    return {"wrong_result": "WRONG", "unavailable": "n/a", "skipped": "skip"}.get(row["status"], "err")


def summary(rows: list[dict]) -> str:
    dense = [r for r in rows if "m" in r]
    columns = [("torch-bf16", "nvfp4", "cuBLAS bf16"), ("tinygemm-int4", "nvfp4", "tinygemm int4"),
               ("gemlite-w4a16", "mxfp4", "gemlite mxfp4"), ("gemlite-w4a16", "nvfp4", "gemlite nvfp4"),
               ("humming-w4a16", "nvfp4", "humming nvfp4"), ("humming-w4a16", "mxfp4", "humming mxfp4")]
    lines = []
    if dense:
        lines.append("dense GEMM, median us (cold L2, graph replay); floor: NVFP4 bytes at the copy bandwidth")
        lines.append(f"{'N x K':<11} {'M':>4} " + " ".join(f"{label:>13}" for *_, label in columns)
                     + f" {'floor':>7}")
        points = sorted({(r["n"], r["k"], r["m"]) for r in dense},
                        key=lambda p: (-p[0] * p[1], p[2]))
        index = {(r.get("backend"), r["fmt"], r["n"], r["k"], r["m"]): r for r in dense}
        for n, k, m in points:
            cells = [cell(index.get((b, f, n, k, m))) for b, f, _ in columns]
            floors = [r["nvfp4_floor_us"] for r in dense if (r["n"], r["k"], r["m"]) == (n, k, m)
                      and "nvfp4_floor_us" in r]
            floor = f"{floors[0]:.1f}" if floors else "-"
            lines.append(f"{f'{n}x{k}':<11} {m:>4} " + " ".join(f"{c:>13}" for c in cells)
                         + f" {floor:>7}")
        compiles = [r for r in dense if r.get("compile_s", 0) > 1]
        if compiles:
            lines.append("first calls (JIT compile / autotune): " + "; ".join(
                f"{r['backend']} {r['fmt']} {r['n']}x{r['k']} {r['compile_s']:.1f} s" for r in compiles))
    layers = [r for r in rows if "batch" in r]
    if layers:
        lines.append("MoE layer (uniform routing), median us against the NVFP4 weight-read floor")
        lines.append(f"{'method':<20} {'fmt':<5} {'model':<12} {'B':>5} {'us':>10} {'floor':>8} "
                     f"{'x floor':>7} {'prepare s':>9}  status")
        for r in layers:
            us = f"{r['median_us']:.1f}" if r["status"] == "ok" else "-"
            floor = f"{r['floor_us']:.1f}" if "floor_us" in r else "-"
            ratio = f"{r['x_floor']:.2f}" if r["status"] == "ok" else "-"
            lines.append(f"{r['method']:<20} {r['fmt']:<5} {r['model']:<12} {r['batch']:>5} "
                         f"{us:>10} {floor:>8} {ratio:>7} {r.get('prepare_s', 0):>9.1f}  {r['status']}")
    failures = {}
    for r in rows:
        if r["status"] in ("error", "wrong_result", "oom"):
            failures.setdefault((r.get("backend") or r.get("method"), r["fmt"]), r.get("message", ""))
    for (what, fmt), message in failures.items():
        lines.append(f"failed: {what} {fmt}: {message[:200]}")
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("points: " + ", ".join(f"{status} {count}" for status, count in sorted(counts.items())))
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------------

def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        shapes = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",")]
    except ValueError:
        raise SystemExit(f"--shapes must be NxK[,NxK...], got {text!r}") from None
    if any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes must be NxK[,NxK...] with positive sizes, got {text!r}")
    return shapes


def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if min(values) < 1:
        raise SystemExit(f"{name} must be positive integers, got {text!r}")
    return values


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON lines, run.json, summary")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--m", default=DEFAULT_M)
    parser.add_argument("--batches", default=DEFAULT_BATCHES)
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="MoE presets: the first at every B, the second at B=512")
    parser.add_argument("--scaled", action="store_true", help="tiny stand-ins of the models (CPU checks)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=190.0)
    parser.add_argument("--case-s", type=float, default=120.0,
                        help="the most one point may take (its JIT compile included)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts must name some of {','.join(PARTS)}, got {args.parts!r}")
    for name in args.models.split(","):
        presets.get(name)
    return args, parts


def main(argv=None) -> int:
    args, parts = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = hardware.resolve_device(args.device)
    cases = plan(parts, parse_shapes(args.shapes), parse_ints(args.m, "--m"),
                 parse_ints(args.batches, "--batches"), args.models.split(","))
    probes = ceilings.CeilingProbes.cpu() if device == "cpu" else ceilings.CeilingProbes.cuda_quick()
    bandwidth, how = ceilings.measure_copy_tbps(bench.torch_device(device), probes)
    meta = {"command": " ".join(sys.argv), "parts": parts, "budget_s": args.budget_s,
            "timer": dataclasses.asdict(TIMER), "copy_tbps": bandwidth, "copy_how": how,
            "device": hardware.detect(device).as_dict(), "versions": versions(),
            "humming_cache_dir": os.environ["HUMMING_CACHE_DIR"], "cases": len(cases)}
    (out_dir / FILE_RUN).write_text(json.dumps(meta, indent=2, default=str))
    rows = run(cases, device, args.scaled, args.budget_s, args.case_s, out_dir, bandwidth)
    table = summary(rows)
    (out_dir / FILE_SUMMARY).write_text(table + "\n")
    print(table)
    return 0


def versions() -> dict:
    from importlib import metadata

    found = {}
    for name in ("torch", "triton", "humming-kernels", "gemlite"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


if __name__ == "__main__":
    sys.exit(main())
