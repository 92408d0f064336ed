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
from typing import Any

import pandas as pd

from fp4lab import text
from fp4lab.results import MEASUREMENTS_ROOT

SCHEDULERS_PER_SM = 4                      # warp schedulers (SMSPs) of an SM since Volta
LOAD_BOUND_STALLS = 1.0    # long-scoreboard cycles per instruction issued from which the loads,
                           # not the issue slots, hold a launch back (more waiting than issuing)
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
    "device__attribute_multiprocessor_count": "sms",
    "device__attribute_clock_rate": "clock_khz",     # the GPU's max SM clock
}
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


class CountersError(ValueError):
    """A profile folder that cannot be read as one (says which file and why)."""


@dataclass
class Counters:
    """One profile: a row per kernel launch and where it came from."""

    table: pd.DataFrame      # launch, kernel, weights, us, dram_pct, ..., instr_per_weight, stalls
    profiled: str            # whose kernels: "fp4lab" or a peer library's name
    run_id: str
    device: str
    spec: str                # fp4lab.hardware key of the GPU ("h200"), "" when unknown
    commit: str

    @property
    def issue_slots_per_ns(self) -> float:
        """Warp instructions the GPU can issue per ns: SMs x schedulers x max SM clock."""
        first = self.table.iloc[0]
        return first["sms"] * SCHEDULERS_PER_SM * first["clock_khz"] * 1e-6

    def caption(self, what: str) -> str:
        return (f"{what}; Nsight Compute profile {self.run_id} ({self.device}, fp4lab {text.short_sha(self.commit)}): "
                "one launch each, unlocked clocks, cold caches, so its times sit above the timer's medians")


def find_profiles(choice: str = "", root: Path = MEASUREMENTS_ROOT) -> list[Path]:
    """The profile folders a chapter shows: `choice` folder paths, comma-separated; "" the newest
    folder under `root` (run ids start with their UTC time) holding raw.csv and launches.json,
    one for each kind run.json's "profiled" names (fp4lab's kernels, a peer's), leaving out
    folders whose run.json says "for_book": false (candidate builds profiled while tuning, not
    what a reference run measured); "none" none. CountersError for a named folder that is not a
    profile."""
    if choice == "none":
        return []
    if choice:
        folders = [Path(part.strip()) for part in choice.split(",") if part.strip()]
        for folder in folders:
            if not (folder / "raw.csv").is_file():
                raise CountersError(f"counters_dir {str(folder)!r}: no raw.csv there (an "
                                    "ncu_profile.py run folder holds raw.csv, launches.json "
                                    "and run.json)")
        return folders
    if not Path(root).is_dir():
        return []
    newest: dict[str, Path] = {}
    for folder in sorted(Path(root).glob("*")):
        if (folder / "raw.csv").is_file() and (folder / "launches.json").is_file():
            info = _run_info(folder)
            if info.get("for_book", True) is not False:
                newest[str(info.get("profiled", "fp4lab"))] = folder
    return [newest[kind] for kind in sorted(newest, key=lambda kind: kind != "fp4lab")]


def _run_info(folder: Path) -> dict:
    """A profile folder's run.json ({} where it is missing or unreadable)."""
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


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
    return Counters(table=table, profiled=str(info.get("profiled", "fp4lab")),
                    run_id=str(info.get("run_id", folder.name)),
                    device=str((provenance.get("device") or {}).get("name", "unknown GPU")),
                    spec=str((provenance.get("device") or {}).get("spec", "")),
                    commit=str(provenance.get("fp4lab_git_sha", "unknown")))


