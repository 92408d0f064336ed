"""Whether fp4lab's Triton tensor-core builds keep their wgmma in flight: a committed SASS read
(`benchmarks/triton_sass.py --out`: sass.jsonl, a row a build, and run.json with the compiler
and the machine) joined with the builds a run timed, by their labels, so a sentence about a
build's code is only ever said of the build the run measured.

A read is its own measurement (what the compiler emitted, no timing): every sentence names it.

And what keeping them in flight buys: a committed trial (`benchmarks/moe_kernel_dense_probe.py`,
run.json "read": TRIAL_KIND) that ran the fused MoE's CUDA kernel, whose wgmma builds do keep
theirs in flight (builds_sass.jsonl), as a dense GEMM beside its mma.sync builds and the peers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4lab import text
from fp4lab.analysis.gemm import PEERS
from fp4lab.results import MEASUREMENTS_ROOT

KERNEL = "triton-w4a16"        # the backend whose builds the read compiles
READ_KIND = "triton-sass"      # run.json's "read" of such a folder
TRIAL_KIND = "moe-kernel-as-dense"   # run.json's "read" of the in-flight trial's folder
TRIAL_BACKEND = "cuda-moe-as-dense"  # its rows' backend
TRIAL_M = 64                   # the M the trial's sentence speaks of (the first "level" M)
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
        # the configurations are the run's, the binaries a recompilation of them
        return (f"the sm_90 SASS of the same build configurations, recompiled by Triton {self.triton} "
                f"({same}) on {self.machine}; read {self.run_id}")


def find_read(root: Path, kind: str, data: str) -> Path | None:
    """The newest folder under `root` (run ids start with their UTC time) whose run.json says
    "read": `kind` and that holds the file `data`."""
    if not Path(root).is_dir():
        return None
    found = None
    for folder in sorted(Path(root).glob("*")):
        if (folder / data).is_file() and _read_kind(folder) == kind:
            found = folder
    return found


def _jsonl(path: Path) -> list[dict]:
    """The rows of a .jsonl file (OSError or ValueError where it cannot be read)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _read_kind(folder: Path) -> str | None:
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return info.get("read") if isinstance(info, dict) else None


def find_sass_read(root: Path = MEASUREMENTS_ROOT) -> Path | None:
    """The newest folder under `root` holding a SASS read of KERNEL's builds."""
    return find_read(root, READ_KIND, "sass.jsonl")


def read_sass(folder) -> SassRead:
    """The read in `folder`; SassReadError when a file is missing, is not a SASS read or lacks a
    column."""
    folder = Path(folder)
    try:
        info = json.loads((folder / "run.json").read_text())
        rows = _jsonl(folder / "sass.jsonl")
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
    counts = text.span((int(per_m["hgmma_min"].min()), int(per_m["hgmma_max"].max())), str)

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
            f"and its MMAs take turns instead of overlapping (source: {read.source(run_triton)}).")


# -- what keeping them in flight buys ---------------------------------------------------------------

@dataclass
class InFlightTrial:
    per_point: pd.DataFrame   # fmt, n, k, m, wgmma_us, sync_us, peer_us, peer: fastest of each
    waited: tuple[int, int]   # the wgmma builds' SASS: fewest and most HGMMA waited for in full
    issued: tuple[int, int]   # ... and their HGMMA counts
    machine: str
    run_id: str


