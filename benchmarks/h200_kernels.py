"""One H200 call for fp4lab's own FP4 kernels (issue 13): tune, gate, time, and say where time goes.

    PYTHONPATH=src timeout 170 python3 benchmarks/h200_kernels.py --out $OUT [--plan decode]

Carries nothing beyond the tree (no wheels). In order, each phase inside the --budget-s deadline
(a phase or point that does not fit is a "skipped" row; every step has its own time limit; an
error is a row with its reason, never a time):
  1. ceilings: copy bandwidth and launch floor (`fp4lab.ceilings.measure_ceilings`);
  2. dense `triton-w4a16`, shapes 8192x8192, 4096x6144, 6144x2048 at M = 1, 4, 16, 64, 256:
     nvfp4 over the pruned grid of `tune_w4a16.candidates` (the first H200 run's winners, now
     SHAPE_PRESETS, as the yardstick, then the second iteration's variants: pipeline depth, BK
     512, 8-warp and 2-warp tiles), mxfp4 over nvfp4's three best configs per point; cuBLAS bf16
     (`torch-bf16`) at the same points;
  3. anatomy at M = 1 and 16 on the three shapes (nvfp4, the point's winner config): the
     weight bytes read as a stream, loads only, decode without math, math on pre-decoded bf16,
     full, decode twice (`anatomy_variants`); then the stream over five launch shapes
     (`read_floor.py`): how far the anatomy's fixed launch shape is from the best at each size;
  4. `triton-w4a16-moe`: GLM-5 (E=256, k=8, H=6144, I=2048) at B = 512 and 64 and DeepSeek-V3
     at B = 512, uniform routing, nvfp4 then mxfp4, the tile configs of `moe_candidates`, gated
     by `check_call`; the best config's call then stopped after each launch (routing, gate_up,
     down), so the summary gives each launch's time.
Every GEMM result is gated against float64 before it is timed; every time is `fp4lab.bench.
time_call` with TimerConfig(repeats=30, warmup_s=1.0): cold L2, CUDA-graph replay.

Writes under --out: measurements.jsonl (one JSON object per measurement or skip, as it happens),
presets.json (the winners, rows that `triton_w4a16.presets_from_json` and
`triton_fused.moe_presets_from_json` load), presets_snippet.py (the same as Python literals to
paste as SHAPE_PRESETS / MOE_PRESETS), summary.txt (the table printed last). `--smoke` runs the
same phases on tiny shapes (the CPU test, under TRITON_INTERPRET=1); `--plan decode` only M = 1
and 4 (the gemv kernel beside the tensor-core one), the anatomy at M = 1 and DeepSeek-V3's layer;
`--plan m64` the dense grid at M = 64 on TMA loads; `--plan moe` only the fused MoE's points;
`--plan moe-wide` the fused MoE at 64 and 128 pairs an expert (GLM-5 B = 2048, 4096).
Every grid holds both load paths, cp.async pointer loads and TMA tensor descriptors, and both
weight layouts of the dense kernel, row by row and tile by tile, unless the plan names one
(`Plan.loads`, `Plan.layouts`); the anatomy times the fastest config of each.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import read_floor  # noqa: E402  (beside this script)
import tune_w4a16 as tune  # noqa: E402  (the dense grid lives beside this script)

from fp4lab import bench, ceilings, roofline  # noqa: E402
from fp4lab.backends import stream_kernel  # noqa: E402
from fp4lab.backends.moe import base as moe_base, get as get_moe  # noqa: E402
from fp4lab.backends.moe.triton_fused import (  # noqa: E402
    CALL_PARTS, MoeTileConfig, choose_moe_config)
from fp4lab.backends.triton_w4a16 import (  # noqa: E402
    ANATOMY_STAGES, LAYOUTS, LOADS, anatomy_variants, choose_config, sm_count,
    tensor_core_config)
from fp4lab.moe import presets as model_presets, routing  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one call measures (configuration as data: `FULL` on the H200, `SMOKE` on a CPU)."""

    shapes: tuple[tuple[int, int], ...]
    m_values: tuple[int, ...]
    anatomy_m: tuple[int, ...]
    moe_points: tuple[tuple[str, int], ...]     # (model preset, batch), most wanted first
    moe_scaled: bool = False                    # tiny stand-ins of the models (CPU)
    mxfp4_configs: int = 3                      # nvfp4's best configs re-timed in mxfp4
    max_configs: int | None = None              # cap on each grid per point (smoke)
    step_limit_s: float = 60.0                  # one step (compile + gate + time) at most
    budget_s: float = 150.0                     # all phases, unless --budget-s says otherwise
    loads: tuple[str, ...] = LOADS              # the kernels' load paths in the grids
    layouts: tuple[str, ...] = LAYOUTS          # the dense kernel's weight layouts in the grids


