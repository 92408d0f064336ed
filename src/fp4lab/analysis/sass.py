"""Whether fp4lab's Triton tensor-core builds keep their wgmma in flight: a committed SASS read
(`benchmarks/triton_sass.py --out`: sass.jsonl, a row a build, and run.json with the compiler
and the machine) joined with the builds a run timed, by their labels, so a sentence about a
build's code is only ever said of the build the run measured.

A read is its own measurement (what the compiler emitted, no timing): every sentence names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4lab import text
from fp4lab.results import MEASUREMENTS_ROOT

KERNEL = "triton-w4a16"        # the backend whose builds the read compiles
READ_KIND = "triton-sass"      # run.json's "read" of such a folder
COLUMNS = ("fmt", "n", "k", "m", "build", "hgmma", "waited")


class SassReadError(ValueError):
    """A SASS-read folder that cannot be read as one (says which file and why)."""


@dataclass
class SassRead:
    table: pd.DataFrame      # COLUMNS: a row a build
    run_id: str
    triton: str
    machine: str

    def source(self, run_triton: str | None = None) -> str:
        """Where the claim comes from, and whether the run used the same Triton."""
        same = ("the version this run used" if run_triton == self.triton
                else f"this run used {run_triton}" if run_triton else "this run's version unknown")
        return (f"the sm_90 SASS of the same builds, compiled by Triton {self.triton}, {same}, on "
                f"{self.machine}; read {self.run_id}")


def find_sass_read(root: Path = MEASUREMENTS_ROOT) -> Path | None:
    """The newest folder under `root` (run ids start with their UTC time) holding a SASS read."""
    if not Path(root).is_dir():
        return None
    found = None
    for folder in sorted(Path(root).glob("*")):
        if (folder / "sass.jsonl").is_file() and (folder / "run.json").is_file():
            found = folder
    return found


def read_sass(folder) -> SassRead:
    """The read in `folder`; SassReadError when a file is missing, is not a SASS read or lacks a
    column."""
    folder = Path(folder)
    try:
        info = json.loads((folder / "run.json").read_text())
        rows = [json.loads(line) for line in (folder / "sass.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise SassReadError(f"SASS read {folder}: {exc}") from exc
    if not isinstance(info, dict) or info.get("read") != READ_KIND:
        raise SassReadError(f"SASS read {folder}: run.json does not say \"read\": \"{READ_KIND}\"")
    table = pd.DataFrame(rows)
    missing = [column for column in COLUMNS if column not in table]
    if missing:
        raise SassReadError(f"SASS read {folder}: sass.jsonl lacks {', '.join(missing)}")
    provenance = info.get("provenance") or {}
    return SassRead(table=table[list(COLUMNS)], run_id=str(info.get("run_id", folder.name)),
                    triton=str(provenance.get("triton", "unknown")),
                    machine=str(provenance.get("machine", "an unknown machine")))


def serialized_per_m(own: pd.DataFrame, read: SassRead) -> pd.DataFrame:
    """Per M, the points where fp4lab's fastest own kernel is KERNEL (`timed`), those whose very
    build (`own_against_peers`' own_build) the read compiled (`points`), how many of those wait
    for every wgmma before the next issues, and their wgmma counts."""
    columns = ["m", "timed", "points", "serialized", "hgmma_min", "hgmma_max"]
    if not len(own):
        return pd.DataFrame(columns=columns)
    mine = own[own["own"] == KERNEL].rename(columns={"own_build": "build"})
    joined = mine.merge(read.table, on=["fmt", "n", "k", "m", "build"])
    joined = joined[joined["hgmma"] > 0]
    rows = [{"m": int(m), "timed": int((mine["m"] == m).sum()), "points": len(group),
             "serialized": int((group["waited"] >= group["hgmma"]).sum()),
             "hgmma_min": int(group["hgmma"].min()), "hgmma_max": int(group["hgmma"].max())}
            for m, group in joined.groupby("m")]
    return pd.DataFrame(rows, columns=columns)


def serialized_sentence(per_m: pd.DataFrame, read: SassRead, run_triton: str | None = None) -> str | None:
    """What the read says of KERNEL's builds (a `serialized_per_m` frame), or None where it read
    none of them; `run_triton` the run's Triton version."""
    if not len(per_m):
        return None
    low, high = int(per_m["hgmma_min"].min()), int(per_m["hgmma_max"].max())
    counts = f"{low}" if low == high else f"{low}-{high}"

    def part(row) -> str:
        if row.serialized in (0, row.points) and row.points == row.timed:
            return f"all {row.points} at M = {row.m}"
        read_of = "" if row.points == row.timed else f" read, of {row.timed}"
        return f"{row.serialized or row.points} of the {row.points}{read_of} at M = {row.m}"

    if not per_m["serialized"].any():
        return (f"{text.code(KERNEL)} keeps its wgmma (Hopper's asynchronous tensor-core MMA) in flight in "
                f"the builds this run timed ({text.join(part(r) for r in per_m.itertuples())}; {counts} wgmma "
                f"instructions each; source: {read.source(run_triton)}).")
    return (f"In the builds this run timed ({text.join(part(r) for r in per_m.itertuples())}), "
            f"{text.code(KERNEL)} waits for each of its {counts} wgmma instructions (Hopper's asynchronous "
            "tensor-core MMA, fed the decoded weights from registers) before it issues the next, so its decode "
            "and its MMAs take turns instead of overlapping: ptxas serializes them (source: "
            f"{read.source(run_triton)}). What would fix it: a kernel that gives each k16 step's decoded "
            "fragments their own registers, so that a wgmma runs while the next step decodes.")


def compiled_finding(own: pd.DataFrame, run_view, root: Path = MEASUREMENTS_ROOT) -> str | None:
    """Chapter 01's sentence from the newest read under `root` about the builds a run timed
    (`own_against_peers`' rows; `run_view` the run's RunView, whose Triton the sentence names),
    or None where no read holds one of them."""
    folder = find_sass_read(root)
    if folder is None:
        return None
    read = read_sass(folder)
    return serialized_sentence(serialized_per_m(own, read), read, run_view.versions().get("triton"))
