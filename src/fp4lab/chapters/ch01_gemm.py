"""Chapter 01, the FP4 GEMM sweep: every backend across batch sizes M against the GPU's ceilings,
every 4-bit method against the FP4 read floor and cuBLAS bf16, and the seed's table for this GPU.

The chapter measures into the run folder whatever points of its grid the run lacks (a rerun or a
resumed run measures nothing twice), then reads the run through fp4lab.analysis.gemm.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab import params, profiles, text
from fp4lab.analysis import counters as kernel_counters, gemm as analysis, sass
from fp4lab.chapters.context import Context, open_context, parameters_block, resolve_parameters
from fp4lab.plots import gemm as figures
from fp4lab.plots.tables import Col, html_table
from fp4lab.references import SEED_SOURCE, seed_sm120_table
from fp4lab.schema import OWN_GEMM_BACKENDS
from fp4lab.sweep.config import GemmSweep

TITLE = "01 · How fast do FP4 GEMMs run, and against what ceiling?"
AVAILABILITY = [Col("backend", "backend"), Col("weights", "weights"), Col("ok", "ok", "int"),
                Col("wrong_result", "wrong result", "int"), Col("unavailable", "unavailable", "int"),
                Col("error", "error", "int"), Col("oom", "out of memory", "int"),
                Col("timeout", "timeout", "int")]
CEILINGS = [Col("ceiling", "ceiling"), Col("measured", "measured here", "sig"), Col("spec", "spec sheet", "sig"),
            Col("how", "how it was measured (the probe's timer line)")]


def seed_note(math_dtype: str | None) -> str:
    """What the seed table's columns mean (its caption's tail), naming the peak its headers name."""
    peak = f"the {math_dtype} peak" if math_dtype else "its math peak"
    return (f"min/max over shapes and formats; % of {peak} (spec / measured) at the best "
            "point; regime: largest floor by shape")


def seed_columns(math_dtype: str | None) -> list[Col]:
    """The seed table's columns, its "% of peak" headers naming the peak (`analysis.seed_math_dtype`:
    on Hopper a weight-only FP4 kernel runs bf16 MMAs, so its peak is bf16's, not an FP4 one)."""
    peak = f"% {math_dtype}" if math_dtype else "% of peak"     # short: one header line
    return [Col("M", "M (tokens)", "int"), Col("TFLOP/s min", "TFLOP/s min", "sig"),
            Col("TFLOP/s max", "TFLOP/s max", "sig"), Col("% of spec peak", f"{peak} spec", "pct"),
            Col("% of measured peak", f"{peak} measured", "pct"), Col("regime", "regime")]
FASTEST = [Col("m", "M (tokens)", "int"), Col("backend", "fastest 4-bit method"),
           Col("cases won", "cases won (format x shape)"),
           Col("median speed-up vs bf16", "speed-up vs cuBLAS bf16 (median)", "ratio"),
           Col("median % of FP4 floor", "% of the FP4 read floor reached (median)", "pct")]
PEERS = [Col("m", "M (tokens)", "int"), Col("own_shown", "fp4lab's kernel"), Col("peer_shown", "fastest peer"),
         Col("speedup_shown", "speed-up over it: median (range)"), Col("at_aim_shown", "points at the aim"),
         Col("pct_shown", "% of the measured bf16 peak: peer / fp4lab"),
         Col("mma_over_read", "bf16 MMA floor / FP4 read floor", "ratio")]
ANATOMY = [Col("shape", "N x K"), Col("m", "M", "int"), Col("fmt", "format"),
           Col("stream", "bytes as a stream", "us"), Col("load", "loads only", "us"),
           Col("decode", "decode, no math", "us"),
           Col("math", "math on bf16", "us"), Col("mma", "MMAs, no split-K reduction", "us"),
           Col("full", "full kernel", "us"),
           Col("decode_x2", "decode twice", "us"), Col("copy_floor_us", "copy floor", "us"),
           Col("load_share", "loads / full", "pct")]
SPREAD = [Col("gpu_index", "GPU", "int"), Col("pci_bus_id", "PCI bus id"),
          Col("points", f"points at M <= {analysis.DECODE_M}", "int"),
          Col("median_vs_box", "time vs the box's median (median)", "ratio"),
          Col("slowest_vs_box", "time vs the box's median (worst point)", "ratio"),
          Col("median_sm_clock_mhz", "SM clock in the energy windows (MHz)", "sig")]
