"""The sweep's worker process: `python -m fp4lab.sweep_worker` reads one JSON job on stdin.

Jobs: {"task": "ceilings", "device"} measures the roofline ceilings; {"task": "measure",
"backend", "device", "points", "timer", "energy_window_s", "ceilings", "run_id", "seed"} measures
each point: inputs -> prepare -> correctness gate -> timer -> roofline -> energy window.

It answers with JSON lines on its original stdout: `ready`, then per point `start` and `row`
(`ceilings` for the ceilings task), `error` for a job-level failure, `interrupted` on Ctrl-C.
Anything a library prints goes to stderr, which the parent keeps in the run folder's logs, so a
crash's last words reach the `error` row. Isolation is the point: a backend that segfaults or
poisons the CUDA context takes only this process down.

Point legend: M tokens, N output features, K reduction dim; a [M, K] bf16, w [N, K] quantized.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zlib
from typing import Any, TextIO

from fp4lab.sweep import Point, blank_row, load_extra_backends


def protocol_channel() -> TextIO:
    """Keep the real stdout for messages; send every other write to fd 1 to stderr."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def send(channel: TextIO, event: str, **payload: Any) -> None:
    channel.write(json.dumps({"event": event, **payload}, default=_json_default) + "\n")
    channel.flush()


def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


# -- inputs -----------------------------------------------------------------------------------

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


# -- one point --------------------------------------------------------------------------------

def tolerance_for(backend, fmt: str) -> float:
    """The gate's tolerance: keyed by the weights' format, else the operand dtype multiplied."""
    from fp4lab.correctness import TOLERANCE

    for key in (fmt, backend.math_dtype):
        if key in TOLERANCE:
            return TOLERANCE[key]
    raise ValueError(f"no correctness tolerance for math dtype {backend.math_dtype!r} or {fmt!r}")


def roofline_dtypes(backend) -> tuple[str, str | None]:
    """(weights dtype the timed call reads, activations dtype) for the roofline's byte count.

    A weight-only kernel reads FP4 weights but multiplies in bf16: `weight_dtype` "fp4",
    `act_dtype` "bf16".
    """
    return backend.weight_dtype, backend.act_dtype


def roofline_columns(point: Point, backend, median_us: float, ceilings: dict[str, Any]) -> dict:
    """tflops, tbps, bound and % of peak against the measured and the spec ceilings."""
    from fp4lab import roofline

    weight_dtype, act_dtype = roofline_dtypes(backend)
    flops = roofline.gemm_flops(point.m, point.n, point.k)
    moved = roofline.gemm_bytes(point.m, point.n, point.k, weight_dtype, point.fmt, act_dtype)
    columns = {"tflops": flops / median_us / 1e6, "tbps": moved / median_us / 1e6}
    measured_row = {**dataclasses.asdict(point), "weight_dtype": weight_dtype,
                    "act_dtype": act_dtype, "median_us": median_us}
    for source, column in (("measured", "pct_peak_measured"), ("spec", "pct_peak_spec")):
        if ceilings.get(source):
            verdict = roofline.classify(measured_row, roofline.Ceilings(**ceilings[source]))
            columns[column] = verdict["pct_peak"]
            if source == "measured" or "bound" not in columns:
                columns["bound"] = verdict["bound"]
    return columns


def energy_columns(call, seconds: float, flops: int) -> dict[str, Any]:
    """Power and energy per call over a counter-aligned window (None values without NVML)."""
    from fp4lab.telemetry import measure_energy_window, tflops_per_watt

    window = measure_energy_window(call, seconds)
    return {
        "avg_power_w": window.get("avg_power_w"),
        "energy_per_call_j": window.get("energy_per_call_j"),
        "tflops_per_w": tflops_per_watt(flops, window.get("energy_per_call_j")),
        "sm_clock_mhz": window.get("sm_clock_mhz"),
        "throttle_reasons": window.get("throttle_reasons"),
        "window_start_s": window.get("window_start_s"),
        "window_end_s": window.get("window_end_s"),
    }


def measure_point(point: Point, backend, weights, job: dict[str, Any], timer_config) -> dict:
    """One row: gate first (wrong_result rows carry rel_err and no timing), then time it."""
    from fp4lab import bench, roofline
    from fp4lab.correctness import check_backend

    device = job["device"]
    row = blank_row(job["run_id"], point, "ok")
    a = make_activations(point.m, point.k, job["seed"], device)
    prepared = backend.prepare(a, weights, device)
    gate = check_backend(prepared, tolerance_for(backend, point.fmt))
    row["rel_err"] = gate.rel_err
    if gate.status != "ok":
        row.update(status=gate.status, error=gate.message)
        return row
    timing = bench.time_call(prepared.make_call, prepared.args, prepared.out, timer_config, device)
    row.update(median_us=timing.median_us, p20_us=timing.p20_us, p80_us=timing.p80_us,
               graph=timing.graph, sm_clock_mhz=timing.sm_clock_mhz)
    row.update(roofline_columns(point, backend, timing.median_us, job["ceilings"]))
    if job["energy_window_s"] > 0:
        flops = roofline.gemm_flops(point.m, point.n, point.k)
        energy = energy_columns(prepared.call, job["energy_window_s"], flops)
        if energy["sm_clock_mhz"] is None:  # keep the timer's clock reading rather than erase it
            del energy["sm_clock_mhz"]
        row.update(energy)
    return row


def failed_row(point: Point, job: dict[str, Any], exc: Exception) -> dict:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return blank_row(job["run_id"], point, "oom", first_line(exc))
    return blank_row(job["run_id"], point, "error", first_line(exc))


# -- jobs -------------------------------------------------------------------------------------

def run_measure(job: dict[str, Any], channel: TextIO) -> None:
    from fp4lab import backends, bench

    backend = backends.get(job["backend"])
    timer_config = bench.TimerConfig(**job["timer"])
    if job["device"] == "cuda":
        bench.warm_up_clocks(job["device"], timer_config)
    send(channel, "ready")
    weights_key, weights = None, None
    for values in job["points"]:
        point = Point(**values)
        send(channel, "start", point=values)
        try:
            if weights_key != (point.fmt, point.n, point.k):
                weights_key, weights = None, None  # free the previous shape's weights first
                weights = make_weights(point.fmt, point.n, point.k, job["seed"], job["device"])
                weights_key = (point.fmt, point.n, point.k)
            row = measure_point(point, backend, weights, job, timer_config)
        except Exception as exc:  # noqa: BLE001 - any failure of one point becomes its row
            row = failed_row(point, job, exc)
        send(channel, "row", row=row)


def run_ceilings(job: dict[str, Any], channel: TextIO) -> None:
    from fp4lab import roofline

    try:
        ceilings = roofline.measure_ceilings(job["device"])
    except Exception as exc:  # noqa: BLE001 - reported; the sweep falls back to spec ceilings
        send(channel, "error", error=first_line(exc))
        return
    send(channel, "ceilings", ceilings=dataclasses.asdict(ceilings))


def main() -> int:
    channel = protocol_channel()
    job = json.loads(sys.stdin.read())
    try:
        load_extra_backends()
        {"ceilings": run_ceilings, "measure": run_measure}[job["task"]](job, channel)
    except KeyboardInterrupt:
        send(channel, "interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
