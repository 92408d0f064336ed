"""Run folders: where every measured number lands, with the provenance to compare it later.

A run folder `<runs-dir>/<run-id>/` holds `run.json` (provenance and one section per stage that
wrote into the run) and one table per kind of measurement (`fp4lab.schema`: gemm, moe,
telemetry, ...). The rules that keep it whole through crashes, full disks and a second writer:

- rows are appended to `<table>.jsonl` the moment they are measured, flushed and fsync'd; a
  trailing partial line (a crash or a full disk mid-write) is cut off, with a warning, before the
  next append, so the next row never glues onto it;
- `<table>.parquet` (the export) and `run.json` are rewritten through a unique temporary file and
  an atomic rename: a reader sees the old file or the new one, never half of one;
- one writer per run folder: `RunDir.lock()` takes an exclusive `fcntl` lock on `.lock`; a second
  writer is refused with one line naming the holder. Processes started by the holder (the
  notebook kernels of `make report`) inherit the right to write through `FP4LAB_RUN_LOCK`;
- readers skip a bad line with a warning naming the file and the line, and a malformed run.json
  is an error naming the file, never a traceback from deep inside.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import math
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Iterator

from fp4lab import dtypes, schema
from fp4lab.errors import ParameterError
from fp4lab.params import shown

log = logging.getLogger("fp4lab")

PACKAGES = ("torch", "triton", "flashinfer-python", "sgl-kernel", "humming-kernels", "gemlite",
            "nvidia-ml-py", "numpy", "pandas", "papermill", "jupyter-book")

REPO_ROOT = Path(__file__).resolve().parents[2]
# the default runs folder of every command and chapter, wherever it is started from
RUNS_ROOT = Path(os.environ.get("FP4LAB_RUNS_DIR") or REPO_ROOT / "runs")
REFERENCE_ROOT = REPO_ROOT / "results" / "reference"
MEASUREMENTS_ROOT = REPO_ROOT / "results" / "measurements"
NO_REFERENCE = "none"  # reference_dir value that shows no reference run
RUN_JSON_LIMIT = 64 << 20      # bytes: provenance and settings, never data
LOCK_ENV = "FP4LAB_RUN_LOCK"   # "<run folder>=<token>" handed to processes the lock holder starts


class RunFolderError(ParameterError):
    """A run folder or one of its files that cannot be used; the message names the file."""


class RunLocked(RunFolderError):
    """Another process is writing this run folder."""


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(label: str | None = None) -> str:
    """`20261130T084500Z-h200`: sortable by time, readable by GPU."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{slug(label)}" if label else stamp


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:48] or "run"


# -- provenance ---------------------------------------------------------------------------------

def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_sha() -> str | None:
    """The fp4lab commit measured, with `-dirty` when the tree had local changes. FP4LAB_GIT_SHA,
    when set, wins: a tree copied to a device machine may sit inside some other checkout's .git."""
    if os.environ.get("FP4LAB_GIT_SHA"):
        return os.environ["FP4LAB_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FP4LAB_GIT_SHA")