FULL = Plan(shapes=((8192, 8192), (4096, 6144), (6144, 2048)), m_values=(1, 4, 16, 64, 256),
            anatomy_m=(1, 16),
            moe_points=(("glm-5", 512), ("deepseek-v3", 512), ("glm-5", 64)))
# the decode M on the three shapes with the gemv kernel beside the tensor-core one, the anatomy
# at M = 1, and the DeepSeek-V3 MoE layer (GLM-5's is in FULL)
DECODE = Plan(shapes=FULL.shapes, m_values=(1, 4), anatomy_m=(1,),
              moe_points=(("deepseek-v3", 512),), mxfp4_configs=2)
# M = 64, where humming is within 1% of the tensor-core kernel at 8192x8192: the grid on the
# load path and layout that won every M = 64 point (TMA, rows: calls 31 and 35), mxfp4 over
# nvfp4's three best, cuBLAS bf16 beside; no anatomy, no MoE
M64 = Plan(shapes=FULL.shapes, m_values=(64,), anatomy_m=(), moe_points=(), loads=("tma",),
          layouts=("rows",))
# the fused MoE alone: its three points, no dense phase
MOE = Plan(shapes=(), m_values=(), anatomy_m=(), moe_points=FULL.moe_points)
# the fused MoE where each expert sees 64 and 128 pairs (GLM-5 at B = 2048 and 4096 on one GPU:
# the per-expert load of the busiest EP 8 rank at 8 x 256 and 8 x 512 tokens, where the decode
# presets' 32-pair tiles ran 25-35% behind humming, call 93), on the presets' TMA loads
MOE_WIDE = Plan(shapes=(), m_values=(), anatomy_m=(), moe_points=(("glm-5", 4096), ("glm-5", 2048)),
                loads=("tma",), layouts=("rows",))
PLANS = {"full": FULL, "decode": DECODE, "m64": M64, "moe": MOE, "moe-wide": MOE_WIDE}
SMOKE = Plan(shapes=((48, 128),), m_values=(1, 3), anatomy_m=(1,),
             moe_points=(("glm-5", 6),), moe_scaled=True, mxfp4_configs=1, max_configs=4,
             step_limit_s=120.0, budget_s=900.0)   # the interpreter runs at the CPU's pace
FORMATS = ("nvfp4", "mxfp4")
LAUNCH_PREDICTION_NOTE = "predicted = FP4 bytes / measured copy bandwidth + measured launch floor"


class StepTimeout(Exception):
    pass