def read_in_flight_trial(folder) -> InFlightTrial:
    """The trial in `folder`: per point, the fastest time of its wgmma builds and of its
    mma.sync builds before any split-K reduction (one split, or a launch of several alone), and
    the fastest peer (PEERS) on the same GPU; SassReadError where a file is missing or unreadable."""
    folder = Path(folder)
    try:
        info = json.loads((folder / "run.json").read_text())
        rows = [row for path in sorted(folder.glob("*/measurements.jsonl")) for row in _jsonl(path)]
        builds = pd.DataFrame(_jsonl(folder / "builds_sass.jsonl"))
    except (OSError, ValueError) as exc:
        raise SassReadError(f"trial {folder}: {exc}") from exc
    frame = pd.DataFrame(rows)
    if not len(frame) or "median_us" not in frame or "hgmma" not in builds:
        raise SassReadError(f"trial {folder}: no timed rows or no HGMMA counts")
    ok = frame[(frame["status"] == "ok") & frame["median_us"].notna()]
    trial = ok[ok["backend"] == TRIAL_BACKEND]
    unreduced = trial[trial["variant"].str.endswith((" kernel", " s1"))]
    wgmma = unreduced["variant"].str.contains(r" wg\d? ")   # CudaMoeConfig.label: " wg", " wg2"
    keys = ["fmt", "n", "k", "m"]
    peers = ok[ok["backend"].isin(PEERS)]
    fastest_peer = peers.loc[peers.groupby(keys)["median_us"].idxmin(), keys + ["backend", "median_us"]]
    per_point = (unreduced[wgmma].groupby(keys)["median_us"].min().rename("wgmma_us").to_frame()
                 .join(unreduced[~wgmma].groupby(keys)["median_us"].min().rename("sync_us"), how="inner")
                 .join(fastest_peer.set_index(keys).rename(columns={"median_us": "peer_us", "backend": "peer"}),
                       how="inner").reset_index())
    async_builds = builds[builds["hgmma"] > 0]
    provenance = info.get("provenance") or {}
    return InFlightTrial(per_point=per_point,
                         waited=(int(async_builds["waited"].min()), int(async_builds["waited"].max())),
                         issued=(int(async_builds["hgmma"].min()), int(async_builds["hgmma"].max())),
                         machine=str(provenance.get("machine", "an unknown machine")).split(" (")[0],
                         run_id=str(info.get("run_id", folder.name)))


def _ratio(value) -> str:
    """A trial ratio to three digits ('1.05x'): the builds differ by a few percent."""
    return text.ratio(float(value), 3)


def in_flight_sentence(trial: InFlightTrial, m: int = TRIAL_M) -> str | None:
    """What the trial says at M = `m`, per point: the wgmma build's time over its own mma.sync
    build's and over the fastest peer's; None where it timed no point at `m`."""
    at = trial.per_point[trial.per_point["m"] == m]
    if not len(at):
        return None
    over_sync, over_peer = at["wgmma_us"] / at["sync_us"], at["wgmma_us"] / at["peer_us"]
    helped = int((over_sync < 1).sum())
    lead = ("Keeping them in flight did not help in fp4lab's own trial" if helped == 0
            else f"Keeping them in flight helped at {helped} of {len(at)} points of fp4lab's own trial")
    return (f"{lead}: its CUDA fused MoE kernel, run as a dense GEMM at M = {m} on {trial.machine} "
            f"({text.count(len(at), 'point')}, before any split-K reduction), took {text.span(over_sync, _ratio)} "
            f"the time of its mma.sync build when it kept its wgmma in flight ({text.span(trial.waited, str)} of "
            f"its {text.span(trial.issued, str)} waited for, at the ends of its staged chunks), and "
            f"{text.span(over_peer, _ratio)} the fastest peer's (source: {trial.run_id}).")


def compiled_finding(own: pd.DataFrame, run_view, root: Path = MEASUREMENTS_ROOT) -> str | None:
    """Chapter 01's sentence from the newest read under `root` about the builds a run timed
    (`own_against_peers`' rows; `run_view` the run's RunView, whose Triton the sentence names),
    followed, where it finds them serialized, by what the newest in-flight trial says; None where
    no read holds one of them."""
    folder = find_sass_read(root)
    if folder is None:
        return None
    read = read_sass(folder)
    per_m = serialized_per_m(own, read)
    sentence = serialized_sentence(per_m, read, run_view.versions().get("triton"))
    trial = find_read(root, TRIAL_KIND, "builds_sass.jsonl")
    if sentence is None or not per_m["serialized"].any() or trial is None:
        return sentence
    followed = in_flight_sentence(read_in_flight_trial(trial))
    return f"{sentence} {followed}" if followed else sentence
