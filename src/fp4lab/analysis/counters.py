"""Hardware counters of fp4lab's own kernels: a committed Nsight Compute profile
(`benchmarks/ncu_profile.py`: ncu's raw CSV page, one row per kernel launch, and launches.json
naming each launch and the weights it reads, with run.json's provenance) read into one row per
launch, and what the rows say about where the kernels' cycles go.

A profile is its own measurement (one launch each, unlocked clocks, cold caches per replay
pass), not the run's: its times sit above the timer's graph-replay medians, and every sentence
names the profile it comes from.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4lab import text
from fp4lab.results import MEASUREMENTS_ROOT

H200_ISSUE_SLOTS_PER_NS = 132 * 4 * 1.98   # SMs x schedulers x max SM clock (GHz): warp instructions
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
COLUMNS = {   # ncu metric -> column
    "gpu__time_duration.sum": "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps_active_pct",
    "launch__registers_per_thread": "registers",
    "smsp__inst_executed.sum": "warp_instructions",
    "dram__bytes_read.sum": "dram_bytes",
    "lts__t_bytes.sum": "l2_bytes",
}
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


class CountersError(ValueError):
    """A profile folder that cannot be read as one (says which file and why)."""


@dataclass
class Counters:
    """One profile: a row per kernel launch and where it came from."""

    table: pd.DataFrame      # launch, kernel, weights, us, dram_pct, ..., instr_per_weight, stalls
    run_id: str
    device: str
    commit: str
    command: str

    def caption(self, what: str) -> str:
        return (f"{what}; Nsight Compute profile {self.run_id} ({self.device}, fp4lab {self.commit}): "
                "one launch each, unlocked clocks, cold caches, so its times sit above the timer's medians")


def find_profile(choice: str = "", root: Path = MEASUREMENTS_ROOT) -> Path | None:
    """The profile folder a chapter shows: `choice` a folder path; "" the newest folder under
    `root` (run ids start with their UTC time) holding raw.csv and launches.json; "none" none.
    CountersError for a named folder that is not a profile."""
    if choice == "none":
        return None
    if choice:
        folder = Path(choice)
        if not (folder / "raw.csv").is_file():
            raise CountersError(f"counters_dir {choice!r}: no raw.csv there (an ncu_profile.py run "
                                "folder holds raw.csv, launches.json and run.json)")
        return folder
    found = sorted(f for f in Path(root).glob("*") if (f / "raw.csv").is_file()
                   and (f / "launches.json").is_file()) if Path(root).is_dir() else []
    return found[-1] if found else None


def read_counters(folder) -> Counters:
    """The profile in `folder` (raw.csv, launches.json, run.json); CountersError when a file is
    missing or the launches and ncu's rows disagree."""
    folder = Path(folder)
    for name in ("raw.csv", "launches.json", "run.json"):
        if not (folder / name).is_file():
            raise CountersError(f"counters folder {folder}: no {name}")
    rows = _ncu_rows(folder / "raw.csv")
    launches = json.loads((folder / "launches.json").read_text())
    if len(rows) != len(launches):
        raise CountersError(f"counters folder {folder}: {len(rows)} kernel rows in raw.csv but "
                            f"{len(launches)} launches in launches.json")
    table = pd.DataFrame([{**launch, **row} for launch, row in zip(launches, rows)])
    table["instr_per_weight"] = [32 * r.warp_instructions / r.weights if r.weights else float("nan")
                                 for r in table.itertuples()]
    table["l2_over_dram"] = table["l2_bytes"] / table["dram_bytes"]
    info = json.loads((folder / "run.json").read_text())
    provenance = info.get("provenance") or {}
    return Counters(table=table, run_id=str(info.get("run_id", folder.name)),
                    device=str((provenance.get("device") or {}).get("name", "unknown GPU")),
                    commit=str(provenance.get("fp4lab_git_sha", "unknown")),
                    command=str(provenance.get("command", "")))


