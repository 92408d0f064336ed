"""The GEMM sweep: backends x formats x shapes x M, one tidy row per point.

Parent (`run_sweep`): plans the grid, records points that cannot run here as `unavailable` at once,
measures the ceilings once, then hands each backend's points to a worker (fp4lab.sweep.runner).
Worker (`measure_job`): per point, inputs -> prepare -> correctness gate -> timer -> energy window.
Rows hold what was measured; TFLOP/s, % of peak and the bound are derived when read
(fp4lab.analysis.gemm), so no file is rewritten at the end.

Point legend: `fmt` FP4 format, `N` output features, `K` reduction dim, `M` tokens; the GEMM is
a[M, K] bf16 @ w[N, K]^T with w quantized to `fmt`.
"""

from __future__ import annotations

import collections
import zlib
from typing import Any

from fp4lab import schema
from fp4lab.results import RunDir, provenance, utc_now
from fp4lab.sweep import runner
from fp4lab.sweep.config import GemmSweep
from fp4lab.sweep.plan import AnatomyPoint, GemmPoint, anatomy_points, gemm_points
from fp4lab.sweep.registry import backend

FAILED = ("error", "oom", "timeout")      # statuses `retry_failed` measures again
LOG_HEADER = (f"{'backend':<19} {'fmt':<5} {'M':>6} {'N':>6} {'K':>6} {'status':<12} "
              f"{'median_us':>10} {'TFLOP/s':>8} {'TB/s':>6} {'rel_err':>8}")


# -- worker side ----------------------------------------------------------------------------------

def stable_seed(*parts: Any) -> int:
    """A seed that is the same in every process (hash() of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def make_activations(m: int, k: int, seed: int, device: str):
    """a: [M, K] bf16, standard normal, seeded by (seed, M, K) so every backend sees the same."""
    import torch

    generator = torch.Generator(device=device).manual_seed(stable_seed(seed, "a", m, k))
    return torch.randn(m, k, generator=generator, device=device).to(torch.bfloat16)


def make_weights(fmt: str, n: int, k: int, seed: int, device: str):
    """w: [N, K] standard normal, quantized to `fmt` (once per shape; reused across M)."""
    import torch

    from fp4lab.formats import quantize

    generator = torch.Generator(device=device).manual_seed(stable_seed(seed, "w", fmt, n, k))
    return quantize(torch.randn(n, k, generator=generator, device=device), fmt)


def start_worker(impl, device: str, timer_values: dict, send):
    """A worker's first steps: import the backend (or method) once and answer `unavailable` with
    its reason; else warm the clocks on a GPU and answer `ready`. Returns (timer, device facts),
    None when unavailable."""
    from fp4lab import bench
    from fp4lab.bench import TimerConfig

    available, reason = impl.availability(device)          # imports the package, once
    if not available:
        send("unavailable", reason=reason)
        return None
    timer = TimerConfig.from_dict(timer_values)
    facts = device_facts(device)
    if facts["device"] == "cuda":
        bench.warm_up_clocks(device, timer)
    send("ready")
    return timer, facts


def device_facts(device: str) -> dict[str, Any]:
    """device, gpu_index, pci_bus_id of the device a worker measures on."""
    import torch

    from fp4lab import nvml

    if not device.startswith("cuda"):
        return {"device": "cpu", "gpu_index": None, "pci_bus_id": None}
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return {"device": "cuda", "gpu_index": index, "pci_bus_id": nvml.pci_bus_id(index)}


def point_row(run_id: str, point: GemmPoint, impl, status: str, error: str | None = None,
              facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A gemm row of `point` with its identity, the backend's dtypes and the device's facts."""
    described = impl.describe() if impl is not None else {}
    return schema.blank_row("gemm", run_id=run_id, **point.identity(), **described,
                            status=status, error=error, **(facts or {}))


def timing_columns(timing) -> dict[str, Any]:
    return {"median_us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us,
            "samples": timing.n, "graph": timing.graph, "cold_l2": timing.cold_l2,
            "copies": timing.copies, "calls_per_sample": timing.calls_per_sample,
            "timer_note": timing.note or None, "sm_clock_mhz": timing.sm_clock_mhz,
            "sm_clock_start_mhz": timing.sm_clock_start_mhz, "sm_clock_end_mhz": timing.sm_clock_end_mhz}


def energy_columns(call, seconds: float, device_index: int) -> dict[str, Any]:
    """Power and energy per call over a counter-aligned window (None values without NVML)."""
    from fp4lab.telemetry import measure_energy_window

    window = measure_energy_window(call, seconds, device_index=device_index)
    return {"avg_power_w": window.get("avg_power_w"), "energy_per_call_j": window.get("energy_per_call_j"),
            "window_sm_clock_mhz": window.get("sm_clock_mhz"),
            "throttle_reasons": window.get("throttle_reasons"),
            "window_start_s": window.get("window_start_s"), "window_end_s": window.get("window_end_s")}