COUNTERS = [Col("launch", "launch"), Col("us", "time", "us"), Col("dram_pct", "DRAM % of peak", "pct"),
            Col("instr_per_weight", "instructions per weight", "sig"),
            Col("issue_pct", "issue slots busy", "pct"), Col("warps_active_pct", "warp slots occupied", "pct"),
            Col("registers", "registers a thread", "int"), Col("l2_over_dram", "L2 / DRAM bytes", "ratio")]
PUBLISHED = [Col("M", "M (tokens)"), Col("TFLOP/s", "TFLOP/s"), Col("% of ~2000 TOPS", "% of ~2000 TOPS"),
             Col("regime (as the seed read it)", "regime (as the seed read it)")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          backends=None, fmts=None, m_values=None, preset=None, shapes=None, repeats=None,
          energy_window_s=None, gpus=None, measure: bool = True, counters_dir: str = ""):
    """Check the parameters, measure what the run lacks, and fill the page."""
    knobs = dict(backends=backends, fmts=fmts, m_values=m_values, preset=preset, shapes=shapes,
                 repeats=repeats, energy_window_s=energy_window_s, gpus=gpus)
    context = open_context(TITLE, run_dir, reference_dir, profile, device, **knobs)
    measure = params.check_bool("measure", measure)
    counter_folders = kernel_counters.find_profiles(params.check_text("counters_dir", counters_dir))
    config = GemmSweep.from_profile(
        context.profile, context.device, preset=preset,
        **{name: value for name, value in knobs.items() if name not in ("preset", "repeats")},
        **({"timer": {"repeats": repeats}} if repeats is not None else {}))
    resolve_parameters(context, backends=config.backends, fmts=config.fmts, m_values=config.m_values,
                       preset=profiles.section(context.profile, "gemm").get("preset") or "none",
                       shapes=config.shapes, repeats=config.timer.repeats,
                       energy_window_s=config.energy_window_s, gpus=config.gpus)
    context.parameters.append(("counters_dir", ", ".join(
        f"results/measurements/{f.name}" if f.parent == kernel_counters.MEASUREMENTS_ROOT else str(f)
        for f in counter_folders) or "none"))
    if measure and context.measures_here:
        from fp4lab.sweep.gemm import run_sweep

        measured = run_sweep(config, context.run, command="notebook 01_fp4_gemm_sweep")
        context.parameters.append(("points measured now", measured))
    parameters_block(context)
    fill(context, counter_folders)
    return context.page


def fill(context: Context, counter_folders=()) -> None:
    page = context.page
    results = analysis.gemm_results(context.run)
    reference = (analysis.gemm_results(context.reference.run) if context.reference
                 and context.reference.run.has_table("gemm") else None)
    if counter_folders:   # committed profiles: shown whatever this run holds
        _counters(page, counter_folders, results, reference)
    if not len(results.frame):
        page.note("availability", "This run holds no GEMM rows: the sweep did not run.", "warning")
        return
    table = analysis.availability(results)
    columns = [col for col in AVAILABILITY if col.source in table.columns]   # the statuses this run has
    page.html("availability", html_table(table, columns, caption=results.caption("points per backend and status")))
    page.bullets("availability", [f"{text.join(text.code(b) for b in backends)}: "
                                  f"{text.md(text.package_relative(reason))}"
                                  for backends, reason in analysis.why_not_groups(table)])
    _speed(page, results, reference, context)
    _four_bit(page, results)
    _peers(page, results)
    _anatomy(page, results)
    _gpus(page, results)
    _roofline(page, results)
    _seed(page, results, reference, context.profile)
    page.bullets("findings", findings(results, reference))


def _label(results: analysis.GemmResults) -> str:
    return f"{results.view.device} ({results.view.run_id})"


