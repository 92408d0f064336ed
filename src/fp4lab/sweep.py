"""The GEMM grid runner: backends x formats x shapes x M, one tidy row per point.

The parent process plans the grid, records `unavailable` points at once, measures the ceilings
once, then runs one worker process per backend (`python -m fp4lab.sweep_worker`). A backend that
kills its process (segfault, illegal address poisoning the CUDA context) costs only the point it
was measuring: the parent records that point as `error` with the worker's last stderr lines and
starts a fresh worker for the rest. Rows land in `gemm.jsonl` the moment they arrive, so Ctrl-C
keeps everything measured and `resume` skips finished points.

Point legend: `fmt` FP4 format, `N` output features, `K` reduction dim, `M` tokens (rows of the
activations); the GEMM is a[M, K] @ w[N, K]^T -> [M, N].
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from fp4lab.results import GEMM_COLUMNS, RunDir, provenance, utc_now

FORMATS = ("nvfp4", "mxfp4")
PROFILES = ("smoke", "full")
DEVICES = ("auto", "cuda", "cpu")
STDERR_TAIL_LINES = 8
WORKER_MODULE = "fp4lab.sweep_worker"


@dataclass(frozen=True)
class Point:
    """One GEMM of the grid: a[m, k] @ w[n, k]^T in format `fmt` on `backend`."""

    backend: str
    fmt: str
    n: int
    k: int
    m: int

    @property
    def key(self) -> tuple:
        return (self.backend, self.fmt, self.n, self.k, self.m)


@dataclass
class SweepConfig:
    """The grid and how each point is measured. Empty `backends` means every registered one."""

    backends: tuple[str, ...] = ()
    fmts: tuple[str, ...] = ("nvfp4",)
    m_values: tuple[int, ...] = (1, 16, 64)
    shapes: tuple[tuple[int, int], ...] = ((256, 512),)   # (N, K)
    device: str = "auto"
    repeats: int = 10
    # TimerConfig overrides other than repeats (see fp4lab.bench.TimerConfig)
    timer: dict[str, Any] = field(default_factory=dict)
    energy_window_s: float = 0.0     # 0 = no energy window per point
    telemetry_hz: float = 20.0       # NVML sampling rate while the sweep runs (under 1% overhead: NOTES.md)
    profile: str = "smoke"
    seed: int = 0

    @classmethod
    def smoke(cls) -> "SweepConfig":
        """Seconds on 2 CPU cores: tiny shapes, M 1..64, unavailable backends recorded instantly."""
        return cls(
            fmts=("nvfp4", "mxfp4"),
            m_values=(1, 2, 4, 8, 16, 32, 64),
            shapes=((256, 512), (512, 256)),
            device="auto",
            repeats=5,
            timer={"warmup_s": 0.05, "max_warmup_s": 0.2, "cold_l2": False, "use_graph": False},
            profile="smoke",
        )

    @classmethod
    def full(cls) -> "SweepConfig":
        """The H200 reference grid (~360 timed points, about 0.7 s each: ~4-5 minutes).

        Per point: gate + 30 graph replays (at most ~0.1 s at M=16384 on 8192x8192) + a 0.5 s
        energy window; the window dominates, which is why repeats stays at 30.
        """
        return cls(
            fmts=("nvfp4", "mxfp4"),
            m_values=tuple(2 ** i for i in range(15)),  # 1 .. 16384
            shapes=((4096, 6144), (6144, 2048), (8192, 8192)),
            device="cuda",
            repeats=30,
            timer={"warmup_s": 1.0, "cold_l2": True, "use_graph": True},
            energy_window_s=0.5,
            profile="full",
        )

    @classmethod
    def preset(cls, profile: str) -> "SweepConfig":
        if profile not in PROFILES:
            raise ValueError(f"profile: {profile!r} is not one of {', '.join(PROFILES)}")
        return getattr(cls, profile)()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SweepConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in values.items() if key in known}
        for name in ("backends", "fmts", "m_values"):
            if name in values:
                values[name] = tuple(values[name])
        if "shapes" in values:
            values["shapes"] = tuple(tuple(shape) for shape in values["shapes"])
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_overrides(self, **overrides: Any) -> "SweepConfig":
        """A copy with every override that is not None (an empty list keeps the preset's value)."""
        kept = {key: value for key, value in overrides.items()
                if value is not None and not (isinstance(value, (list, tuple)) and not value)}
        return SweepConfig.from_dict({**self.as_dict(), **kept})

    def timer_config(self):
        from fp4lab.bench import TimerConfig

        return TimerConfig(**{**self.timer, "repeats": self.repeats})


# -- validation -------------------------------------------------------------------------------

def load_extra_backends() -> None:
    """Import the modules named in FP4LAB_EXTRA_BACKENDS (comma list) and call their `register()`.

    Only the tests use this: it lets fake backends (wrong results, crashes) reach worker processes.
    """
    import importlib

    for name in filter(None, os.environ.get("FP4LAB_EXTRA_BACKENDS", "").split(",")):
        module = importlib.import_module(name.strip())
        if hasattr(module, "register"):
            module.register()


def registered_backends() -> dict[str, Any]:
    from fp4lab import backends

    load_extra_backends()
    return backends.REGISTRY


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"device: {device!r} is not one of {', '.join(DEVICES)}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but torch sees no CUDA GPU (use --device cpu)")
    return device


