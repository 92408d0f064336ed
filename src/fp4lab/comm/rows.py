"""The `comm` table: one row per measured point, built on rank 0 from every rank's result.

Cross-rank time, as nccl-tests takes it: each timed sample (the same iteration on every rank) is
the slowest rank's time for it; median, p20 and p80 are then taken over those per-iteration
maxima. A point that failed on any rank is one row with that rank's status and error.
"""

from __future__ import annotations

from typing import Any

from fp4lab import bench
from fp4lab.comm import ops
from fp4lab.comm.plan import CommPlan, CommPoint

from fp4lab.schema import COMM_COLUMN_SPECS, COMM_COLUMNS, COMM_KEY  # noqa: F401 - the declared table
# when ranks disagree, the row takes the most serious status
STATUS_ORDER = ("ok", "unavailable", "wrong_result", "oom", "error", "timeout")


def blank_row(run_id: str, point: CommPoint, plan: CommPlan, backend: str, device: str) -> dict:
    """A row with the point's identity and nothing measured."""
    all_to_all = point.op in ops.ALL_TO_ALL_OPS
    row = dict.fromkeys(COMM_COLUMNS)
    row.update(run_id=run_id, op=point.op, world_size=point.world_size, tokens=point.tokens,
               dtype=point.dtype, routing=point.routing, hidden=plan.hidden,
               top_k=plan.top_k if all_to_all else None,
               experts=plan.experts if all_to_all else None, preset=plan.preset,
               backend=backend, device=device, graph=False, status="ok", error="", note="")
    return row


def point_row(run_id: str, point: CommPoint, plan: CommPlan, results: list[dict | None],
              backend: str, device: str) -> dict[str, Any]:
    """The row of `point` from the gathered per-rank results (None for ranks outside its group)."""
    row = blank_row(run_id, point, plan, backend, device)
    members = [(rank, result) for rank, result in enumerate(results) if result is not None]
    first = members[0][1]
    row.update(bytes=first.get("nbytes"), imbalance=first.get("imbalance"),
               calls_per_sample=first.get("calls"))
    failed = [(rank, r) for rank, r in members if r["status"] != "ok"]
    if failed:
        rank, worst = max(failed, key=lambda item: STATUS_ORDER.index(item[1]["status"]))
        row.update(status=worst["status"], error=f"rank {rank}: {worst['error']}")
        return row
    per_iteration = [max(samples) for samples in zip(*(r["samples"] for _, r in members))]
    timing = bench.summarize(per_iteration, graph=all(r["graph"] for _, r in members),
                             cold_l2=False, sm_clock_mhz=None)
    notes = sorted({r["note"] for _, r in members if r["note"]})
    row.update(median_us=timing.median_us, p20_us=timing.p20_us, p80_us=timing.p80_us,
               n=timing.n, graph=timing.graph, note="; ".join(notes),
               rank_median_us=[bench.summarize(r["samples"], graph=r["graph"], cold_l2=False,
                                               sm_clock_mhz=None).median_us for _, r in members],
               algbw_gbps=ops.algbw_gbps(row["bytes"], timing.median_us),
               busbw_gbps=ops.busbw_gbps(point.op, row["bytes"], timing.median_us,
                                         point.world_size))
    return row


def progress_line(position: int, total: int, label: str, row: dict) -> str:
    """One fixed-width line per point as it is measured."""
    if row["status"] != "ok":
        return f"{position:>4}/{total:<4} {label:<44.44} {row['status']}: {row['error'][:90]}"
    return (f"{position:>4}/{total:<4} {label:<44.44} {row['median_us']:>10.2f} us  "
            f"p20-p80 {row['p20_us']:>9.2f}-{row['p80_us']:<9.2f} "
            f"busbw {row['busbw_gbps']:>8.3f} GB/s  {'graph' if row['graph'] else 'eager'}")


def summary_table(rows: list[dict]) -> str:
    """Per op, group size and dtype: points ok, latency at the fewest tokens, best busbw."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["op"], row["world_size"], row["dtype"], row["routing"] or "-")
        groups.setdefault(key, []).append(row)
    lines = [f"{'op':<20} {'n':>3} {'dtype':<5} {'routing':<9} {'ok':>7} {'T_min':>6} "
             f"{'us@T_min':>10} {'best busbw GB/s':>16} {'graph':>5}"]
    for (op, size, dtype, spec), members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        smallest = min(ok, key=lambda r: r["tokens"]) if ok else None
        tokens = str(smallest["tokens"]) if smallest else "-"
        latency = f"{smallest['median_us']:.2f}" if smallest else "-"
        best = max((r["busbw_gbps"] for r in ok), default=None)
        busbw = f"{best:.3f}" if best is not None else "-"
        graph = "yes" if ok and all(r["graph"] for r in ok) else "no"
        lines.append(f"{op:<20} {size:>3} {dtype:<5} {spec:<9.9} {len(ok):>3}/{len(members):<3} "
                     f"{tokens:>6} {latency:>10} {busbw:>16} {graph:>5}")
    return "\n".join(lines)