def _speed(page, results, reference, context: Context) -> None:
    runs = {_label(results): results.ok}
    shared = reference is not None and len(reference.ok) and bool(
        set(zip(results.ok["n"], results.ok["k"])) & set(zip(reference.ok["n"], reference.ok["k"])))
    if shared:
        runs[_label(reference)] = reference.ok
    if len(results.ok):
        page.figure("speed", figures.speed_by_m(runs), results.caption(
            "TFLOP/s of every correct point" + ("; the run shown beside dashed on the shapes both measured" if shared else "")))
    if reference is not None and not shared and len(reference.ok):
        page.prose("speed", f"The run shown beside ({text.md(reference.view.device)}) measured other shapes; "
                            "its own chapter 01, in the reference part of the book, shows them.")


def _four_bit(page, results) -> None:
    points = analysis.four_bit_points(results)
    if not (points["weight_dtype"].isin(analysis.FOUR_BIT)).any():
        page.prose("fourbit", "No method reading 4-bit weights ran correctly in this run.")
        return
    page.figure("fourbit", figures.four_bit_vs_floor(points), results.caption(
        "every 4-bit-weight method and cuBLAS bf16: time per call over the FP4 weight-read "
        "floor at the run's measured bandwidth (1 = the floor; 2 = half the speed a weight read allows)"))
    page.html("fourbit", html_table(analysis.fastest_fp4_per_m(results), FASTEST,
                                    caption=results.caption("the fastest 4-bit method per M")))
    for note in analysis.launch_notes(results):
        page.prose("fourbit", f"{text.md(note)}.")


def _peers(page, results) -> None:
    """fp4lab's own kernels against the fastest peer at every point both ran, the aims, and why
    the larger Ms fall short."""
    table = analysis.own_against_peers(results)
    if not len(table):
        page.prose("peers", f"No point of this run has both one of fp4lab's own kernels "
                            f"({text.join(text.code(b) for b in OWN_GEMM_BACKENDS)}) and a peer "
                            f"({text.join(text.code(b) for b in analysis.PEERS)}) timed correctly.")
        return
    per_m = analysis.own_against_peers_per_m(table)
    page.figure("peers", figures.own_against_peers(table, analysis.PEER_TARGET, analysis.PEER_TARGET_UP_TO_M,
                                                   analysis.PEER_LEVEL_UP_TO_M), results.caption(
        "fp4lab's fastest own kernel at each point: the fastest peer's time over its time (above 1: fp4lab's "
        "is faster)"))
    shown = per_m.assign(
        own_shown=[most_often(r.own, r.own_points, r.points) for r in per_m.itertuples()],
        peer_shown=[most_often(r.peer, r.peer_points, r.points) for r in per_m.itertuples()],
        speedup_shown=[f"{text.ratio(r.median_speedup)} ({speedup_range(r.min_speedup, r.max_speedup)})"
                       for r in per_m.itertuples()],
        at_aim_shown=[f"{int(r.at_aim)} of {r.points} at {'level' if r.aim == 1 else text.ratio(r.aim)}"
                      if np.isfinite(r.aim) else "no aim" for r in per_m.itertuples()],
        pct_shown=[f"{text.pct(r.peer_pct_mma)} / {text.pct(r.own_pct_mma)}" for r in per_m.itertuples()])
    page.html("peers", html_table(shown, PEERS, caption=results.caption(
        f"medians per M over formats and shapes (a name's count: the points where it is the fastest); peers: "
        f"{', '.join(analysis.PEERS)}; floors at the measured bf16 peak and copy bandwidth")))
    compiled = sass.compiled_finding(table, results.view)
    page.bullets("peers", peer_findings(per_m) + ([compiled] if compiled else []))


def most_often(name: str, count: int, points: int) -> str:
    """'humming-w4a16 (4 of 6)', or the bare name where it is every point's."""
    return name if count == points else f"{name} ({count} of {points})"


def speedup_range(low: float, high: float) -> str:
    """'1.22-1.59x': three digits, so 1.46 does not read as the 1.5x aim."""
    return f"{text.sig(low, 3)}-{text.ratio(high, 3)}"