def validate_config(config: SweepConfig) -> None:
    """Raise ValueError naming the bad argument; touches nothing on disk."""
    from fp4lab.formats import BLOCK_SIZE

    if config.profile not in PROFILES:
        raise ValueError(f"profile: {config.profile!r} is not one of {', '.join(PROFILES)}")
    resolve_device(config.device)
    if not config.fmts:
        raise ValueError("format: give at least one of " + ", ".join(FORMATS))
    for fmt in config.fmts:
        if fmt not in BLOCK_SIZE:
            raise ValueError(f"format: {fmt!r} is not one of {', '.join(BLOCK_SIZE)}")
    if not config.m_values:
        raise ValueError("m: give at least one M value")
    for m in config.m_values:
        if not isinstance(m, int) or isinstance(m, bool) or m <= 0:
            raise ValueError(f"m: M must be a positive integer, got {m!r}")
    if not config.shapes:
        raise ValueError("shapes: give at least one NxK shape")
    for shape in config.shapes:
        if len(shape) != 2 or any(not isinstance(v, int) or v <= 0 for v in shape):
            raise ValueError(f"shapes: {shape!r} is not a pair of positive integers (N, K)")
        n, k = shape
        for fmt in config.fmts:
            if k % BLOCK_SIZE[fmt]:
                raise ValueError(f"shapes: K={k} of {n}x{k} is not a multiple of the {fmt} block "
                                 f"size ({BLOCK_SIZE[fmt]})")
    known = registered_backends()
    for name in config.backends:
        if name not in known:
            raise ValueError(f"backends: unknown backend {name!r} (known: {', '.join(known)})")
    if not isinstance(config.repeats, int) or config.repeats < 1:
        raise ValueError(f"repeats: must be an integer >= 1, got {config.repeats!r}")
    if config.energy_window_s < 0:
        raise ValueError(f"energy_window_s: must be >= 0, got {config.energy_window_s}")
    if config.telemetry_hz <= 0:
        raise ValueError(f"telemetry_hz: must be > 0, got {config.telemetry_hz}")


def check_output_dir(path: str | os.PathLike) -> None:
    """Raise ValueError if a run folder could not be created under `path` (creates nothing)."""
    path = Path(path).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"out: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out: {existing} is not writable")


# -- the plan ---------------------------------------------------------------------------------

def plan_points(config: SweepConfig) -> list[Point]:
    """Every point in measuring order: per backend, per format, per shape, M ascending.

    Weights are quantized once per (fmt, shape) and reused across M, hence M innermost.
    """
    names = config.backends or tuple(registered_backends())
    return [Point(backend, fmt, n, k, m)
            for backend in names for fmt in config.fmts
            for (n, k) in config.shapes for m in sorted(config.m_values)]


def blank_row(run_id: str, point: Point, status: str, error: str | None = None) -> dict[str, Any]:
    row = dict.fromkeys(GEMM_COLUMNS)
    row.update(run_id=run_id, backend=point.backend, fmt=point.fmt, n=point.n, k=point.k,
               m=point.m, status=status, error=error)
    return row


def done_keys(run: RunDir) -> set[tuple]:
    return {(r["backend"], r["fmt"], r["n"], r["k"], r["m"]) for r in run.read_rows("gemm")}