def raw_table(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """ncu's --page raw CSV -> (metric names, units, one list of cells per kernel row); its own
    "==" log lines skipped."""
    lines = [r for r in csv.reader(path.read_text().splitlines()) if r and not r[0].startswith("==")]
    if len(lines) < 2:
        raise CountersError(f"{path}: no ncu header and units rows")
    return lines[0], lines[1], lines[2:]


def _ncu_rows(path: Path) -> list[dict]:
    """ncu's --page raw CSV (`raw_table`) -> one dict per kernel row: COLUMNS in fixed units (us,
    bytes, %) and "stalls", the three largest stall reasons as "reason value" text."""
    names, units, data = raw_table(path)
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


# whose kernels a profile holds (run.json's "profiled"), as the page names them
KIND_NAMES = {"fp4lab": "fp4lab's Triton kernels", "fp4lab-cuda": "fp4lab's CUDA kernels"}
# the MoE kernel a profile of each kind holds, named in full ("the fused MoE" elsewhere in the book
# is the diagnosed path, which need not be the profiled kernel)
MOE_NAMES = {"fp4lab": "fp4lab's Triton fused MoE (triton-w4a16-moe)",
             "fp4lab-cuda": "fp4lab's CUDA fused MoE (cuda-w4a16-moe)"}


def kind_name(profile: Counters) -> str:
    return KIND_NAMES.get(profile.profiled, profile.profiled)


def counters_findings(profiles: list[Counters], bandwidth_tbps: float | None = None,
                      measured_in: str = "this run") -> list[str]:
    """What the profiles say: first `instruction_bound` over all of them, then for each its
    dense decode GEMM's instructions, issue rate and warps (against the stream's DRAM share
    where profiled) and its MoE GEMMs. Each sentence from the rows named. `measured_in`: the run
    whose copy bandwidth `bandwidth_tbps` is."""
    bound = instruction_bound(profiles, bandwidth_tbps, measured_in)
    even = break_even(profiles, bandwidth_tbps, measured_in)
    lines = [bound] if bound else []
    for profile in profiles:
        lines += _profile_lines(profile, even[0] if even else None)
    return lines


def scheduler_count(profile: Counters) -> str:
    """'132 SMs x 4 at its 1980 MHz max SM clock': the issue slots `break_even` counts (a slower
    clock, the power cap's, gives fewer)."""
    first = profile.table.iloc[0]
    return (f"{int(first['sms'])} SMs x {SCHEDULERS_PER_SM} at its {first['clock_khz'] / 1000:.0f} MHz "
            "max SM clock")


def break_even(profiles: list[Counters], bandwidth_tbps: float | None = None, measured_in: str = "this run",
               fmt: str = "nvfp4"):
    """(instructions per weight at which issuing them on every scheduler slot takes as long as
    reading `fmt` weights (codes and scales) at `bandwidth_tbps`, where that bandwidth comes from,
    the bandwidth): None without a profile or a bandwidth (the spec sheet's when none is given)."""
    from fp4lab import hardware, roofline

    if not profiles:
        return None
    first = profiles[0]
    source = f"the copy bandwidth measured in {measured_in}"
    if bandwidth_tbps is None and first.spec in hardware.SPECS:
        bandwidth_tbps, source = hardware.SPECS[first.spec].memory_bw_tbps, "the spec sheet's bandwidth"
    if not bandwidth_tbps:
        return None
    bytes_per_weight = 0.5 + roofline.SCALE_BYTES / roofline.BLOCK_SIZE[fmt]     # a code, a scale's share
    even = 32 * first.issue_slots_per_ns * 1e9 * bytes_per_weight / (bandwidth_tbps * 1e12)
    return even, source, bandwidth_tbps


def _gemm_rows(profiles: list[Counters]) -> list[tuple[Counters, Any]]:
    """Every GEMM launch profiled: rows that read weights, the anatomy's load and stream variants
    left out."""
    return [(p, r) for p in profiles for r in p.table.itertuples()
            if r.weights and "load" not in r.launch and "stream" not in r.launch]


def _stall_pairs(stalls: str) -> list[tuple[str, str]]:
    """'not selected 2.23, math pipe throttle 1.94' -> [('not selected', '2.23'), ...]"""
    return [(reason, cycles) for reason, _, cycles in
            (part.strip().rpartition(" ") for part in str(stalls).split(",")) if reason]


def instruction_bound(profiles: list[Counters], bandwidth_tbps: float | None = None,
                      measured_in: str = "this run") -> str | None:
    """Over every GEMM launch profiled: their instructions per weight against `break_even`, which
    launches issue more than that (their instructions bound them) and which fewer, and for the
    leanest of those what its warps wait on instead. None without GEMM rows or a bandwidth."""
    gemms = _gemm_rows(profiles)
    even = break_even(profiles, bandwidth_tbps, measured_in)
    if not gemms or even is None:
        return None
    even, source, bandwidth_tbps = even
    low = min(r.instr_per_weight for _, r in gemms)
    high = max(r.instr_per_weight for _, r in gemms)
    over = [(p, r) for p, r in gemms if r.instr_per_weight >= even]
    under = [(p, r) for p, r in gemms if r.instr_per_weight < even]
    kinds = text.join(dict.fromkeys(kind_name(p) for p, _ in gemms))
    head = (f"The FP4 GEMM launches profiled ({kinds}) run {low:.1f}-{high:.1f} instructions per weight. "
            f"At {even:.2f} instructions per weight, issuing them on every slot of the "
            f"{text.md(profiles[0].device)}'s schedulers ({scheduler_count(profiles[0])}) takes as long as "
            f"reading NVFP4 weights at {source} ({bandwidth_tbps:.2f} TB/s)")
    if not under:
        busiest = max(r.issue_pct for _, r in gemms)
        return (head + f", and every launch issues more; the busiest issues on {text.pct(busiest)} of cycles: "
                "on this GPU the kernels' instructions (decode, operand moves, MMA, addressing), not their "
                "bytes, bound an FP4 weight-only GEMM. A faster one needs fewer instructions per weight, or "
                "FP4 tensor cores (sm_100) that take the codes as they are.")
    head += "."
    if over:
        head += (f" {len(over)} of the {len(gemms)} GEMM launches (the anatomy's loads-only and stream builds "
                 "left out) issue more than that: their instructions bound "
                 "them (fewer instructions per weight, or FP4 tensor cores (sm_100) that take the codes as "
                 "they are, would make them faster).")
    lean_profile, lean = min(under, key=lambda pr: pr[1].instr_per_weight)
    reason, cycles = (_stall_pairs(lean.stalls) or [("", "")])[0]
    head += (f" The leanest, {text.md(lean.launch)} ({kind_name(lean_profile)}), issues "
             f"{lean.instr_per_weight:.1f} instructions per weight, on {text.pct(lean.issue_pct)} of its cycles")
    if reason:
        head += f"; its warps' largest stall is {reason} ({cycles} cycles per instruction issued)"
    if reason == "long scoreboard" and float(cycles) >= LOAD_BOUND_STALLS:
        head += ": it waits on its global loads, not on its instructions"
    return head + "."


# stalls of warps that could issue but wait for a scheduler's slot or a busy pipe: a launch whose
# largest stalls are these is held back by its instructions, not by its loads
ISSUE_STALLS = ("not selected", "selected", "math pipe throttle", "dispatch stall")


def _kernel_rows(profiles: list[Counters], kernel: str, fmt: str | None) -> list:
    """The weight-reading launches of `kernel` (a backend or MoE method), those in `fmt` where
    any is."""
    rows = [r for p in profiles for r in p.table.itertuples()
            if r.weights and str(r.launch).split(" ")[0] == kernel]
    return [r for r in rows if fmt and f" {fmt} " in f" {r.launch} "] or rows


def issue_rate_sentence(profiles: list[Counters], kernel: str, fmt: str | None = None,
                        bandwidth_tbps: float | None = None, subject: str = "It") -> str | None:
    """For a kernel under `break_even` whose warps wait for the schedulers (its largest stalls in
    ISSUE_STALLS): how long its instructions take at the issue rate it reached, against its
    weights' read at the same bandwidth, which is why fewer instructions per weight would still
    make it faster. None when it has no profile, is over the line, waits on its loads, or issues
    fast enough to finish its instructions within the read."""
    rows = _kernel_rows(profiles, kernel, fmt)
    # the break-even of the weights the kernel reads: MXFP4's scales are half NVFP4's bytes
    even = break_even(profiles, bandwidth_tbps, fmt=fmt or "nvfp4")
    if not rows or even is None:
        return None
    even = even[0]
    if max(r.instr_per_weight for r in rows) >= even:
        return None
    stalls = _stall_pairs(max(rows, key=lambda r: r.us).stalls)[:2]
    if not stalls or not all(reason in ISSUE_STALLS for reason, _ in stalls):
        return None
    # issuing on issue_pct of the slots stretches the instructions' time by 100 / issue_pct: they
    # count as that many more on every slot
    at_rate = [r.instr_per_weight / (r.issue_pct / 100) for r in rows]
    if min(at_rate) <= even:
        return None
    return (f"{subject} needs fewer than {even:.2f} instructions per weight"
            f"{f' with {fmt.upper()} weights' if fmt and fmt != 'nvfp4' else ''} "
            f"({text.span([r.instr_per_weight for r in rows], lambda v: f'{v:.1f}')}), but it issues on only "
            f"{text.span([r.issue_pct for r in rows], text.pct)} of its cycles: at that rate they take as long as "
            f"{text.span(at_rate, lambda v: f'{v:.1f}')} would on every slot, "
            f"{text.span([v / even for v in at_rate], lambda v: f'{v:.1f}x')} the time of reading its weights, "
            "so its instructions, more than its loads, set its time.")


def kernel_sentence(profiles: list[Counters], kernel: str, fmt: str | None = None,
                    subject: str | None = None) -> str | None:
    """What the profiled launches of `kernel` (a backend or MoE method; those in `fmt` where any
    is) do with their cycles, as one sentence: where they were profiled, their instructions per
    weight, their issue share and DRAM's, and the two largest stalls of the longest launch; None
    when no profile holds it. `subject` names the kernel (its name by default)."""
    rows = _kernel_rows(profiles, kernel, fmt)
    if not rows:
        return None
    words = [str(r.launch).split(" ")[1:] for r in rows]          # after the kernel's name
    common = 0
    while all(len(w) > common + 1 and w[common] == words[0][common] for w in words):
        common += 1
    launches = ", ".join(f"{text.md(' '.join(w[common:]))} {text.us(r.us)}" for w, r in zip(words, rows))
    where = f"{text.md(' '.join(words[0][:common]))}: {launches}" if common else launches
    line = (f"{subject or text.md(kernel)}, profiled ({where}), issues "
            f"{text.span([r.instr_per_weight for r in rows], lambda v: f'{v:.1f}')} instructions per weight "
            f"with its issue slots busy on {text.span([r.issue_pct for r in rows], text.pct)} of cycles, "
            "and reads DRAM at "
            # Nsight's DRAM peak is the memory's theoretical rate, not the copy bandwidth the floors use
            f"{text.span([r.dram_pct for r in rows], text.pct)} of Nsight Compute's DRAM peak")
    stalls = _stall_pairs(max(rows, key=lambda r: r.us).stalls)[:2]
    if stalls:
        named = [f"'{reason}' ({cycles} cycles per instruction issued)" if i == 0 else f"'{reason}' ({cycles})"
                 for i, (reason, cycles) in enumerate(stalls)]
        line += f"; its warps' largest stalls are {text.join(named)}"
        if all(reason in ISSUE_STALLS for reason, _ in stalls):
            line += ": warps that could issue wait for the schedulers and the math pipe, not for their loads"
    return line + "."


def shown_rows(profile: Counters) -> pd.DataFrame:
    """The profile's rows a page shows: every launch that reads weights (the GEMMs and the
    anatomy's load and stream variants), then the launches that read none (routing, torch
    kernels between the GEMMs, the top-k sum) as one row: their count and summed time."""
    table = profile.table
    reads = table[table["weights"] > 0]
    rest = table[table["weights"] == 0]
    if not len(rest):
        return reads
    other = {"launch": f"{len(rest)} launches that read no weights (routing, torch kernels)",
             "us": rest["us"].sum()}
    return pd.concat([reads, pd.DataFrame([other])], ignore_index=True)


def _profile_lines(profile: Counters, even: float | None) -> list[str]:
    table = profile.table
    lines = []
    full = _first(table, "M=1 full") if profile.profiled == "fp4lab" else _first(table, "M=1")
    stream = _first(table, "stream")
    if full is not None:
        line = (f"{text.md(full['launch'])}: {full['instr_per_weight']:.1f} instructions per weight "
                f"({full['warp_instructions'] / 1e6:.1f} M warp instructions), issued on "
                f"{text.pct(full['issue_pct'])} of cycles with {text.pct(full['warps_active_pct'])} of warp "
                f"slots occupied ({int(full['registers'])} registers a thread); stall cycles per "
                f"instruction: {full['stalls']}. It reads DRAM at {text.pct(full['dram_pct'])} of Nsight "
                "Compute's DRAM peak")
        if stream is not None:
            line += f", where the stream of the same bytes reaches {text.pct(stream['dram_pct'])}"
        # at every issue slot, and at the issue rate measured, the instructions alone take this long
        issue_us = full["warp_instructions"] / profile.issue_slots_per_ns / 1e3
        at_rate = issue_us / (full["issue_pct"] / 100)
        line += (f". Issuing its instructions takes {text.us(issue_us)} at every slot of the "
                 f"{int(full['sms']) * SCHEDULERS_PER_SM} schedulers, {text.us(at_rate)} at the rate "
                 f"measured, of its {text.us(full['us'])}")
        if even is not None and full["instr_per_weight"] >= even:
            line += ("; at more instructions per weight than issuing takes in the read time, its "
                     "instructions, not its bytes, set its time")
        lines.append(line + ".")
    moe = table[table["kernel"].str.contains("MoE", regex=False)]
    if len(moe):
        parts = "; ".join(f"{text.md(r.launch)} {text.us(r.us)}, {r.instr_per_weight:.1f} instructions per "
                          f"weight issued on {text.pct(r.issue_pct)} of cycles, DRAM {text.pct(r.dram_pct)} of its peak, "
                          f"L2 traffic {r.l2_over_dram:.1f}x its DRAM bytes; stall cycles per instruction: "
                          f"{r.stalls}" for r in moe.itertuples())
        glue = table[table["kernel"] == "torch"]
        extra = (f"; the torch kernels between its GEMMs take {text.us(glue['us'].sum())}" if len(glue) else "")
        name = profile.profiled
        what = MOE_NAMES.get(name, f"{text.upper_first(name)}'s MoE GEMMs")
        lines.append(f"{what}: {parts}{extra}.")
    return lines


def _first(table: pd.DataFrame, words: str):
    match = table[table["launch"].str.contains(words, regex=False)]
    return None if not len(match) else match.iloc[0]