def peer_findings(per_m) -> list[str]:
    """What the comparison says: the decode Ms against their aim, the larger Ms against theirs,
    and, where the bf16 MMAs outweigh the weight read, why a weight-only kernel cannot simply
    read its way past cuBLAS."""
    lines = []
    decode = per_m[per_m["aim"] > 1]
    if len(decode):
        short = decode[decode["at_aim"] < decode["points"]]
        line = (f"Up to M = {int(decode['m'].max())} fp4lab's fastest kernel "
                f"({text.join(text.code(o) for o in decode['own'].unique())}) is "
                f"{speedup_range(decode['min_speedup'].min(), decode['max_speedup'].max())} as fast as the "
                f"fastest peer: {int(decode['at_aim'].sum())} of {int(decode['points'].sum())} points reach the "
                f"{text.ratio(decode['aim'].iloc[0])} aim")
        if len(short):
            line += "; short of it: " + text.join(
                f"{r.points - int(r.at_aim)} of {r.points} at M = {r.m} ("
                + (text.ratio(r.short_min, 3) if r.short_min == r.short_max else speedup_range(r.short_min, r.short_max))
                + ")" for r in short.itertuples())
        lines.append(line + ".")
    level = per_m[per_m["aim"] == 1]
    behind = level[level["at_aim"] < level["points"]]
    if len(behind):
        lines.append(f"Where the aim is to be level with the fastest peer, fp4lab's fastest kernel "
                     f"({text.join(text.code(o) for o in behind['own'].unique())}) runs at "
                     + text.join(f"{speedup_range(r.min_speedup, r.max_speedup)} its speed at M = {r.m}"
                                 for r in behind.itertuples())
                     + f": {int(behind['at_aim'].sum())} of {int(behind['points'].sum())} points level.")
    between = behind[~behind["mma_bound"]]
    for r in between.itertuples():
        lines.append(f"At M = {r.m} the bf16 MMA floor is {text.ratio(r.mma_over_read)} the FP4 read floor, and "
                     f"both floors are far below both kernels' times: the fastest peer ({text.code(r.peer)}) reaches "
                     f"{text.pct(r.peer_pct_mma)} of the measured bf16 peak, fp4lab's {text.code(r.own)} "
                     f"{text.pct(r.own_pct_mma)}: neither floor sets either time.")
    bound = per_m[per_m["mma_bound"]]
    if len(bound):
        first = bound.iloc[0]
        lines.append(
            f"From M = {int(first['m'])} a weight-only FP4 GEMM's bf16 MMAs (it decodes its weights, then runs "
            f"the same MMAs as cuBLAS) take {text.ratio(first['mma_over_read'])} its FP4 weight read even at the "
            f"measured bf16 peak: the bytes FP4 saves no longer set the time. The fastest peer there, "
            f"{text.code(first['peer'])}, runs them at {text.pct(first['peer_pct_mma'])} of that peak, fp4lab's "
            f"{text.code(first['own'])} at {text.pct(first['own_pct_mma'])}: to be level a kernel must hide its "
            "decode under MMAs at cuBLAS's share of the peak, or use FP4 tensor cores (sm_100) that take the "
            "codes as they are.")
    return lines


def _anatomy(page, results) -> None:
    table = analysis.anatomy(results)
    if not len(table):
        rows = results.view.run.read_table("anatomy")
        reason = rows["error"].dropna().iloc[0] if len(rows) and rows["error"].notna().any() else "not measured"
        page.prose("anatomy", f"No stage of the kernels was timed in this run "
                              f"({text.md(text.package_relative(reason))}).")
        return
    kernel = analysis.anatomy_kernel(table)
    mine = table[table["backend"] == kernel]
    # one kernel and one format in the figure (the formats differ by a few percent; every row is in the tables)
    shown = "nvfp4" if (mine["fmt"] == "nvfp4").any() else mine["fmt"].iloc[0]
    others = sorted(set(table["backend"]) - {kernel})
    page.figure("anatomy", figures.anatomy(mine[mine["fmt"] == shown]), results.caption(
        f"{kernel}, the faster kernel dissected, {shown.upper()}"
        + (f" ({text.join(others)} in its own table below)" if others else "")
        + "; each stage variant passed its own check (exact integer sums of what it read or decoded, "
          "row sums, or the gate)"))
    launch = table["launch_floor_us"].dropna()
    for name in [kernel, *others]:                     # one table per kernel: its own stages
        rows = table[table["backend"] == name].sort_values(["n", "k", "m", "fmt"])
        page.html("anatomy", html_table(rows.assign(shape=[f"{int(r.n)}x{int(r.k)}" for r in rows.itertuples()]),
                                        anatomy_columns(rows), caption=results.caption(
            f"{name}: each stage's median time per call; copy floor: the FP4 weights and bf16 activations at "
            "the measured copy bandwidth" + (f"; launch floor {text.us(launch.iloc[0])} for every row" if len(launch)
                                             else "") + paths_note(rows))))
    page.bullets("anatomy", anatomy_findings(mine) + other_kernel_lines(table, kernel))