@contextlib.contextmanager
def step_limit(seconds: float):
    """Raise StepTimeout in this step after `seconds` (SIGALRM: interrupts Python, not a kernel
    stuck on the GPU; the outer `timeout` of the command covers that)."""
    def expire(signum, frame):
        raise StepTimeout(f"step over its {seconds:.0f} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Run:
    """The measurement log, the deadline, and what the summary needs."""

    def __init__(self, out: Path, budget_s: float, plan: Plan, device: str):
        self.out, self.plan, self.device = out, plan, device
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.lines = open(out / "measurements.jsonl", "w")
        self.rows: list[dict] = []
        self.timer = tune.device_timer()
        self.ceilings = None

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def emit(self, row: dict) -> None:
        row = {**row, "t_s": round(time.monotonic() - self.started, 1)}
        if "median_us" in row:   # the prediction beside each measurement
            if "bytes" in row:
                row["predicted_us"] = self.predicted_us(row["bytes"])
            elif row["kind"] == "anatomy":
                row["predicted_us"] = self.predicted_us(row["weight_bytes"])
            elif row["kind"] == "moe":
                row["floor_us"] = self.predicted_us(row["weight_bytes"], launches=0)
        self.rows.append(row)
        self.lines.write(json.dumps(row, default=str) + "\n")
        self.lines.flush()

    def step(self, kind: str, what: dict, work) -> dict | None:
        """Run `work()` (returning a row) inside the step limit and the deadline; emit its row
        and return it as logged."""
        if self.left_s() <= 0:
            self.emit({"kind": kind, **what, "status": "skipped", "message": "budget spent"})
            return None
        try:
            with step_limit(min(self.plan.step_limit_s, self.left_s() + 5)):
                row = work()
        except Exception as exc:  # noqa: BLE001 - a step that fails is a row with its reason
            row = {"status": "error", "message": tune.first_line(exc)}
        self.emit({"kind": kind, **what, **row})
        return self.rows[-1]

    def predicted_us(self, nbytes: float, launches: int = 1) -> float | None:
        """bytes / measured copy bandwidth + `launches` x the measured launch floor."""
        c = self.ceilings
        if not c or not c.bandwidth_tbps:
            return None
        return nbytes / (c.bandwidth_tbps * 1e6) + launches * (c.launch_us or 0.0)


# --- phases --------------------------------------------------------------------------------------

def phase_ceilings(run: Run) -> None:
    def work():
        run.ceilings = ceilings.measure_ceilings(run.device)
        return {"status": "ok", **dataclasses.asdict(run.ceilings)}
    run.step("ceilings", {}, work)


def phase_dense(run: Run, cache: dict) -> dict:
    """nvfp4 over the grid, mxfp4 over nvfp4's best configs, cuBLAS at each (shape, M)."""
    sms = sm_count(run.device)
    winners: dict[tuple, dict] = {}
    ranked: dict[tuple, list] = {}
    for fmt in FORMATS:
        for n, k in run.plan.shapes:
            for m in run.plan.m_values:
                point = tune.Point(fmt, n, k, m)
                grid = (tune.candidates(point, sms, run.plan.loads,
                                        run.plan.layouts)[:run.plan.max_configs]
                        if fmt == "nvfp4"
                        else ranked.get((n, k, m), [])[:run.plan.mxfp4_configs])
                a, w = tune.operands(point, run.device, cache)
                if fmt == "nvfp4":
                    run.step("cublas", {"n": n, "k": k, "m": m, "fmt": fmt},
                             lambda: tune.measure_cublas(point, a, w, run.device, run.timer))
                timed = []
                for config in grid:
                    row = run.step("dense", {**dataclasses.asdict(point), "label": config.label()},
                                   lambda c=config: tune.measure_config(point, c, a, w,
                                                                       run.device, run.timer))
                    if row and "median_us" in row:
                        timed.append(row)
                if not timed and run.left_s() > 0:   # nothing passed: the plain-Triton decode
                    config = dataclasses.replace(choose_config(m, n, k, sms), decode="bits")
                    row = run.step("dense", {**dataclasses.asdict(point), "label": config.label()},
                                   lambda: tune.measure_config(point, config, a, w, run.device,
                                                               run.timer))
                    if row and "median_us" in row:
                        timed.append(row)
                timed.sort(key=lambda r: r["median_us"])
                if fmt == "nvfp4":
                    ranked[(n, k, m)] = [tune.TileConfig(**r["config"]) for r in timed]
                if timed:
                    winners[(fmt, n, k, m)] = timed[0]
    return winners


def best_dot_rows(run: Run, n: int, k: int, m: int) -> list[dict]:
    """The fastest timed nvfp4 tensor-core ("dot") config at this point for each load path
    ("pointer", "tma") and weight layout ("rows", "tiles") that has one, fastest first."""
    best: dict[tuple, dict] = {}
    for r in run.rows:
        if (r["kind"] == "dense" and r.get("median_us") and r["config"]["math"] == "dot"
                and (r["fmt"], r["n"], r["k"], r["m"]) == ("nvfp4", n, k, m)):
            kind = (r["config"].get("loads", "pointer"), r["config"].get("layout", "rows"))
            if kind not in best or r["median_us"] < best[kind]["median_us"]:
                best[kind] = r
    return sorted(best.values(), key=lambda r: r["median_us"])


def phase_anatomy(run: Run, cache: dict) -> None:
    """Every stage of the tensor-core kernel with the point's fastest config of each load path
    and layout (the preset when none was timed)."""
    for n, k in run.plan.shapes:
        for m in run.plan.anatomy_m:
            point = tune.Point("nvfp4", n, k, m)
            configs = ([tune.TileConfig(**r["config"]) for r in best_dot_rows(run, n, k, m)]
                       or [tensor_core_config(m, n, k, sm_count(run.device))])
            a, w = tune.operands(point, run.device, cache)
            for config in configs:
                for stage in ANATOMY_STAGES:
                    if stage == "stream" and config is not configs[0]:
                        continue   # the same bytes, whatever the kernel's config
                    what = {**dataclasses.asdict(point), "stage": stage, "label": config.label()}
                    run.step("anatomy", what,
                             lambda s=stage, c=config: anatomy_row(run, a, w, c, s))


def phase_read_floor(run: Run, cache: dict) -> None:
    """The anatomy's stream beside the best launch shape for the same bytes (none without an
    anatomy)."""
    for n, k in run.plan.shapes if run.plan.anatomy_m else ():
        point = tune.Point("nvfp4", n, k, 1)
        _, w = tune.operands(point, run.device, cache)
        words = stream_kernel.as_words(w.packed, w.scales)
        run.step("read_floor", {"n": n, "k": k, "fmt": "nvfp4"},
                 lambda: read_floor_row(run, words))


def read_floor_row(run: Run, words) -> dict:
    rows = read_floor.measure(words, run.timer, run.device)
    timed = [r for r in rows if "median_us" in r]
    if not timed:
        return {"status": "error", "message": "; ".join(r["message"] for r in rows)}
    best = min(timed, key=lambda r: r["median_us"])
    return {**best, "shapes": rows}


def anatomy_row(run: Run, a, w, config, stage: str) -> dict:
    variant, = anatomy_variants(a, w, run.device, config, stages=(stage,))
    gate = variant.check()
    row = {"status": gate.status, "rel_err": gate.rel_err, "message": gate.message,
           "what": variant.what, "weight_bytes": variant.weight_bytes}
    if gate.ok:
        p = variant.prepared
        timing = bench.time_call(p.make_call, p.args, p.out, run.timer, run.device)
        row.update(tune.timing_fields(timing))
        row["tbps"] = variant.weight_bytes / timing.median_us / 1e6
    return row


def moe_model(name: str, scaled: bool):
    preset = model_presets.get(name)
    return model_presets.scaled_down(preset) if scaled else preset


def moe_candidates(pairs: int, experts: int, loads=LOADS, layouts=LAYOUTS,
                   inter_hidden: tuple[int, int] = (2048, 6144)) -> list[MoeTileConfig]:
    """The preset's config (the measured winner) first, then on each of `loads` in turn: the
    same, with the neighbouring pair tile (16 <-> 32, 64 -> 32: a taller one spills
    registers), one pipeline stage deeper (bytes in flight), and with BK 256 on 8 warps (half
    the K steps' fixed work per weight, the registers of the doubled tile spread over twice the
    threads); then on the preset's load path, 8 warps with twice the N tile of gate_up, of down,
    of both and of neither (each work item's gathered activations are re-read from L2 by every
    N tile: N/BN times; the wider tile's registers spread over twice the threads); then on the
    preset's load path the narrower ways: 2 warps, half gate_up's N tile (twice the CTAs), one
    stage fewer, and BK 64 one stage deeper (the registers of a smaller step buy warps an SM:
    the fused MoE issues 4.5 instructions a weight with warps waiting on each other); then the
    preset in each other layout of `layouts` on each of `loads` (its N tiles narrowed where
    they do not divide the model's I and H, `inter_hidden`: "tiles" needs it). Where an expert
    sees more pairs on average than two 32-pair tiles hold, taller pair tiles on 8 warps last
    (64 and 128 pairs, the 64 also with twice gate_up's N tile): fewer re-reads of each weight
    tile, one per pair tile."""
    pick = choose_moe_config(pairs, experts)
    variants = [pick, dataclasses.replace(pick, block_m=32 if pick.block_m != 32 else 16),
                dataclasses.replace(pick, num_stages=pick.num_stages + 1),
                dataclasses.replace(pick, block_k=256, num_warps=8)]
    grid = [dataclasses.replace(config, loads=kind) for config in variants for kind in loads]
    inter, hidden = inter_hidden
    gate_up, down = pick.block_n_gate_up, pick.block_n_down
    grid += [dataclasses.replace(pick, num_warps=8,
                                 block_n_gate_up=dividing_tile(gate_up * g, inter),
                                 block_n_down=dividing_tile(down * d, hidden))
             for g, d in ((1, 1), (2, 1), (1, 2), (2, 2))]
    grid += [dataclasses.replace(pick, num_warps=2),
             dataclasses.replace(pick, block_n_gate_up=max(gate_up // 2, 16)),
             dataclasses.replace(pick, num_stages=max(pick.num_stages - 1, 1)),
             dataclasses.replace(pick, block_k=64, num_stages=pick.num_stages + 1)]
    fitted = dataclasses.replace(pick, block_n_gate_up=dividing_tile(gate_up, inter),
                                 block_n_down=dividing_tile(down, hidden))
    grid += [dataclasses.replace(fitted, loads=kind, layout=layout) for layout in layouts
             if layout != pick.layout for kind in loads]
    if pairs / experts > 2 * 32:
        grid += [dataclasses.replace(pick, block_m=64, num_warps=8),
                 dataclasses.replace(pick, block_m=64, num_warps=8,
                                     block_n_gate_up=dividing_tile(2 * gate_up, inter)),
                 dataclasses.replace(pick, block_m=128, num_warps=8)]
    return list(dict.fromkeys([pick] + grid))


def dividing_tile(block_n: int, n: int) -> int:
    """The largest power of two <= block_n that divides n (at least 16, MoeTileConfig's least)."""
    while block_n > 16 and n % block_n:
        block_n //= 2
    return block_n


def moe_fallback(pairs: int, experts: int) -> MoeTileConfig:
    """Timed only when no candidate passed: the preset with the plain-Triton decode."""
    return dataclasses.replace(choose_moe_config(pairs, experts), decode="bits")


def phase_moe(run: Run) -> list[dict]:
    winners = []
    for fmt in FORMATS:
        weights_for: dict = {}
        for name, batch in run.plan.moe_points:
            model = moe_model(name, run.plan.moe_scaled)
            what = {"model": model.key, "batch": batch, "fmt": fmt}
            if model.key not in weights_for:
                weights_for.clear()              # one model's weights on the GPU at a time
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                row = run.step("moe_weights", what,
                               lambda: build_weights(run, model, fmt, weights_for))
                if not row or row["status"] != "ok":
                    continue
            ids = routing.sample_expert_ids("uniform", model.experts, model.top_k, batch, 1)[0]
            problem = moe_base.make_layer_problem(ids, model.experts, model.hidden,
                                                  model.moe_intermediate, fmt, run.device,
                                                  weights=weights_for[model.key])
            timed = []
            pairs = batch * model.top_k
            for config in moe_candidates(pairs, model.experts, run.plan.loads,
                                         run.plan.layouts, (model.moe_intermediate, model.hidden)
                                         )[:run.plan.max_configs]:
                row = run.step("moe", {**what, "label": config.label()},
                               lambda c=config: moe_row(run, problem, c))
                if row and "median_us" in row:
                    timed.append(row)
            if not timed:
                config = moe_fallback(pairs, model.experts)
                row = run.step("moe", {**what, "label": config.label()},
                               lambda: moe_row(run, problem, config))
                if row and "median_us" in row:
                    timed.append(row)
            if timed:
                best = min(timed, key=lambda r: r["median_us"])
                winners.append({**what, "mean_pairs_per_expert": batch * model.top_k /
                                model.experts, "config": best["config"],
                                "median_us": best["median_us"]})
                config = MoeTileConfig(**best["config"])
                for until in CALL_PARTS[:-1]:
                    run.step("moe_part", {**what, "label": config.label(), "until": until},
                             lambda u=until: moe_part_row(run, problem, config, u))
    return winners


def moe_part_row(run: Run, problem, config: MoeTileConfig, until: str) -> dict:
    """The best config's call stopped after launch `until` (timed, not gated: its output is a
    prefix's; the whole call passed the gate): the launches' times are the differences."""
    call = get_moe("triton-w4a16-moe").prepare(problem, config=config, until=until)
    timing = bench.time_call(call.make_call, call.args, call.out, run.timer, run.device)
    return {"status": "ok", "message": f"the call up to {until}, not gated",
            "config": dataclasses.asdict(config), **tune.timing_fields(timing)}


def build_weights(run: Run, model, fmt: str, weights_for: dict) -> dict:
    start = time.monotonic()
    weights_for[model.key] = (
        moe_base.quantized_expert_weights(model.experts, 2 * model.moe_intermediate,
                                          model.hidden, fmt, run.device),
        moe_base.quantized_expert_weights(model.experts, model.hidden, model.moe_intermediate,
                                          fmt, run.device, seed=1))
    nbytes = sum(w.nbytes for w in weights_for[model.key])
    return {"status": "ok", "bytes": nbytes, "build_s": time.monotonic() - start}


def moe_row(run: Run, problem, config: MoeTileConfig) -> dict:
    call = get_moe("triton-w4a16-moe").prepare(problem, config=config)
    gate = moe_base.check_call(call, problem)
    row = {"status": gate.status, "rel_err": gate.rel_err, "message": gate.message,
           "config": dataclasses.asdict(config), "weight_bytes": call.weight_bytes,
           "note": call.note, "loads_max": int(problem.loads.max()),
           "loads_mean_active": float(problem.loads[problem.loads > 0].mean())}
    if gate.ok:
        timing = bench.time_call(call.make_call, call.args, call.out, run.timer, run.device)
        row.update(tune.timing_fields(timing))
    return row


# --- presets and summary -------------------------------------------------------------------------

def write_presets(run: Run, dense: dict, moe: list[dict]) -> None:
    """presets.json (rows: triton_w4a16.presets_from_json, triton_fused.moe_presets_from_json
    load them) and presets_snippet.py (the same nvfp4 winners as Python to paste)."""
    rows = list(dense.values())
    presets = {"dense": {fmt: tune.presets_rows(rows, fmt) for fmt in FORMATS}, "moe": moe,
               "note": "dense[fmt] rows load with triton_w4a16.presets_from_json (nvfp4 is what "
                       "SHAPE_PRESETS holds); moe rows with triton_fused.moe_presets_from_json"}
    (run.out / "presets.json").write_text(json.dumps(presets, indent=1, default=str))
    (run.out / "presets_snippet.py").write_text(presets_snippet(presets))


def presets_snippet(presets: dict) -> str:
    """SHAPE_PRESETS and MOE_PRESETS as Python literals (nvfp4 winners), fields that differ from
    the dataclass defaults only."""
    from fp4lab.backends.moe.triton_fused import moe_presets_from_json
    from fp4lab.backends.triton_w4a16 import presets_from_json

    lines = ["# measured by benchmarks/h200_kernels.py; paste into triton_w4a16.py / "
             "moe/triton_fused.py", "SHAPE_PRESETS = {"]
    for shape, entries in presets_from_json(presets["dense"]["nvfp4"]).items():
        lines.append(f"    {shape}: (")
        lines += [f"        ({m_max}, {source(config)})," for m_max, config in entries]
        lines.append("    ),")
    lines += ["}", "MOE_PRESETS = ("]
    lines += [f"    ({bound}, {source(config)})," for bound, config in
              moe_presets_from_json(presets["moe"])]
    return "\n".join(lines + [")", ""])


def source(config) -> str:
    """`Name(field=value, ...)` naming only the fields that differ from the defaults."""
    fields = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
              if f.default is dataclasses.MISSING or getattr(config, f.name) != f.default]
    return f"{type(config).__name__}({', '.join(fields)})"


def summary(run: Run) -> str:
    rows = run.rows
    c = run.ceilings
    lines = [f"ceilings: copy {c.bandwidth_tbps:.2f} TB/s, launch {c.launch_us:.2f} us" if c
             else "ceilings: not measured", LAUNCH_PREDICTION_NOTE, ""]
    cublas = {(r["n"], r["k"], r["m"]): r.get("median_us") for r in rows if r["kind"] == "cublas"}
    lines.append(f"{'dense':<6} {'NxK':>10} {'M':>4} {'fmt':<5} {'best us':>8} {'pred':>6} "
                 f"{'TB/s':>5} {'%copy':>5} {'cuBLAS':>7} {'x':>5}  config")
    best: dict = {}
    for r in rows:
        if r["kind"] == "dense" and "median_us" in r:
            key = (r["fmt"], r["n"], r["k"], r["m"])
            if key not in best or r["median_us"] < best[key]["median_us"]:
                best[key] = r
    for (fmt, n, k, m), r in sorted(best.items(), key=lambda i: (i[0][0] != "nvfp4", i[0][1:])):
        ref = cublas.get((n, k, m))
        pct = 100 * r["tbps"] / c.bandwidth_tbps if c and c.bandwidth_tbps else float("nan")
        lines.append(f"{'':<6} {f'{n}x{k}':>10} {m:>4} {fmt:<5} {r['median_us']:8.2f} "
                     f"{r.get('predicted_us') or float('nan'):6.1f} {r['tbps']:5.2f} {pct:5.0f} "
                     f"{ref or float('nan'):7.2f} {(ref or float('nan')) / r['median_us']:5.2f}  "
                     f"{r['label']}")
    lines += ["", f"{'anatomy':<8} {'NxK':>10} {'M':>4} " + " ".join(
        f"{s:>9}" for s in ANATOMY_STAGES) + "  config"]
    anatomy: dict = {}
    streams: dict = {}                     # one stream a point: the same bytes for every config
    for r in rows:
        if r["kind"] == "anatomy" and r["stage"] == "stream":
            streams[(r["n"], r["k"], r["m"])] = r
        elif r["kind"] == "anatomy":
            anatomy.setdefault((r["n"], r["k"], r["m"], r["label"]), {})[r["stage"]] = r
    for (n, k, m, label), stages in anatomy.items():
        stages = {"stream": streams.get((n, k, m), {}), **stages}
        cells = [f"{stages[s]['median_us']:9.2f}" if "median_us" in stages.get(s, {})
                 else f"{stages.get(s, {}).get('status', '-'):>9.9}"
                 for s in ANATOMY_STAGES]
        lines.append(f"{'':<8} {f'{n}x{k}':>10} {m:>4} " + " ".join(cells) + f"  {label}")
    lines += ["", "read floor (the fastest one-launch read of the weight bytes)"]
    for r in rows:
        if r["kind"] == "read_floor":
            us = r.get("median_us")
            shape = f"{r['n']}x{r['k']}"
            lines.append(f"{'':<8} {shape:>10} "
                         + (f"{us:9.2f} us {r['tbps']:5.2f} TB/s  {r['label']}" if us
                            else f"{r['status']}: {r.get('message', '')}"))
    lines += ["", f"{'moe':<4} {'model':<12} {'B':>5} {'fmt':<5} {'us':>9} {'floor':>8} "
                  f"{'x floor':>7} {'rel_err':>8}  config"]
    for r in rows:
        if r["kind"] == "moe":
            us = r.get("median_us")
            floor = r.get("floor_us")
            lines.append(f"{'':<4} {r['model']:<12} {r['batch']:>5} {r['fmt']:<5} "
                         f"{us if us else float('nan'):9.1f} {floor or float('nan'):8.1f} "
                         f"{(us / floor) if us and floor else float('nan'):7.2f} "
                         f"{r.get('rel_err', float('nan')):8.1e}  {r['label']} {r['status']}")
    lines += moe_parts_lines(rows)
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines += ["", "rows by status: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))]
    return "\n".join(lines)


def moe_parts_lines(rows: list[dict]) -> list[str]:
    """The best MoE config's launches apart: each part is its prefix's time minus the one before
    (route, gate_up, down, then torch's top-k sum: the whole call)."""
    lines = ["", f"{'moe parts':<10} {'model':<12} {'B':>5} {'fmt':<5} "
             + " ".join(f"{p:>8}" for p in CALL_PARTS) + "  (us; config)"]
    for r in rows:
        if r["kind"] != "moe" or "median_us" not in r:
            continue
        prefixes = {p["until"]: p.get("median_us") for p in rows if p["kind"] == "moe_part"
                    and (p["model"], p["batch"], p["fmt"], p["label"])
                    == (r["model"], r["batch"], r["fmt"], r["label"])}
        if not prefixes:
            continue
        prefixes["sum"] = r["median_us"]
        times = [prefixes.get(p) for p in CALL_PARTS]
        parts = [times[0]] + [t - before if t and before else None
                              for before, t in zip(times, times[1:])]
        lines.append(f"{'':<10} {r['model']:<12} {r['batch']:>5} {r['fmt']:<5} "
                     + " ".join(f"{p:8.1f}" if p is not None else f"{'-':>8}" for p in parts)
                     + f"  {r['label']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the results (e.g. $OUT)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall seconds for all phases (default 150; 900 with --smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes (the CPU test under TRITON_INTERPRET=1)")
    parser.add_argument("--plan", choices=PLANS, default="full",
                        help="full: every phase at M = 1..256, GLM-5 and DeepSeek-V3; decode: "
                             "M = 1 and 4 with the gemv kernel, anatomy at M = 1, DeepSeek-V3; "
                             "m64: the dense grid at M = 64 on TMA loads; moe: the fused MoE's "
                             "points only; moe-wide: the fused MoE at 64 and 128 pairs an expert "
                             "(default full)")
    args = parser.parse_args(argv)
    device = tune.script_device("h200_kernels", args.smoke)
    if device is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = SMOKE if args.smoke else PLANS[args.plan]
    run = Run(out, plan.budget_s if args.budget_s is None else args.budget_s, plan, device)
    if args.smoke:
        run.timer = dataclasses.replace(run.timer, repeats=2, warmup_s=0.0)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    dense, moe = {}, []
    try:
        phase_ceilings(run)
        cache: dict = {}
        dense = phase_dense(run, cache)
        phase_anatomy(run, cache)
        phase_read_floor(run, cache)
        cache.clear()
        moe = phase_moe(run)
    except KeyboardInterrupt:   # the outer timeout: keep what was measured
        run.emit({"kind": "stopped", "status": "stopped", "message": "SIGTERM or ^C"})
    finally:
        write_presets(run, dense, moe)
        text = summary(run)
        (out / "summary.txt").write_text(text + "\n")
        run.lines.close()
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