def tolerance_for(impl, fmt: str) -> float:
    """The gate's tolerance: keyed by the weights' format, else by the math dtype."""
    from fp4lab.correctness import TOLERANCE

    for key in (fmt, impl.math_dtype):
        if key in TOLERANCE:
            return TOLERANCE[key]
    raise ValueError(f"no correctness tolerance for {fmt!r} or math dtype {impl.math_dtype!r}")


def measure_point(point: GemmPoint, impl, weights, job: dict[str, Any], timer, facts) -> dict:
    """One row: the gate first (wrong_result rows carry rel_err and no time), then the timer."""
    from fp4lab import bench
    from fp4lab.correctness import check_backend

    device = job["device"]
    a = make_activations(point.m, point.k, job["seed"], device)
    prepared = impl.prepare(a, weights, device)
    row = point_row(job["run_id"], point, impl, "ok", facts=facts)
    row.update({name: prepared.info.get(name) for name in ("compile_s", "config", "launch")})
    gate = check_backend(prepared, tolerance_for(impl, point.fmt))
    row["rel_err"] = gate.rel_err
    if not gate.ok:
        row.update(status=gate.status, error=gate.message)
        return row
    timing = bench.time_call(prepared.make_call, prepared.args, prepared.out, timer, device)
    row.update(timing_columns(timing))
    if job["energy_window_s"] > 0 and facts["gpu_index"] is not None:
        row.update(energy_columns(prepared.call, job["energy_window_s"], facts["gpu_index"]))
    return row


def failed_row(job: dict[str, Any], point: GemmPoint, impl, exc: Exception, facts) -> dict:
    import torch

    from fp4lab.sweep.worker import first_line

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return point_row(job["run_id"], point, impl, "oom", first_line(exc), facts)
    return point_row(job["run_id"], point, impl, "error", first_line(exc), facts)


def measure_job(job: dict[str, Any], send) -> None:
    """Worker: measure one backend's points (see fp4lab.sweep.runner for the protocol)."""
    impl = backend(job["group"])
    started = start_worker(impl, job["device"], job["timer"], send)
    if started is None:
        return
    timer, facts = started
    cached_key, weights = None, None
    for identity in job["points"]:
        point = GemmPoint(**identity)
        send("start", point=identity)
        try:
            if cached_key != (point.fmt, point.n, point.k):
                cached_key, weights = None, None          # free the previous shape's weights first
                weights = make_weights(point.fmt, point.n, point.k, job["seed"], job["device"])
                cached_key = (point.fmt, point.n, point.k)
            row = measure_point(point, impl, weights, job, timer, facts)
        except Exception as exc:  # noqa: BLE001 - any failure of one point becomes its row
            row = failed_row(job, point, impl, exc, facts)
        send("row", point=identity, row=row)


# -- parent side ----------------------------------------------------------------------------------

def format_point_line(row: dict[str, Any]) -> str:
    """One fixed-width line per measured point (the columns of LOG_HEADER)."""
    from fp4lab import roofline
    from fp4lab.text import printable, sig

    if "stage" in row:
        row = {**row, "backend": f"{row['backend']}:{row['stage']}", "weight_dtype": None}
    tflops = tbps = None
    if row.get("median_us") and row.get("weight_dtype"):
        flops = roofline.gemm_flops(row["m"], row["n"], row["k"])
        moved = roofline.gemm_bytes(row["m"], row["n"], row["k"], row["weight_dtype"], row["fmt"],
                                    row["act_dtype"])
        tflops, tbps = flops / row["median_us"] / 1e6, moved / row["median_us"] / 1e6
    return printable(f"{row['backend']:<19.19} {row['fmt']:<5} {row['m']:>6} {row['n']:>6} {row['k']:>6} "
                     f"{row['status']:<12} {sig(row.get('median_us'), 4):>10} {sig(tflops):>8} {sig(tbps):>6} "
                     f"{sig(row.get('rel_err'), 2):>8}")


def _static_reason(impl, point, device: str) -> str | None:
    """Why `impl` cannot measure `point` here, by its rules alone (the worker checks the
    import): not on this device, not this format, or not this shape."""
    available, reason = impl.availability(device, import_check=False)
    if not available:
        return reason
    if point.fmt not in impl.formats:
        return f"{impl.name} does not take {point.fmt} weights (takes {', '.join(impl.formats)})"
    return impl.point_reason(point.m, point.n, point.k)


def todo_points(config: GemmSweep, run: RunDir, gpu_index, retry_failed: bool) -> list:
    """The GEMM and anatomy points the run does not hold yet for this GPU (failed ones too, with
    retry_failed: only this GPU's are dropped, the other ranks drop their own)."""
    todo = []
    for table, points in (("gemm", gemm_points(config)), ("anatomy", anatomy_points(config))):
        if retry_failed:
            failed = run.row_keys(table, FAILED)
            run.drop_rows(table, {p.key(gpu_index) for p in points} & failed)
        done = run.row_keys(table)
        todo += [p for p in points if p.key(gpu_index) not in done]
    return todo