def paths_note(table) -> str:
    """"; tiles moved by TMA at 8192x8192 M=1 (nvfp4, mxfp4), by cp.async in the other rows" and,
    for the CUDA kernel, how each row adds its split-K partials (the kernel config of each row, its
    preset: every path but the most common one named with its rows), or nothing when the run did
    not record them."""
    return (rows_note(table, "loads", "tiles moved ", lambda path: f"by {path}")
            + rows_note(table, "reduction", "", lambda path: path))


def rows_note(table, column: str, lead: str, phrase) -> str:
    """"; <lead><phrase(path)> at <rows>, ..., <phrase(most common)> in the other rows" for the
    values of `column` ("—" unknown), or "; <lead><phrase(path)> in every row"."""
    if column not in table:
        return ""
    known = table[table[column] != "—"]
    paths = known[column].value_counts()
    if not len(paths):
        return ""
    if len(paths) == 1:
        return f"; {lead}{phrase(paths.index[0])} in every row"
    named, rows_named = [], 0
    for path in paths.index[1:]:
        formats: dict[tuple[int, int, int], list[str]] = {}
        for r in known[known[column] == path].sort_values("fmt", ascending=False).itertuples():  # nvfp4 first
            formats.setdefault((int(r.n), int(r.k), int(r.m)), []).append(r.fmt)
        where = ", ".join(f"{n}x{k} M={m} ({', '.join(fmts)})" for (n, k, m), fmts in sorted(formats.items()))
        named.append(f"{phrase(path)} at {where}")
        rows_named += len(formats)
    sep = "; " if rows_named > 1 else ", "       # where commas already separate rows, semicolons part paths
    return f"; {lead}{sep.join(named)}{sep}{phrase(paths.index[0])} in the other rows"


def _counters(page, folders, results, reference=None) -> None:
    """Committed Nsight Compute profiles of the kernels (fp4lab's, a peer's), each labelled as its
    own measurement; the copy bandwidth measured on the profiles' GPU, by this run or else the run
    shown beside (a CPU page then states the reference page's threshold, not the spec sheet's)."""
    loaded = [kernel_counters.read_counters(folder) for folder in folders]
    measured = [(r.measured.bandwidth_tbps, "this run" if r is results else f"run {r.view.run_id}")
                for r in (results, reference) if r is not None and r.measured is not None
                and r.measured.bandwidth_tbps and r.view.device == loaded[0].device]
    bandwidth, measured_in = measured[0] if measured else (None, "")
    page.bullets("counters", kernel_counters.counters_findings(             # what they say, first
        loaded, bandwidth, measured_in))
    for profile in loaded:
        page.html("counters", html_table(kernel_counters.shown_rows(profile), COUNTERS, caption=profile.caption(
            f"{kernel_counters.kind_name(profile)}, each launch under Nsight Compute")))


def anatomy_columns(table) -> list[Col]:
    """ANATOMY without the stages these rows did not time (another kernel's, or a run from before
    the stream stage)."""
    return [c for c in ANATOMY if c.source not in analysis.ANATOMY_STAGES or table[c.source].notna().any()]


def anatomy_row(table):
    """The row the findings start from: the largest shape at the smallest M (NVFP4 first)."""
    biggest = table[(table["n"] * table["k"]) == (table["n"] * table["k"]).max()]
    return biggest.assign(mx=biggest["fmt"] != "nvfp4").sort_values(["m", "mx"]).iloc[0]


