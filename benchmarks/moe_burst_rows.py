"""The reference run's MoE rows that met the power cap inside a timed burst long enough for the
timer's `max_burst_ms` to cut: what `h200_moe_burst_resweep.sh` re-measures.

A row qualifies where its burst (replays x calls a replay x median) ran past CUT_FROM_MS and the
SM clock around it averaged under analysis.moe.SLOW_CLOCK_SHARE of the GPU's maximum, or where it is
fp4lab's fused MoE (its rows draw most: the clock fell in most of them, calls 158-159); so do the
fused MoE's anatomy rows (moe_anatomy) whose burst ran past CUT_FROM_MS, which chapter 04 sets beside
the table's time.

    PYTHONPATH=src python3 benchmarks/moe_burst_rows.py RUN --drop   # drop them; print the sweeps
    PYTHONPATH=src python3 benchmarks/moe_burst_rows.py RUN --show   # one line a row of the method set
"""

from __future__ import annotations

import argparse
import collections

from fp4lab import schema
from fp4lab.analysis.moe import SLOW_CLOCK_SHARE
from fp4lab.results import RunDir
from fp4lab.sweep.plan import DENSE_METHOD   # the dense curve: every sweep of a preset measures it

CUT_FROM_MS = 45.0          # under the 50 ms cut with room for the timer's estimate of a call
ALWAYS = ("cuda-w4a16-moe",)


def burst_ms(row: dict) -> float:
    return row["samples"] * row["calls_per_sample"] * row["median_us"] / 1e3


def capped_rows(rows: list[dict], max_clock_mhz: float) -> list[dict]:
    timed = [r for r in rows if r["status"] == "ok" and r["median_us"] is not None]
    return [r for r in timed if burst_ms(r) > CUT_FROM_MS and (
        r["method"] in ALWAYS or (r["sm_clock_mhz"] or 0) < SLOW_CLOCK_SHARE * max_clock_mhz)]


def sweeps(rows: list[dict]) -> list[tuple[str, int, tuple[int, ...], tuple[str, ...]]]:
    """(preset, ep, batches, methods) a sweep each, measuring the dropped rows and no point the run
    never held: a method's batches are its own dropped ones, and methods share a sweep only where
    their batches are the same (the dense curve, which every sweep of a preset measures, needs none).
    The sweep with most rows first: a call stopped at its limit has measured the most."""
    batches: dict[tuple[str, int, str], set[int]] = collections.defaultdict(set)
    counts: collections.Counter = collections.Counter()
    for row in rows:
        if row["method"] != DENSE_METHOD:
            batches[(row["preset"], row["ep"], row["method"])].add(row["batch"])
            counts[(row["preset"], row["ep"], row["method"])] += 1
    methods: dict[tuple[str, int, tuple[int, ...]], list[str]] = collections.defaultdict(list)
    size: collections.Counter = collections.Counter()
    for (preset, ep, method), chosen in sorted(batches.items()):
        methods[(preset, ep, tuple(sorted(chosen)))].append(method)
        size[(preset, ep, tuple(sorted(chosen)))] += counts[(preset, ep, method)]
    return [(preset, ep, chosen, tuple(methods[(preset, ep, chosen)]))
            for (preset, ep, chosen), _ in size.most_common()]


def describe(row: dict) -> str:
    where = f"{row['preset']} {row['fmt'] or '-'} B={row['batch']} EP{row['ep']} {row.get('stage') or row['gemm']}"
    return (f"{row['method']:<20} {where:<36} {row['median_us'] or float('nan'):>9.1f} us  {row['samples']:>3} replays "
            f"{row.get('sm_clock_start_mhz')} -> {row.get('sm_clock_end_mhz')} MHz (mean {row['sm_clock_mhz']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--drop", action="store_true")
    action.add_argument("--show", action="store_true")
    args = parser.parse_args()
    run = RunDir.open(args.run)
    rows = run.read_rows("moe")
    if args.drop:
        max_clock = run.run_json()["provenance"]["device"]["max_sm_clock_mhz"]
        chosen = capped_rows(rows, max_clock)
        run.drop_rows("moe", {schema.TABLES["moe"].row_key(r) for r in chosen})
        builds = [r for r in capped_rows(run.read_rows("moe_anatomy"), max_clock) if r["method"] in ALWAYS]
        run.drop_rows("moe_anatomy", {schema.TABLES["moe_anatomy"].row_key(r) for r in builds})
        for preset, ep, chosen_batches, methods in sweeps(chosen + builds):
            print(preset, ep, ",".join(map(str, chosen_batches)), ",".join(methods))
    else:
        repeats = run.run_json()["moe"]["config"]["timer"]["repeats"]
        for row in rows + run.read_rows("moe_anatomy"):
            cut = row["status"] == "ok" and row["samples"] < repeats
            if cut or row["method"] in ALWAYS:
                print(describe(row))


if __name__ == "__main__":
    main()