def unavailable_reason(backend, fmt: str, device: str) -> str | None:
    """Why this backend cannot measure this format here, or None when it can."""
    available, reason = backend.availability(device)
    if not available:
        return reason
    if fmt not in backend.formats:
        return f"{backend.name} does not take {fmt} weights (takes {', '.join(backend.formats)})"
    return None


# -- logging ----------------------------------------------------------------------------------

LOG_HEADER = (f"{'backend':<19} {'fmt':<5} {'M':>6} {'N':>6} {'K':>6} {'status':<12} "
              f"{'median_us':>10} {'TFLOPS':>8} {'TB/s':>6} {'bound':<8} {'%peak':>6} {'rel_err':>8}")


def _fmt(value, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def format_point_line(row: dict[str, Any]) -> str:
    """One fixed-width line per measured point (the columns of LOG_HEADER)."""
    pct = row.get("pct_peak_spec")
    if pct is None:
        pct = row.get("pct_peak_measured")
    return (f"{row['backend']:<19.19} {row['fmt']:<5} {row['m']:>6} {row['n']:>6} {row['k']:>6} "
            f"{row['status']:<12} {_fmt(row.get('median_us'), '10.2f'):>10} "
            f"{_fmt(row.get('tflops'), '8.2f'):>8} {_fmt(row.get('tbps'), '6.2f'):>6} "
            f"{(row.get('bound') or '-'):<8.8} {_fmt(pct, '6.2f'):>6} "
            f"{_fmt(row.get('rel_err'), '8.1e'):>8}")


class _Progress:
    """tqdm bar plus the per-point log lines, written through tqdm so they do not tear the bar."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="sweep", unit="pt", file=sys.stderr, dynamic_ncols=True)
            self.bar.write(LOG_HEADER, file=sys.stderr)

    def point(self, row: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.write(format_point_line(row), file=sys.stderr)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- workers ----------------------------------------------------------------------------------

class WorkerInterrupted(KeyboardInterrupt):
    """The worker saw Ctrl-C (or a backend raised KeyboardInterrupt): stop the sweep, keep rows."""


def _stderr_tail(log_path: Path, start: int) -> str:
    with open(log_path, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-STDERR_TAIL_LINES:]) or "(no stderr)"


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def run_worker(job: dict[str, Any], log_path: Path) -> Iterable[dict[str, Any]]:
    """Start `python -m fp4lab.sweep_worker` on `job`; yield its messages, then an `exit` message.

    The worker's stderr goes to `log_path` (kept in the run folder); the exit message carries the
    return code and that stderr's last lines.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        proc.stdin.write(json.dumps(job))
        proc.stdin.close()
        for line in proc.stdout:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short when the worker died
        returncode = proc.wait()
        yield {"event": "exit", "returncode": returncode, "stderr": _stderr_tail(log_path, start)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def measure_ceilings_in_worker(device: str, log_path: Path) -> dict[str, Any]:
    """roofline.measure_ceilings in a worker: {"measured": {...}} or {"error": message}."""
    for message in run_worker({"task": "ceilings", "device": device}, log_path):
        if message["event"] == "ceilings":
            return {"measured": message["ceilings"]}
        if message["event"] == "error":
            return {"error": message["error"]}
        if message["event"] == "interrupted":
            raise WorkerInterrupted()
        if message["event"] == "exit":
            return {"error": f"ceilings worker {_exit_text(message['returncode'])}: {message['stderr']}"}
    return {"error": "ceilings worker sent nothing"}


def measure_backend(backend: str, points: list[Point], base_job: dict[str, Any],
                    log_path: Path, record) -> None:
    """Measure `points` of one backend in worker processes, restarting after a crash.

    `record(row)` is called once per point. A worker that dies mid-point turns that point into an
    `error` row; one that dies before it is ready turns every remaining point into one.
    """
    remaining = {point.key: point for point in points}
    while remaining:
        job = {**base_job, "task": "measure", "backend": backend,
               "points": [dataclasses.asdict(p) for p in remaining.values()]}
        in_progress, ready = None, False
        for message in run_worker(job, log_path):
            event = message["event"]
            if event == "ready":
                ready = True
            elif event == "start":
                in_progress = Point(**message["point"])
            elif event == "row":
                row = message["row"]
                remaining.pop((row["backend"], row["fmt"], row["n"], row["k"], row["m"]), None)
                record(row)
                in_progress = None
            elif event == "interrupted":
                raise WorkerInterrupted()
            elif event == "exit" and remaining:
                reason = f"worker {_exit_text(message['returncode'])}: {message['stderr']}"
                lost = [in_progress] if ready and in_progress else list(remaining.values())
                for point in lost:
                    remaining.pop(point.key, None)
                    record(blank_row(base_job["run_id"], point, "error", reason))


# -- the sweep --------------------------------------------------------------------------------

def open_run(run_dir: str | os.PathLike | RunDir) -> RunDir:
    if isinstance(run_dir, RunDir):
        return run_dir
    path = Path(run_dir)
    if (path / "run.json").is_file():
        return RunDir.open(path)
    check_output_dir(path.parent)
    return RunDir.create(path.parent, run_id=path.name)


def spec_ceilings_for(device: str) -> dict[str, Any] | None:
    from fp4lab import hardware, roofline

    spec = hardware.detect(device).spec
    return dataclasses.asdict(roofline.spec_ceilings(spec)) if spec is not None else None


def _start_sampler(rate_hz: float):
    from fp4lab.telemetry import Sampler

    sampler = Sampler(rate_hz)
    if not sampler.available:
        return None
    sampler.start()
    return sampler


def _save_telemetry(run: RunDir, sampler) -> None:
    import pandas as pd

    frame = sampler.stop()
    run.update_run_json("telemetry", sampler.metadata())
    if frame is None or not len(frame):
        return
    file = run.path / "telemetry.parquet"
    if file.exists():  # a resumed run: keep the earlier samples
        frame = pd.concat([pd.read_parquet(file), frame], ignore_index=True)
    frame.to_parquet(file, index=False)


def run_sweep(config: SweepConfig, run_dir: str | os.PathLike | RunDir, resume: bool = True,
              progress: bool = True, command: list[str] | str | None = None):
    """Measure the grid into `run_dir`; return the run's gemm table (one row per point).

    With `resume`, points already in gemm.jsonl are skipped; without it a run folder that already
    holds rows is refused (nothing is overwritten).
    """
    validate_config(config)
    device = resolve_device(config.device)
    run = open_run(run_dir)
    finished = done_keys(run)
    if finished and not resume:
        raise ValueError(f"run_dir: {run.path} already holds {len(finished)} measured points; "
                         "resume it or use a new run folder")
    todo = [p for p in plan_points(config) if p.key not in finished]
    stored = run.run_json().get("sweep", {})
    run.update_run_json(None, {"provenance": run.run_json().get("provenance") or provenance(command)})
    run.update_run_json("sweep", {
        "config": config.as_dict(), "device": device,
        "command": provenance_command(command),
        "started": stored.get("started") or utc_now(),
        "resumed": stored.get("resumed", []) + ([utc_now()] if stored else []),
        "status": "running",
    })

    bar = _Progress(len(todo), progress)

    def record(*rows: dict[str, Any]) -> None:
        run.append_rows("gemm", rows)
        for row in rows:
            bar.point(row)

    known = registered_backends()
    runnable: dict[str, list[Point]] = collections.defaultdict(list)
    unavailable = []
    for point in todo:
        reason = unavailable_reason(known[point.backend], point.fmt, device)
        if reason:
            unavailable.append(blank_row(run.run_id, point, "unavailable", reason))
        else:
            runnable[point.backend].append(point)
    record(*unavailable)  # one write: these need no worker

    status = "interrupted"
    sampler = None
    try:
        ceilings = stored.get("ceilings")
        if runnable and not (ceilings and ceilings.get("measured")):
            ceilings = measure_ceilings_in_worker(device, run.path / "logs" / "ceilings.log")
            ceilings["spec"] = spec_ceilings_for(device)
            run.update_run_json("sweep", {"ceilings": ceilings})
        sampler = _start_sampler(config.telemetry_hz)
        base_job = {"run_id": run.run_id, "device": device, "seed": config.seed,
                    "timer": {**config.timer, "repeats": config.repeats},
                    "energy_window_s": config.energy_window_s, "ceilings": ceilings or {}}
        for backend, points in runnable.items():
            measure_backend(backend, points, base_job, run.path / "logs" / f"{backend}.log", record)
        for dtype, text in raise_measured_ceilings(run).items():
            if progress:
                print(f"measured {dtype} peak {text}", file=sys.stderr)
        status = "complete"
    finally:
        bar.close()
        if sampler is not None:
            _save_telemetry(run, sampler)
        run.update_run_json("sweep", {"ended": utc_now(), "status": status})
    return run.read_table("gemm")


# -- end of sweep: the measured ceilings include the sweep's own best points -----------------------

def _math_dtype_of(backend) -> str:
    from fp4lab import roofline
    from fp4lab.sweep_worker import roofline_dtypes

    return roofline.math_dtype(*roofline_dtypes(backend))


def raise_measured_ceilings(run_dir: str | os.PathLike | RunDir) -> dict[str, str]:
    """Raise each measured peak to the best correct point of its math dtype in this run.

    The measured compute ceiling is "the best large GEMM per dtype, measured in the same run": the
    8192^3 probe is one GEMM, and a sweep point of the same math dtype can beat it (on the H200,
    torch-fp8 at M=16384 on 8192x8192 outran the fp8 probe), which would put points over 100% of
    "peak". A raised peak names the point that raised it in the measured ceilings' `details`;
    then every row's `pct_peak_measured` and `bound` are recomputed and gemm.jsonl/.parquet are
    rewritten. A dtype the probes did not measure (None) keeps None: the spec sheet speaks for it.
    Rows of backends no longer registered keep their stored columns. Applying it twice changes
    nothing. Returns {dtype: what raised it} (empty when no peak moved).
    """
    from fp4lab.sweep_worker import roofline_columns

    run = open_run(run_dir)
    stored = run.run_json().get("sweep", {}).get("ceilings") or {}
    measured = stored.get("measured")
    if not measured or not measured.get("peak_tflops"):
        return {}
    known = registered_backends()
    rows = run.read_rows("gemm")
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("status") != "ok" or not row.get("tflops") or row["backend"] not in known:
            continue
        dtype = _math_dtype_of(known[row["backend"]])
        if dtype not in best or row["tflops"] > best[dtype]["tflops"]:
            best[dtype] = row
    peaks = dict(measured["peak_tflops"])
    raised = {}
    for dtype, row in best.items():
        probe = peaks.get(dtype)
        if probe is not None and row["tflops"] > probe:
            peaks[dtype] = row["tflops"]
            raised[dtype] = (f"raised from the probe's {probe:.1f} to {row['tflops']:.1f} TFLOP/s by "
                             f"{row['backend']} {row['fmt']} M={row['m']} {row['n']}x{row['k']}, "
                             f"the best correct {dtype} point of this run")
    if not raised:
        return {}
    ceilings = {**stored, "measured": {**measured, "peak_tflops": peaks, "details": {
        **measured.get("details", {}), **{f"{dtype}_raised": text for dtype, text in raised.items()}}}}
    for row in rows:
        if row.get("status") == "ok" and row.get("median_us") and row["backend"] in known:
            point = Point(row["backend"], row["fmt"], row["n"], row["k"], row["m"])
            row.update(roofline_columns(point, known[row["backend"]], row["median_us"], ceilings))
    # rows first: if run.json is not updated, applying the step again redoes the same change
    run.replace_rows("gemm", rows)
    run.update_run_json("sweep", {"ceilings": ceilings})
    return raised


def provenance_command(command: list[str] | str | None) -> str:
    command = sys.argv if command is None else command
    return command if isinstance(command, str) else " ".join(command)


def is_complete(run: RunDir, config: SweepConfig) -> bool:
    """True when every point of `config` already has a row in the run."""
    finished = done_keys(run)
    return all(p.key in finished for p in plan_points(config))


# -- CLI --------------------------------------------------------------------------------------

def parse_int_list(text: str, argument: str, minimum: int | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{argument}: {text!r} is not a comma list of integers") from None
    if minimum is not None and (not values or min(values) < minimum):
        raise ValueError(f"{argument}: values must be >= {minimum}, got {text!r}")
    return values


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            n, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shapes: {part!r} is not NxK (e.g. 4096x6144)") from None
        shapes.append((n, k))
    return tuple(shapes)


def preset_shapes(name: str) -> tuple[tuple[int, int], ...]:
    from fp4lab.moe import presets

    try:
        model = presets.get(name)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"preset: {exc}") from None
    return tuple(tuple(shape) for shape in model.gemm_shapes().values())


def config_from_params(profile: str | None = None, device: str | None = None,
                       backends=None, fmts=None, m_values=None, shapes=None,
                       preset: str | None = None, repeats: int | None = None,
                       energy_window_s: float | None = None) -> SweepConfig:
    """The profile's preset with every given value laid over it, validated.

    None or an empty list keeps the preset's value. `profile` None picks full on a GPU and smoke
    on CPU; `preset` adds the model's expert GEMM shapes to `shapes`.
    """
    profile = profile or ("full" if resolve_device(device or "auto") == "cuda" else "smoke")
    shapes = tuple(tuple(shape) for shape in shapes or ())
    if preset:
        shapes = tuple(dict.fromkeys(shapes + preset_shapes(preset)))
    config = SweepConfig.preset(profile).with_overrides(
        backends=tuple(backends) if backends else None, fmts=tuple(fmts) if fmts else None,
        m_values=tuple(m_values) if m_values else None, shapes=shapes, device=device,
        repeats=repeats, energy_window_s=energy_window_s)
    validate_config(config)
    return config


def _comma_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip()) if text else ()


def config_from_args(args) -> SweepConfig:
    config = config_from_params(
        profile=args.profile, device=args.device, backends=_comma_list(args.backends),
        fmts=_comma_list(args.format), m_values=parse_int_list(args.m, "m") if args.m else None,
        shapes=parse_shapes(args.shapes) if args.shapes else None, preset=args.preset,
        repeats=args.repeats, energy_window_s=args.energy_window)
    if getattr(args, "eager", False):
        config = dataclasses.replace(config, timer={**config.timer, "use_graph": False})
    return config


def sweep_into(config: SweepConfig, run_dir: str | os.PathLike = "", runs_dir: str = "runs",
               progress: bool = True, command: str | None = None) -> RunDir:
    """The run folder holding every point of `config`: measured now, resumed, or already there.

    An empty `run_dir` makes a new run folder under `runs_dir`.
    """
    if run_dir:
        run = open_run(run_dir)
    else:
        check_output_dir(runs_dir)
        run = RunDir.create(runs_dir, label=resolve_device(config.device))
    if not is_complete(run, config):
        run_sweep(config, run, resume=True, progress=progress, command=command)
    return run


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("sweep", help="measure the FP4 GEMM grid into a run folder")
    parser.add_argument("--backends", help="comma list (default: every registered backend)")
    parser.add_argument("--format", help="nvfp4, mxfp4 or both as a comma list")
    parser.add_argument("--m", help="comma list of M values (tokens), e.g. 1,2,4,8")
    parser.add_argument("--shapes", help="comma list of NxK weight shapes, e.g. 4096x6144")
    parser.add_argument("--preset", help="a model preset whose expert shapes are added (e.g. glm5)")
    parser.add_argument("--device", choices=DEVICES)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--energy-window", type=float, help="seconds of NVML energy window per point")
    parser.add_argument("--profile", choices=PROFILES,
                        help="preset grid (default: full on a GPU, smoke on CPU)")
    parser.add_argument("--out", default="runs", help="runs folder (default: runs)")
    parser.add_argument("--run-id", help="name of the run folder (default: time stamp + device)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue this run folder's stored grid, skipping finished points")
    parser.add_argument("--eager", action="store_true",
                        help="time eager launches instead of CUDA-graph replays (shows launch overhead)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-point lines")
    parser.set_defaults(func=_cli_sweep)


def _cli_sweep(args) -> int:
    from fp4lab.cli import UsageError

    try:
        if args.resume:
            run = RunDir.open(args.resume)
            stored = run.run_json().get("sweep", {}).get("config")
            if not stored:
                raise ValueError(f"resume: {args.resume} has no stored sweep configuration")
            config = SweepConfig.from_dict(stored)
        else:
            config = config_from_args(args)
        validate_config(config)
        if not args.resume:
            check_output_dir(args.out)
            run = RunDir.create(args.out, run_id=args.run_id, label=resolve_device(config.device))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    started = time.monotonic()
    try:
        frame = run_sweep(config, run, resume=True, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"interrupted: measured points are kept; continue with --resume {run.path}",
              file=sys.stderr)
        print(run.path)
        return 130
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    print(f"{len(frame)} points in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())), file=sys.stderr)
    print(run.path)
    return 0