def anatomy_findings(table) -> list[str]:
    """Where one kernel's time goes, from `anatomy_row` and the larger Ms of its shape."""
    row = anatomy_row(table)
    biggest = table[(table["n"] == row["n"]) & (table["k"] == row["k"])]
    head = (f"On {row['n']}x{row['k']} at M={row['m']} ({text.md(row['fmt'])}) the loads-only variant takes "
            f"{text.us(row['load'])} against the full kernel's {text.us(row['full'])} "
            f"({text.pct(row['load_share'])}) and a copy floor of {text.us(row['copy_floor_us'])}: ")
    if row["load_share"] > 100:
        head += ("it is slower than the whole kernel, so its own check (a checksum of the bytes read) costs "
                 "more than the loads; the kernel is bound by the instructions it issues, not by moving the weights.")
    elif row["load"] > 1.5 * row["copy_floor_us"]:
        head += (f"even without decode or math the kernel streams its weights at "
                 f"{text.pct(100 * row['copy_floor_us'] / row['load'])} of the copy bandwidth, so the way it "
                 "loads (bytes in flight per SM, the instructions around each load) sets most of the time.")
    elif row["load_share"] >= 75:
        head += "the time goes to moving the weights, not to decoding them."
    else:
        head += "decoding and the math add time the loads do not hide."
    lines = [head]
    if pd.notna(row.get("mma")):
        lines.append(f"Stage by stage (each variant adds one to the one before): {stage_steps(row)}.")
    if pd.notna(row["stream"]):
        below = (" (faster than the stream: the stream is one plain launch, while the kernel's launches "
                 "may overlap the call before them)" if row["load"] < row["stream"] else "")
        lines.append(f"Read once as a stream (one plain launch, no tiles, nothing decoded) the same bytes take "
                     f"{text.us(row['stream'])}, {text.pct(100 * row['copy_floor_us'] / row['stream'])} of the "
                     f"copy bandwidth at this size. The loads-only variant is "
                     f"{text.ratio(row['load'] / row['stream'])} it{below}, the full kernel "
                     f"{text.ratio(row['full'] / row['stream'])}.")
    for other in biggest[(biggest["fmt"] == row["fmt"]) & (biggest["m"] > row["m"])].sort_values("m").itertuples():
        line = (f"At M={other.m} on the same shape the full kernel takes {text.us(other.full)} "
                f"({text.ratio(other.full / row['full'])} its M={row['m']} time for {other.m}x the tokens)")
        if pd.notna(getattr(other, "mma", None)):
            line += (f", against a copy floor of {text.us(other.copy_floor_us)}; stage by stage: "
                     f"{stage_steps(other._asdict())}.")
        else:
            line += (f", the loads only {text.us(other.load)}, decode without math {text.us(other.decode)}, "
                     f"against a copy floor of {text.us(other.copy_floor_us)}.")
        lines.append(line)
    if pd.notna(row.get("mma")):             # the nested kernel: every point where they do not nest
        unnested = unnested_points(table)
        if unnested:
            lines.append(f"At {', '.join(unnested)} a variant that leaves stages out is slower than the "
                         "full kernel: each variant is its own build, with its own registers and warps an "
                         "SM, so there its increments are not costs of the full kernel.")
    elif row["decode"] > row["full"]:
        lines.append(f"Decode without math ({text.us(row['decode'])}) is slower than the full kernel: "
                     "the variants change the pipeline, so the stages are not additive; read them as "
                     "bounds, not as parts of a sum.")
    return lines


def unnested_points(table) -> list[str]:
    """The points ("NxK M=m (fmt)") where a stage variant of the nested kernel takes longer than its
    full kernel (beyond 2%, the timer's spread)."""
    slower = table[list(analysis.NESTED_STAGES[:-1])].max(axis=1) > 1.02 * table["full"]
    return [f"{r.n}x{r.k} M={r.m} ({r.fmt})" for r in table[slower].sort_values(["n", "k", "m"]).itertuples()]


def stage_steps(row) -> str:
    """"the loads X, the decode +Y, the MMAs +Z, the split-K reduction +W (the full kernel): after
    the loads, the MMAs cost most" for a kernel whose variants nest (each adds one stage)."""
    names = {"decode": "the decode", "mma": "the MMAs", "full": "the split-K reduction"}
    steps = {names[stage]: value for stage, value in analysis.stage_increments(row).items()}
    largest = max(steps, key=steps.get)
    added = ", ".join(f"{name} {'+' if value >= 0 else '-'}{text.us(abs(value), 2)}" for name, value in steps.items())
    return (f"the loads {text.us(row['load'])}, {added} (the full kernel, {text.us(row['full'])}): "
            f"after the loads, {largest} {'cost' if largest.endswith('s') else 'costs'} most")


