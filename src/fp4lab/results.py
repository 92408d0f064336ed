"""Run folders: where every measured number lands, with the provenance to compare it later.

A run folder is `<runs-dir>/<run-id>/` holding `run.json` (provenance, merged section by section
by each stage that writes into the run) and one table per kind of measurement (`gemm`, `moe`,
`telemetry`). Rows are appended to `<table>.jsonl` the moment they are measured (so an
interrupted sweep keeps them) and the `<table>.parquet` beside it is rewritten from that log.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

GEMM_COLUMNS = [
    "run_id", "backend", "fmt", "m", "n", "k", "status", "error", "rel_err",
    "median_us", "p20_us", "p80_us", "tflops", "tbps", "bound",
    "pct_peak_spec", "pct_peak_measured", "graph",
    # telemetry window (issue 4); missing where no NVML
    "avg_power_w", "energy_per_call_j", "tflops_per_w", "sm_clock_mhz", "throttle_reasons",
    "window_start_s", "window_end_s",
]

PACKAGES = ("torch", "triton", "flashinfer-python", "sgl-kernel", "nvidia-ml-py", "numpy",
            "pandas", "papermill", "jupyter-book")

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE_ROOT = REPO_ROOT / "results" / "reference"
NO_REFERENCE = "none"  # reference_dir value that shows no reference run
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(label: str | None = None) -> str:
    """`20261130T084500Z-h200`: sortable by time, readable by GPU."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{slug(label)}" if label else stamp


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_sha() -> str | None:
    """The fp4lab commit measured, with `-dirty` when the tree had local changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FP4LAB_GIT_SHA")


def provenance(command: list[str] | str | None = None) -> dict[str, Any]:
    """Everything needed to compare a number from this run with one from another night or GPU."""
    from fp4lab import hardware  # lazy: torch import

    device = hardware.detect()
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
    except ImportError:
        pass
    if command is None:
        command = sys.argv
    return {
        "device": device.as_dict(),
        "cuda": cuda,
        "versions": library_versions(),
        "fp4lab_git_sha": git_sha(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": command if isinstance(command, str) else " ".join(command),
    }


def device_label(run_json: dict[str, Any]) -> str:
    """The device a run measured, from its provenance (not the machine reading it)."""
    device = run_json.get("provenance", {}).get("device", {})
    return device.get("name") or device.get("cpu_model") or device.get("kind") or "unknown device"


def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


@dataclass
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, runs_dir: str | os.PathLike, run_id: str | None = None,
               label: str | None = None) -> "RunDir":
        """A new (or, with an existing run_id, the same) run folder; checks it is writable."""
        run_id = run_id or new_run_id(label)
        if not RUN_ID_PATTERN.match(run_id):
            raise ValueError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-'")
        path = Path(runs_dir) / run_id
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"output folder {runs_dir}: cannot create {path}: {exc.strerror}") from exc
        if not os.access(path, os.W_OK):
            raise ValueError(f"output folder {path} is not writable")
        run = cls(path)
        if not (path / "run.json").exists():
            run._write_json({"run_id": run_id, "created": utc_now()})
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> "RunDir":
        path = Path(path)
        if not (path / "run.json").is_file():
            raise ValueError(f"{path} is not a run folder (no run.json)")
        return cls(path)

    # -- run.json -------------------------------------------------------------------------
    def run_json(self) -> dict[str, Any]:
        file = self.path / "run.json"
        return json.loads(file.read_text()) if file.exists() else {}

    def update_run_json(self, section: str | None, values: dict[str, Any]) -> dict[str, Any]:
        """Merge `values` into run.json (under `section`, or at the top level when None)."""
        data = self.run_json()
        if section is None:
            data.update(values)
        else:
            data.setdefault(section, {}).update(values)
        self._write_json(data)
        return data

    def _write_json(self, data: dict[str, Any]) -> None:
        tmp = self.path / "run.json.tmp"
        tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
        tmp.replace(self.path / "run.json")

    # -- tables ---------------------------------------------------------------------------
    def append_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        with open(self.path / f"{table}.jsonl", "a") as log:
            for row in rows:
                log.write(json.dumps(row, default=_json_default) + "\n")
            log.flush()
            os.fsync(log.fileno())
        self._rewrite_parquet(table)

    def replace_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        """Rewrite `<table>.jsonl` with `rows`, then its parquet, each by an atomic rename.

        For steps that revise stored rows (the sweep's end-of-run ceilings): a crash leaves either
        the old or the new log, never a half-written one.
        """
        tmp = self.path / f"{table}.jsonl.tmp"
        with open(tmp, "w") as log:
            for row in rows:
                log.write(json.dumps(row, default=_json_default) + "\n")
            log.flush()
            os.fsync(log.fileno())
        tmp.replace(self.path / f"{table}.jsonl")
        self._rewrite_parquet(table)

    def read_rows(self, table: str) -> list[dict[str, Any]]:
        log = self.path / f"{table}.jsonl"
        if not log.exists():
            return []
        rows = []
        for line in log.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption: the point is simply re-measured
        return rows

    def read_table(self, table: str):
        import pandas as pd

        parquet = self.path / f"{table}.parquet"
        if parquet.exists():
            return pd.read_parquet(parquet)
        return pd.DataFrame(self.read_rows(table))

    def has_table(self, table: str) -> bool:
        return (self.path / f"{table}.parquet").exists() or (self.path / f"{table}.jsonl").exists()

    def _rewrite_parquet(self, table: str) -> None:
        import pandas as pd

        frame = pd.DataFrame(self.read_rows(table))
        if table == "gemm":
            for column in GEMM_COLUMNS:
                if column not in frame:
                    frame[column] = None
        tmp = self.path / f"{table}.parquet.tmp"
        frame.to_parquet(tmp, index=False)
        tmp.replace(self.path / f"{table}.parquet")


def find_run_dirs(*roots: str | os.PathLike) -> list[Path]:
    found = []
    for root in roots:
        root = Path(root)
        if root.is_dir():
            found += sorted(p.parent for p in root.glob("*/run.json"))
    return found


def reference_run(reference_dir: str | os.PathLike = "", table: str | None = "gemm",
                  root: str | os.PathLike = REFERENCE_ROOT) -> Path | None:
    """The run to show beside this one, for every chapter alike: `reference_dir` when given
    (checked), None for "none", else the newest committed run under `root` holding `table`
    (run ids sort by time; a run of one measurement only, e.g. a second MoE preset, has no gemm)."""
    if str(reference_dir) == NO_REFERENCE:
        return None
    if reference_dir:
        path = Path(reference_dir)
        if not (path / "run.json").is_file():
            raise ValueError(f"reference_dir {str(reference_dir)!r} is not a run folder (no run.json)")
        if table and not RunDir(path).has_table(table):
            raise ValueError(f"reference_dir {str(reference_dir)!r} has no {table} table")
        return path
    runs = [p for p in find_run_dirs(root) if not table or RunDir(p).has_table(table)]
    return runs[-1] if runs else None


def list_runs(*roots: str | os.PathLike):
    """One row per run folder under the roots: id, where, GPU, when, tables present, fp4lab sha."""
    import pandas as pd

    rows = []
    for path in find_run_dirs(*roots):
        info = RunDir(path).run_json()
        device = info.get("provenance", {}).get("device", {})
        rows.append({
            "run_id": path.name,
            "path": str(path),
            "root": str(path.parent),
            "gpu": device.get("name"),
            "created": info.get("created"),
            "profile": info.get("report", {}).get("profile"),
            "tables": ",".join(t for t in ("gemm", "moe", "telemetry") if RunDir(path).has_table(t)),
            "fp4lab_git_sha": info.get("provenance", {}).get("fp4lab_git_sha"),
        })
    frame = pd.DataFrame(rows, columns=["run_id", "path", "root", "gpu", "created", "profile",
                                        "tables", "fp4lab_git_sha"])
    return frame.sort_values("run_id").reset_index(drop=True)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("runs", help="list run folders (local and reference)")
    parser.add_argument("roots", nargs="*", default=["runs", "results/reference"])
    parser.set_defaults(func=_cli_runs)


def _cli_runs(args) -> int:
    frame = list_runs(*args.roots)
    print(frame.to_string(index=False) if len(frame) else "no runs under " + ", ".join(args.roots))
    return 0