def blank_for(run_id: str, point, status: str, error: str | None, facts: dict[str, Any]) -> dict:
    """The row of a point the worker could not measure, in the point's own table."""
    from fp4lab.sweep import anatomy

    if isinstance(point, AnatomyPoint):
        return anatomy.point_row(run_id, point, status, error, facts)
    return point_row(run_id, point, backend(point.backend), status, error, facts)


def run_sweep(config: GemmSweep, run: RunDir, *, retry_failed: bool = False, progress: bool = True,
              command: str | None = None) -> int:
    """Measure every point of `config` not yet in the run (a rerun or resume measures only what
    is missing), on the one device or, with `gpus: all`, on every GPU (fp4lab.sweep.ranks);
    returns how many points were measured now. Holds the run folder's lock."""
    from fp4lab import hardware
    from fp4lab.sweep import ranks

    device = hardware.resolve_device(config.device)
    with run.lock(command), runner.signals_as_interrupt():
        run.refresh_export("gemm")
        stored = run.run_json().get("sweep") or {}
        if "provenance" not in run.run_json():
            run.update_run_json(None, {"provenance": provenance(command, device)})
        nproc = ranks.ranks_for(config.gpus, device)
        run.update_run_json("sweep", {
            "config": config.as_dict(), "device": device, "command": command, "ranks": nproc,
            "started": stored.get("started") or utc_now(),
            "resumed": stored.get("resumed", []) + ([utc_now()] if stored else []),
            "status": "running"})
        status, failure = "interrupted", None
        rows_before = run.row_count(("gemm", "anatomy"))
        try:
            if nproc is None:
                measured = sweep_device(config, run, device, retry_failed=retry_failed, progress=progress)
            else:
                runner.ensure_ceilings(run, device)           # once, on GPU 0, before the ranks start
                measured = ranks.sweep_every_gpu(run, nproc, retry_failed, progress)
            status = "complete"
        except ranks.RanksFailed as exc:
            status, failure = "failed", str(exc)
            raise
        finally:
            run.update_run_json("sweep", {"ended": utc_now(), "status": status, "failure": failure})
            run.note_later_commit(("gemm", "anatomy"), rows_before)
    return measured


def sweep_device(config: GemmSweep, run: RunDir, device: str, *, retry_failed: bool = False,
                 progress: bool = True, label: str | None = None) -> int:
    """The grid on one device, in this process and its workers (the caller holds the lock):
    points the device cannot run become `unavailable` rows at once, the rest are measured by
    backend, with the NVML sampler on that GPU. Returns how many points were measured now."""
    from fp4lab.progress import Progress

    facts = device_facts(device)
    todo = todo_points(config, run, facts["gpu_index"], retry_failed)
    bar = Progress(len(todo), label or f"gemm {run.run_id}", header=LOG_HEADER) if progress else None

    def record(row: dict[str, Any]) -> None:
        run.append_rows("anatomy" if "stage" in row else "gemm", [row])
        if bar:
            bar.update(format_point_line(row))

    groups: dict[str, list] = collections.defaultdict(list)
    for point in todo:
        reason = _static_reason(backend(point.backend), point, device)
        if reason:
            record(blank_for(run.run_id, point, "unavailable", reason, facts))
        else:
            groups[point.group].append(point)
    sampler = None
    try:
        if groups:
            runner.ensure_ceilings(run, device)
            sampler = _start_sampler(config.telemetry_hz, facts["gpu_index"])
        job = {"run_id": run.run_id, "device": device, "seed": config.seed,
               "timer": config.timer.as_dict(), "energy_window_s": config.energy_window_s}
        for name, points in groups.items():
            kind = "anatomy" if isinstance(points[0], AnatomyPoint) else "gemm"
            runner.measure_group(
                name, points, {**job, "kind": kind}, runner.log_path(run, name), record,
                lambda point, status, error: blank_for(run.run_id, point, status, error, facts),
                config.point_timeout_s)
    finally:
        if bar:
            bar.close()
        if sampler is not None:
            save_telemetry(run, sampler)
    return len(todo)


def _start_sampler(rate_hz: float, gpu_index: int | None):
    from fp4lab.telemetry import Sampler

    if gpu_index is None:
        return None
    sampler = Sampler(rate_hz, gpu_index)
    if not sampler.available:
        return None
    return sampler.start()


def save_telemetry(run: RunDir, sampler) -> None:
    """The sampler's frame joins the run's telemetry table (a resumed run, and the other GPUs of
    a per-GPU sweep, keep theirs)."""
    import pandas as pd

    frame = sampler.stop()
    run.update_run_json("telemetry", sampler.metadata())
    if frame is None or not len(frame):
        return
    with run.table_lock("telemetry"):           # the ranks of a per-GPU sweep save theirs in turn
        if run.has_table("telemetry"):
            frame = pd.concat([run.read_table("telemetry"), frame], ignore_index=True)
        run.write_table("telemetry", frame)