def other_kernel_lines(table, kernel: str) -> list[str]:
    """Each other dissected kernel at the point the findings start from, against `kernel`."""
    lines = []
    row = anatomy_row(table[table["backend"] == kernel])
    at = (table["fmt"] == row["fmt"]) & (table["n"] == row["n"]) & (table["k"] == row["k"]) & (table["m"] == row["m"])
    for other in table[at & (table["backend"] != kernel)].itertuples():
        lines.append(f"{text.code(other.backend)}, dissected at the same point, takes {text.us(other.full)} "
                     f"for its full kernel ({text.ratio(other.full / row['full'])} {text.code(kernel)}'s) and "
                     f"{text.us(other.load)} for its loads alone.")
    return lines


def _gpus(page, results) -> None:
    spread = analysis.gpu_spread(results)
    if not len(spread):
        page.prose("gpus", "This run measured no GPU, so there is no spread across GPUs to show.")
        return
    ranks = (results.view.info.get("sweep") or {}).get("ranks")
    how = "swept through torchrun, one rank per GPU" if ranks else "measured in the sweep's own process"
    if len(spread) == 1:
        row = spread.iloc[0]
        page.prose("gpus", f"One GPU measured: GPU {int(row['gpu_index'])} (PCI bus "
                           f"{text.md(row['pci_bus_id'] or 'unknown')}), {how}. On a box with several "
                           "GPUs this section sets each one's speed and clock against the others, so a "
                           "slow or throttling card stands out.")
        return
    page.html("gpus", html_table(spread, SPREAD, caption=results.caption(
        f"every GPU at the points they all measured ({how}); 1.00 = the box's median for that point")))
    page.bullets("gpus", spread_findings(spread))


def spread_findings(spread) -> list[str]:
    slowest = spread.loc[spread["median_vs_box"].idxmax()]
    fastest = spread.loc[spread["median_vs_box"].idxmin()]
    return [f"GPU {int(slowest['gpu_index'])} is the slowest: {text.ratio(slowest['median_vs_box'])} the box's "
            f"median time at decode M (worst point {text.ratio(slowest['slowest_vs_box'])}); GPU "
            f"{int(fastest['gpu_index'])} the fastest at {text.ratio(fastest['median_vs_box'])}."]


def _roofline(page, results) -> None:
    roofs = {source: (c.bandwidth_tbps, c.peak_tflops) for source, c in
             (("measured", results.measured), ("spec", results.spec)) if c is not None}
    page.html("roofline", html_table(analysis.ceilings_table(results), CEILINGS, caption=results.caption(
        "the ceilings every chapter divides by: measured in this run, before its points, beside the spec sheet")))
    if len(results.ok):
        page.figure("roofline", figures.roofline(results.ok, roofs), results.caption(
            "roofs in black: the ceilings measured in this run; in grey: the spec sheet's; one dash per math dtype"))


def _seed(page, results, reference, profile: str) -> None:
    from fp4lab.analysis import decode

    config = decode.DiagnosisConfig.from_profile(profile)
    for which in (results, reference):
        backend, loop = decode.seed_choice(which, config) if which is not None else (None, None)
        if backend:
            dtype = analysis.seed_math_dtype(which, backend)
            columns = seed_columns(dtype)
            fmt = f" ({loop['modelled_fmt']})" if loop and loop["modelled_fmt"] else ""
            at = f", {text.us(loop['modelled_us'])}{fmt} modelled from its GEMM times" if loop else ""
            page.html("seed", html_table(analysis.seed_table(which, backend), columns, caption=which.caption(
                f"{backend}: of the GEMM backends that ran every M of the sweep, the one whose loop of "
                f"expert GEMMs runs the {config.preset} layer fastest at B={config.decode_batch}{at} (a "
                f"decode-only kernel, whose table would stop at its largest M, is left out; chapter 04's "
                f"GEMM-loop model and decode power read it; the fastest layer path there may be a fused "
                f"MoE kernel); {seed_note(dtype)}")))
    page.html("seed", html_table(seed_sm120_table(), PUBLISHED, caption="Published: " + SEED_SOURCE))