def _ncu_rows(path: Path) -> list[dict]:
    """ncu's --page raw CSV (its own "==" log lines skipped; row 1 the names, row 2 the units) ->
    one dict per kernel row: COLUMNS in fixed units (us, bytes, %) and "stalls", the three
    largest stall reasons as "reason value" text."""
    lines = [r for r in csv.reader(path.read_text().splitlines()) if r and not r[0].startswith("==")]
    if len(lines) < 2:
        raise CountersError(f"{path}: no ncu header and units rows")
    names, units, data = lines[0], lines[1], lines[2:]
    missing = [metric for metric in COLUMNS if metric not in names]
    if missing:
        raise CountersError(f"{path}: ncu did not record {', '.join(missing)}")
    stalls = [i for i, name in enumerate(names) if name.startswith(STALL_PREFIX)]
    out = []
    for values in data:
        row = {}
        for metric, column in COLUMNS.items():
            i = names.index(metric)
            row[column] = _number(values[i]) * _scale(units[i])
        reasons = sorted(((_number(values[i]), names[i][len(STALL_PREFIX):-len(STALL_SUFFIX)])
                          for i in stalls if values[i]), reverse=True)
        waits = [(value, reason) for value, reason in reasons if reason != "selected"][:3]
        row["stalls"] = ", ".join(f"{reason.replace('_', ' ')} {value:.2f}" for value, reason in waits)
        out.append(row)
    return out


def _number(cell: str) -> float:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        raise CountersError(f"ncu value {cell!r} is not a number") from None


def _scale(unit: str) -> float:
    return TIME_UNITS.get(unit, BYTE_UNITS.get(unit, 1.0))


def counters_findings(counters: Counters) -> list[str]:
    """What the profile says: the dense decode kernel's instructions, issue rate and warps
    against the stream's DRAM share, and the fused MoE's launches (each sentence from the
    rows named)."""
    table = counters.table
    lines = []
    full = _first(table, "M=1 full")
    stream = _first(table, "stream")
    if full is not None:
        line = (f"{text.md(full['launch'])}: {full['instr_per_weight']:.1f} instructions per weight "
                f"({full['warp_instructions'] / 1e6:.1f} M warp instructions), issued on "
                f"{text.pct(full['issue_pct'])} of cycles with {text.pct(full['warps_active_pct'])} of warp "
                f"slots occupied ({int(full['registers'])} registers a thread); stall cycles per "
                f"instruction: {full['stalls']}. It reads DRAM at {text.pct(full['dram_pct'])} of peak")
        if stream is not None:
            line += f", where the stream of the same bytes reaches {text.pct(stream['dram_pct'])}"
        if "H200" in counters.device:
            # at the issue rate measured, the instructions alone take this long
            issue_us = full["warp_instructions"] / H200_ISSUE_SLOTS_PER_NS / 1e3
            at_rate = issue_us / (full["issue_pct"] / 100)
            line += (f". Issuing its instructions takes {text.us(issue_us)} at every slot of the 528 "
                     f"schedulers, {text.us(at_rate)} at the rate measured, of its {text.us(full['us'])}")
            if at_rate > 0.6 * full["us"]:
                line += ": its instructions, not its bytes, set its time"
        lines.append(line + ".")
    moe = table[table["kernel"] == "fused MoE"]
    if len(moe):
        parts = "; ".join(f"{text.md(r.launch)} {text.us(r.us)}, {r.instr_per_weight:.1f} instructions per "
                          f"weight issued on {text.pct(r.issue_pct)} of cycles, DRAM {text.pct(r.dram_pct)}, "
                          f"L2 traffic {r.l2_over_dram:.1f}x its DRAM bytes" for r in moe.itertuples())
        lines.append(f"The fused MoE: {parts}.")
    return lines


def _first(table: pd.DataFrame, words: str):
    match = table[table["launch"].str.contains(words, regex=False)]
    return None if not len(match) else match.iloc[0]