def provenance(command: list[str] | str | None = None, device: str = "auto") -> dict[str, Any]:
    """Everything needed to compare a number from this run with one from another night or GPU."""
    from fp4lab import hardware  # lazy: torch import

    info = hardware.detect(device)
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
    except ImportError:
        pass
    command = sys.argv if command is None else command
    return {
        "device": info.as_dict(),
        "cuda": cuda,
        "versions": library_versions(),
        "fp4lab_git_sha": git_sha(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": command if isinstance(command, str) else " ".join(command),
    }


def device_of(run_json: dict[str, Any]) -> dict[str, Any]:
    device = (run_json.get("provenance") or {}).get("device")
    return device if isinstance(device, dict) else {}


def device_label(run_json: dict[str, Any]) -> str:
    """The device a run measured, from its provenance (not the machine reading it)."""
    device = device_of(run_json)
    return str(device.get("name") or device.get("cpu_model") or device.get("kind") or "unknown device")


def later_commits(run_json: dict[str, Any]) -> list[str]:
    """The commits that added rows to a run after its own (provenance.later_commits,
    `RunDir.note_later_commit`), in the order they were recorded (oldest first), each once."""
    entries = (run_json.get("provenance") or {}).get("later_commits") or []
    return list(dict.fromkeys(str(entry["fp4lab_git_sha"]) for entry in entries
                              if isinstance(entry, dict) and entry.get("fp4lab_git_sha")))


def measured_span(run_json: dict[str, Any]) -> str:
    """The days a run's rows were measured: its creation's, through the last later commit's
    (`RunDir.note_later_commit`), e.g. "2026-12-03 to 2026-12-06"; one day alone; "" unknown."""
    entries = (run_json.get("provenance") or {}).get("later_commits") or []
    stamps = [run_json.get("created")] + [entry.get("at") for entry in entries if isinstance(entry, dict)]
    days = sorted({str(stamp)[:10] for stamp in stamps if isinstance(stamp, str) and len(stamp) >= 10})
    if not days:
        return ""
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def is_gpu_run(run_json: dict[str, Any]) -> bool:
    return device_of(run_json).get("kind") == "cuda"


# -- run.json, declared ---------------------------------------------------------------------------

# The fields of run.json that fp4lab reads, with the JSON type each must have where present (None,
# JSON's null, is always allowed): a run folder somebody sent you is checked against this once,
# when it is opened, so a wrong type is one line naming the file and the field, never a traceback
# from deep inside a chapter. Fields not listed are kept as written.
NUMBER = (int, float)
RUN_JSON_FIELDS: dict[str, type | tuple[type, ...]] = {
    "run_id": str, "created": str,
    "provenance": dict, "provenance.device": dict, "provenance.versions": dict,
    "provenance.command": str, "provenance.fp4lab_git_sha": str, "provenance.cuda": str,
    "provenance.later_commits": list,
    "provenance.device.name": str, "provenance.device.kind": str, "provenance.device.spec": str,
    "provenance.device.cpu_model": str, "provenance.device.driver": str,
    "provenance.device.compute_capability": list, "provenance.device.native_fp4": list,
    "provenance.device.power_limit_w": NUMBER, "provenance.device.sm_count": int,
    "provenance.device.memory_gb": NUMBER, "provenance.device.l2_mb": NUMBER,
    "sweep": dict, "sweep.config": dict, "sweep.ceilings": dict, "sweep.status": str,
    "sweep.resumed": list, "sweep.started": str,
    "moe": dict, "moe.config": dict, "moe.model": dict, "moe.status": str, "moe.started": str,
    "sweep_gpus": dict,
    "report": dict, "report.profile": str, "report.chapters": list, "report.reference_dir": str,
    "report.status": str, "report.started": str, "report.fp4lab_git_sha": str, "report.interrupted": dict, "report.stages": dict,
    "telemetry": dict, "telemetry.power_limit_w": NUMBER,
    "comm": dict, "comm.status": str, "comm.failure": str,
}


def run_json_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a run.json's content (the first declared field of the wrong type), or
    None; versions must map package names to version strings."""
    for dotted, expected in RUN_JSON_FIELDS.items():
        value, found = data, True
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                found = False
                break
            value = value[part]
        if not found or value is None:
            continue
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
            return f"field {dotted!r} must be {_JSON_NAMES.get(names, names)}, found {_json_type(value)}"
    versions = (data.get("provenance") or {}).get("versions") or {}
    bad = next((name for name, version in versions.items() if not isinstance(version, (str, type(None)))), None)
    if bad is not None:
        return f"field 'provenance.versions.{bad}' must be a version string, found {_json_type(versions[bad])}"
    return None


_JSON_NAMES = {"str": "a string", "dict": "an object", "list": "a list", "int": "an integer",
               "int or float": "a number"}


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


# the JSON types a declared column's value may have in a stored row (None is always allowed)
ROW_TYPES = {"str": (str,), "int": (int, float), "float": (int, float), "bool": (bool,), "list": (list,)}
# columns with a closed vocabulary, in whichever table declares them: the analysis computes with
# these words (bytes per weight, whose peak), so a row holding another one is not a row
ROW_VALUES = {
    "status": schema.STATUSES,
    "fmt": ("nvfp4", "mxfp4"),                      # fp4lab.formats.BLOCK_SIZE (which imports torch)
    "weight_dtype": dtypes.WEIGHT_DTYPES,
    "act_dtype": tuple(sorted({act for _, act in dtypes.MATH_DTYPE})),
    "math_dtype": tuple(sorted(set(dtypes.MATH_DTYPE.values()))),
    "device": ("cpu", "cuda"),
    "kind": ("gemm", "layer", "dense"),
    "gemm": ("gate_up", "down", "layer"),
}


def row_problem(declared: schema.Table, row: dict[str, Any]) -> str | None:
    """The first declared column of `row` holding a value of the wrong type, as a phrase; None
    when the row is whole. An integer column takes 16.0 (older writers) but not 16.5."""
    for column in declared.columns:
        value = row.get(column.name)
        if value is None:
            continue
        wrong = (isinstance(value, bool) and column.dtype != "bool"
                 or not isinstance(value, ROW_TYPES[column.dtype])
                 or column.dtype == "int" and isinstance(value, float) and not value.is_integer())
        if wrong:
            return f"column {column.name!r} ({column.dtype}) holds {_json_type(value)}"
        if column.name in ROW_VALUES and value not in ROW_VALUES[column.name]:
            return f"column {column.name!r} holds {shown(value)}, not one of {', '.join(ROW_VALUES[column.name])}"
    return None


# -- files written whole --------------------------------------------------------------------------

def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps(value: Any, **kwargs) -> str:
    """JSON with NaN written as null (JSON has no NaN; readers elsewhere choke on it)."""
    return json.dumps(_finite(value), default=_json_default, allow_nan=False, **kwargs)


def loads(text: str | bytes) -> Any:
    """JSON as fp4lab writes it: NaN, Infinity and -Infinity are refused (ValueError), never
    read back as floats that no number in a run may be; so is nesting too deep to decode."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def atomic_write(path: Path, write) -> None:
    """`write(file)` into a unique temporary file beside `path`, fsync, then rename over `path`
    (keeping the mode of the file it replaces; a new one is readable by all, as open() makes it,
    not mkstemp's owner-only)."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_own(path: Path, mode: str):
    """`open(path, mode)` for writing a file of a run folder: a symbolic link, or a file with other
    hard links, is refused (RunFolderError), since writing through it would change a file outside
    the folder (a run folder somebody sent you could point `.lock` at a file of yours)."""
    flags = {"a": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
             "a+": os.O_RDWR | os.O_APPEND | os.O_CREAT, "rb+": os.O_RDWR}[mode]
    try:
        handle = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunFolderError(f"{path}: is a symbolic link; fp4lab writes only the run folder's own "
                                 "files") from None
        raise
    if os.fstat(handle).st_nlink > 1:
        os.close(handle)
        raise RunFolderError(f"{path}: has other hard links; fp4lab writes only the run folder's own files")
    return os.fdopen(handle, mode)


# -- the run folder -------------------------------------------------------------------------------

@dataclass
class RunDir:
    path: Path
    skipped: list[str] = field(default_factory=list, repr=False)   # bad lines readers skipped

    def __post_init__(self):
        self.path = Path(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, runs_dir: str | os.PathLike, run_id: str | None = None,
               label: str | None = None) -> "RunDir":
        """A new (or, with an existing run_id, the same) run folder; checks it is writable."""
        from fp4lab.params import check_name

        run_id = check_name("run_id", run_id or new_run_id(label))
        path = Path(runs_dir) / run_id
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunFolderError(f"runs folder {runs_dir}: cannot create {path}: {exc.strerror}") from None
        if not os.access(path, os.W_OK):
            raise RunFolderError(f"run folder {path} is not writable")
        run = cls(path)
        if not (path / "run.json").exists():
            run._write_json({"run_id": run_id, "created": utc_now()})
        else:
            run.run_json()   # an existing folder must hold a readable run.json
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> "RunDir":
        """An existing run folder, its run.json checked (a malformed one is named)."""
        path = Path(path)
        if not (path / "run.json").is_file():
            raise RunFolderError(f"{path} is not a run folder (no run.json)")
        run = cls(path)
        run.run_json()
        return run

    # -- run.json -------------------------------------------------------------------------
    def run_json(self) -> dict[str, Any]:
        file = self.path / "run.json"
        if not file.exists():
            return {}
        _regular(file)
        if file.stat().st_size > RUN_JSON_LIMIT:
            raise RunFolderError(f"{file}: {file.stat().st_size} bytes, more than a run.json holds "
                                 f"({RUN_JSON_LIMIT})")
        try:
            data = loads(file.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RunFolderError(f"{file}: not readable JSON ({_first_line(exc)})") from None
        if not isinstance(data, dict):
            raise RunFolderError(f"{file}: expected a JSON object, found {type(data).__name__}")
        problem = run_json_problem(data)
        if problem:
            raise RunFolderError(f"{file}: {problem}")
        return data

    def update_run_json(self, section: str | None, values: dict[str, Any]) -> dict[str, Any]:
        """Merge `values` into run.json (under `section`, or at the top level when None)."""
        with self._file_lock(".run.json.lock"):
            data = self.run_json()
            if section is None:
                data.update(values)
            else:
                data.setdefault(section, {}).update(values)
            self._write_json(data)
        return data

    def _write_json(self, data: dict[str, Any]) -> None:
        text = dumps(data, indent=2) + "\n"
        atomic_write(self.path / "run.json", lambda file: file.write(text.encode()))

    # -- tables ---------------------------------------------------------------------------
    def append_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        """Append rows to `<table>.jsonl` (fsync'd), then rewrite `<table>.parquet`."""
        rows = list(rows)
        if not rows:
            return
        log_file = self.path / f"{table}.jsonl"
        lines = "".join(dumps(row) + "\n" for row in rows)
        with self.table_lock(table):             # the ranks of a per-GPU sweep append in turn
            self._repair_partial_line(log_file)
            with open_own(log_file, "a") as file:
                file.write(lines)
                file.flush()
                os.fsync(file.fileno())
            self._export_parquet(table)

    def _repair_partial_line(self, log_file: Path) -> None:
        """End the log on a whole line before appending. A trailing line with no newline is a
        write cut short (a crash or a full disk): it is cut off, with a warning, so the next row
        never glues onto it; a point it held is not counted as measured (readers skip it) and is
        measured again. Only a last line that is a whole row (the newline alone was lost) is
        kept, newline added: readers counted that point as measured already."""
        if not log_file.exists() or log_file.stat().st_size == 0:
            return
        with open_own(log_file, "rb+") as file:
            end = file.seek(0, os.SEEK_END)
            file.seek(end - 1)
            if file.read(1) == b"\n":
                return
            keep, tail = _last_line_start(file, end)
            if self._row(log_file.stem, tail) is not None:
                file.seek(0, os.SEEK_END)
                file.write(b"\n")
            else:
                file.truncate(keep)
                log.warning("%s: cut a partial last line (%d bytes, written by an interrupted run); "
                            "its point is measured again", log_file, end - keep)
            file.flush()
            os.fsync(file.fileno())

    @staticmethod
    def _row(table: str, line: bytes) -> dict[str, Any] | None:
        """One log line as a row, or None when it is not one: not JSON, not an object, a
        non-finite number, or a declared column holding a value of the wrong type."""
        try:
            row = loads(line)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(row, dict):
            return None
        declared = schema.table(table)
        return row if declared is None or row_problem(declared, row) is None else None

    def _lines(self, table: str) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
        """(line number, raw line, row or None) for every non-blank line of the table's log."""
        log_file = self.path / f"{table}.jsonl"
        if not log_file.exists():
            return
        _regular(log_file)
        with open(log_file, "rb") as file:
            for number, line in enumerate(file, 1):
                if line.strip():
                    yield number, line, self._row(table, line)

    def read_rows(self, table: str) -> list[dict[str, Any]]:
        """The rows of the table's log; a bad line is skipped with a warning naming the file, the
        line and what is wrong (and listed in `self.skipped`)."""
        rows, skipped = [], []
        for number, line, row in self._lines(table):
            if row is not None:
                rows.append(row)
            else:
                skipped.append(f"{self.path / (table + '.jsonl')} line {number}: "
                               f"{self._why_bad(table, line)}, skipped")
        if skipped:          # one warning per read, however many lines a corrupt log holds
            self.skipped += skipped
            more = f" (and {len(skipped) - 1} more bad lines)" if len(skipped) > 1 else ""
            log.warning("%s%s", skipped[0], more)
        return rows

    @staticmethod
    def _why_bad(table: str, line: bytes) -> str:
        try:
            row = loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            return f"not a JSON row ({_first_line(exc)[:80]})"
        if not isinstance(row, dict):
            return f"not a JSON object ({_json_type(row)})"
        return row_problem(schema.TABLES[table], row) or "not a row"

    def read_table(self, table: str):
        """The table as a typed DataFrame: from the jsonl log when there is one (the truth;
        parquet is its export), else from the parquet."""
        import pandas as pd

        declared = schema.table(table)
        if (self.path / f"{table}.jsonl").exists():
            frame = pd.DataFrame(self.read_rows(table))
        elif (self.path / f"{table}.parquet").exists():
            _regular(self.path / f"{table}.parquet")
            try:
                frame = pd.read_parquet(self.path / f"{table}.parquet")
            except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds for a bad file
                raise RunFolderError(f"{self.path / f'{table}.parquet'}: not readable parquet "
                                     f"({_first_line(exc)})") from None
        else:
            frame = pd.DataFrame()
        return declared.typed(frame) if declared else frame

    def write_table(self, table: str, frame) -> None:
        """Replace `<table>.parquet` whole (tables with no jsonl log, e.g. telemetry)."""
        declared = schema.table(table)
        frame = declared.typed(frame) if declared else frame
        atomic_write(self.path / f"{table}.parquet", lambda file: frame.to_parquet(file, index=False))

    def has_table(self, table: str) -> bool:
        return (self.path / f"{table}.parquet").exists() or (self.path / f"{table}.jsonl").exists()

    def note_later_commit(self, tables: Iterable[str], before: int | None) -> None:
        """After a sweep that found `before` rows in `tables`: when it added rows at a commit
        other than the one provenance names (a run resumed after the code changed), record the
        commit, tables, count and time under provenance.later_commits, so captions say so."""
        tables = list(tables)
        after = self.row_count(tables)
        sha = git_sha()
        if before is None or after is None or after <= before or not sha:
            return
        added = after - before
        with self._file_lock(".run.json.lock"):
            data = self.run_json()
            prov = data.setdefault("provenance", {})
            if prov.get("fp4lab_git_sha") in (None, sha):
                return
            prov.setdefault("later_commits", []).append(
                {"fp4lab_git_sha": sha, "tables": tables, "rows": added, "at": utc_now()})
            self._write_json(data)

    def row_count(self, tables: Iterable[str]) -> int | None:
        """Rows in `tables`; None when a table cannot be read (the sweep reports that itself)."""
        try:
            return sum(len(self.read_rows(table)) for table in tables)
        except RunFolderError:
            return None

    def row_keys(self, table: str, statuses: Iterable[str] | None = None) -> set[tuple]:
        """Keys of the rows already in `table` (with `statuses`, only rows of those statuses)."""
        declared = schema.TABLES[table]
        wanted = set(statuses) if statuses is not None else None
        return {declared.row_key(row) for row in self.read_rows(table)
                if wanted is None or row.get("status") in wanted}

    def drop_rows(self, table: str, keys: set[tuple]) -> int:
        """Remove the rows whose key is in `keys` (a `--retry-failed` resume re-measures them);
        every other line, unreadable ones included, is kept as it was. The log is rewritten whole,
        atomically. Returns how many rows went."""
        declared = schema.TABLES[table]
        with self.table_lock(table):
            self._repair_partial_line(self.path / f"{table}.jsonl")
            kept, dropped = [], 0
            for _, line, row in self._lines(table):
                if row is not None and declared.row_key(row) in keys:
                    dropped += 1
                else:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
            if not dropped:
                return 0
            atomic_write(self.path / f"{table}.jsonl", lambda file: file.write(b"".join(kept)))
            self._export_parquet(table)
        return dropped

    def refresh_export(self, table: str) -> None:
        """Rewrite `<table>.parquet` from the log, when there is one: an export that a full disk or
        a kill stopped is made whole again even by a resume that measures nothing (file times are
        too coarse to tell whether it is stale)."""
        if (self.path / f"{table}.jsonl").exists():
            self._export_parquet(table)

    def _export_parquet(self, table: str) -> None:
        frame = self.read_table(table)
        atomic_write(self.path / f"{table}.parquet", lambda file: frame.to_parquet(file, index=False))

    # -- one writer at a time -------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, command: str | None = None) -> Iterator[str]:
        """Hold the run folder for writing; refuse (RunLocked, naming the holder) when another
        process holds it. Child processes of the holder may write: the token travels in
        FP4LAB_RUN_LOCK (set here for the duration)."""
        inherited = os.environ.get(LOCK_ENV, "")
        folder, _, token = inherited.rpartition("=")
        if folder == str(self.path.resolve()) and token and token == self._holder().get("token"):
            yield token
            return
        handle = open_own(self.path / ".lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            handle.close()
            raise RunLocked(f"run {self.run_id} is being written by pid {holder.get('pid', '?')} "
                            f"({holder.get('command', 'unknown command')}, since "
                            f"{holder.get('since', '?')}): wait for it or use another run id") from None
        token = uuid.uuid4().hex
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "token": token, "since": utc_now(),
                  "command": command or " ".join(os.path.basename(a) for a in sys.argv[:3])}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder))
        handle.flush()
        previous = os.environ.get(LOCK_ENV)
        os.environ[LOCK_ENV] = f"{self.path.resolve()}={token}"
        try:
            yield token
        finally:
            if previous is None:
                os.environ.pop(LOCK_ENV, None)
            else:
                os.environ[LOCK_ENV] = previous
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def _holder(self) -> dict[str, Any]:
        try:
            holder = json.loads((self.path / ".lock").read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def table_lock(self, table: str):
        """One writer of `table` at a time among the processes allowed to write the folder."""
        return self._file_lock(f".{table}.lock")

    @contextlib.contextmanager
    def _file_lock(self, name: str) -> Iterator[None]:
        with open_own(self.path / name, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _regular(path: Path) -> None:
    """A run folder's file must be a regular file: reading a FIFO or /dev/zero never ends."""
    if not path.is_file():
        raise RunFolderError(f"{path}: not a regular file")


def _last_line_start(file, end: int, block: int = 1 << 16) -> tuple[int, bytes]:
    """(offset, bytes) of the last line of a file of `end` bytes, reading back from the end in
    blocks (a log of many rows is never read whole to mend its last line)."""
    tail, position = b"", end
    while position > 0:
        position = max(0, position - block)
        file.seek(position)
        tail = file.read(min(block, end - position)) + tail
        newline = tail.rfind(b"\n")
        if newline >= 0:
            return position + newline + 1, tail[newline + 1:]
    return 0, tail


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def open_or_create(run_dir: str | os.PathLike) -> RunDir:
    """The run folder at `run_dir`: opened when it exists, created (with its parent) when not."""
    path = Path(run_dir)
    if (path / "run.json").exists():
        return RunDir.open(path)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"run_dir {str(path)!r} exists and is not a folder")
    return RunDir.create(path.parent, run_id=path.name)


# -- finding runs ---------------------------------------------------------------------------------

def find_run_dirs(*roots: str | os.PathLike) -> list[Path]:
    """Run folders under the roots, oldest id first; a folder whose run.json is malformed is
    skipped with a warning naming it (one bad folder never breaks an index)."""
    found = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for candidate in sorted(p.parent for p in root.glob("*/run.json")):
            try:
                RunDir.open(candidate)
            except RunFolderError as exc:
                log.warning("skipped run folder: %s", exc)
                continue
            found.append(candidate)
    return found


def reference_run(reference_dir: str | os.PathLike = "", table: str | None = "gemm",
                  root: str | os.PathLike = REFERENCE_ROOT, exclude: str | None = None) -> Path | None:
    """The run to show beside this one, for every chapter alike: `reference_dir` when given
    (checked), None for "none", else the newest committed run under `root` holding `table` other
    than the run `exclude` names (a committed reference resumed on a GPU is not its own reference)."""
    if str(reference_dir) == NO_REFERENCE:
        return None
    if reference_dir:
        run = RunDir.open(reference_dir)
        if table and not run.has_table(table):
            raise RunFolderError(f"reference_dir {str(reference_dir)!r} has no {table} table")
        return run.path
    runs = [p for p in find_run_dirs(root) if (not table or RunDir(p).has_table(table)) and p.name != exclude]
    return runs[-1] if runs else None


def latest_gpu_run(*roots: str | os.PathLike, table: str = "gemm", prefer: str | None = "moe") -> Path | None:
    """The newest run measured on a GPU with `table`, by creation time, under the roots; runs
    that also hold `prefer` come first (a GPU report stopped before its MoE sweep, or a GEMM-only
    sweep, must not displace a complete run from the front page's diagnosis)."""
    candidates = []
    for path in find_run_dirs(*roots):
        run = RunDir(path)
        info = run.run_json()
        if is_gpu_run(info) and run.has_table(table):
            preferred = prefer is None or run.has_table(prefer)
            candidates.append((preferred, str(info.get("created") or ""), path.name, path))
    return max(candidates)[3] if candidates else None


def list_runs(*roots: str | os.PathLike):
    """One row per run folder under the roots: id, where, GPU, when, tables present, fp4lab sha."""
    import pandas as pd

    rows = []
    for path in find_run_dirs(*roots):
        info = RunDir(path).run_json()
        rows.append({
            "run_id": path.name,
            "path": str(path),
            "root": str(path.parent),
            "gpu": device_label(info) if is_gpu_run(info) else None,
            "device": device_label(info),
            "created": info.get("created"),
            "profile": (info.get("report") or {}).get("profile"),
            "tables": ",".join(t for t in ("gemm", "moe", "telemetry", "comm") if RunDir(path).has_table(t)),
            "fp4lab_git_sha": (info.get("provenance") or {}).get("fp4lab_git_sha"),
        })
    columns = ["run_id", "path", "root", "gpu", "device", "created", "profile", "tables", "fp4lab_git_sha"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("run_id").reset_index(drop=True)