def findings(results: analysis.GemmResults, reference: analysis.GemmResults | None) -> list[str]:
    numbers = analysis.headline(results)
    device = text.md(results.view.device)
    lines = [f"On {device}, {text.count(len(numbers['backends_ok']), 'backend')} ran correctly "
             f"({text.md(text.join(numbers['backends_ok']))}) and "
             f"{text.count(len(numbers['backends_unavailable']), 'backend')} could not run here "
             "(the table above gives each reason)."]
    if "best" in numbers:
        best, small = numbers["best"], numbers["smallest"]
        # the copy bandwidth this run measured first (the book's floors use it), the sheet's beside it;
        # a format names 4-bit weights only (a bf16 or fp8 row's format is its sweep slot's)
        shares = [f"{text.pct(small[f'pct_bandwidth_{source}'])} of {words}"
                  for source, words in (("measured", "the measured copy bandwidth"), ("spec", "the spec sheet's"))
                  if not text.is_missing(small[f"pct_bandwidth_{source}"])]
        fmt = f" {text.md(small['fmt'])}" if small.get("weight_dtype") == "fp4" else ""
        # a rate in bytes, not the fastest call: wider weights move more bytes in more time
        wider = ("" if small.get("weight_dtype") in analysis.FOUR_BIT else
                 f"; a rate, not the fastest call: its weights are {text.md(small['weight_dtype'])}, "
                 "more bytes than 4-bit ones (the fastest 4-bit call is below)")
        lines.append(f"At M={small['m']} the weights stream fastest, in bytes a second, through "
                     f"{text.md(small['backend'])} on {small['n']}x{small['k']}{fmt}: {text.sig(small['tbps'])} TB/s"
                     + (f" ({', '.join(shares)})" if shares else "") + wider + ".")
        # a device without a spec sheet entry (a CPU) has no spec peak: its share is not stated
        spec = ("" if text.is_missing(best["pct_peak_spec"]) else
                f"{text.pct(best['pct_peak_spec'])} of the spec {text.md(best['math_dtype'])} peak and ")
        lines.append(f"The fastest point is {text.md(best['backend'])} at M={best['m']} on {best['n']}x{best['k']}: "
                     f"{text.sig(best['tflops'], 4)} TFLOP/s, {spec}"
                     f"{text.pct(best['pct_peak_measured'])} of the measured {text.md(best['math_dtype'])} peak.")
    fastest = analysis.fastest_fp4(results)
    if len(fastest):
        small = fastest[fastest["m"] == fastest["m"].min()]
        best = small.loc[small["speedup_vs_bf16"].idxmax()]
        lines.append(f"4-bit weights at M={best['m']}: the best case is {text.md(best['backend'])} on "
                     f"{best['n']}x{best['k']} {text.md(best['fmt'])} at {text.us(best['us'])}, "
                     f"{text.as_fast(best['us'], best['bf16_us'])} cuBLAS bf16 ({text.us(best['bf16_us'])}); "
                     f"the FP4 read floor there is {text.us(best['floor_us'])}, so it reaches "
                     f"{text.pct(best['pct_of_floor'])} of it.")
    for dtype, how in numbers["raised"].items():
        lines.append(f"The measured {text.md(dtype)} peak was {text.md(how)}.")
    if numbers["failures"]:
        lines.append("Points that failed: " + text.md(", ".join(
            f"{backend} {status} x{count}" for (backend, status), count in numbers["failures"].items())) + ".")
    if reference is not None and "best" in analysis.headline(reference):
        ref = analysis.headline(reference)
        lines.append(f"In the run shown beside ({text.code(reference.view.run_id)}, "
                     f"{text.md(reference.view.device)}), the fastest point is "
                     f"{text.md(ref['best']['backend'])} at {text.sig(ref['best']['tflops'], 4)} TFLOP/s "
                     f"(M={ref['best']['m']}) and the weights stream fastest at M={ref['smallest']['m']} at "
                     f"{text.sig(ref['smallest']['tbps'])} TB/s.")
    return lines
