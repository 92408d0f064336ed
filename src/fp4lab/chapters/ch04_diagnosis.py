"""Chapter 04, the diagnosis: what bounds one MoE layer at decode on the GPU the run measured, by
how much, and what would change it. The sentences here are also the book's front page and the
share file (fp4lab.report), so the three never state one number two ways: every number comes
from fp4lab.analysis.decode.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from fp4lab import text
from fp4lab.analysis import decode
from fp4lab.analysis import gemm as gemm_analysis
from fp4lab.chapters.context import Context, open_context, parameters_block, resolve_parameters
from fp4lab.plots import diagnosis as figures
from fp4lab.plots.tables import Col, html_table

TITLE = "04 · Diagnosis: what holds FP4 MoE decode back on this GPU"
PATHS = [Col("path", "path"), Col("source", "measured by"), Col("weight_dtype", "weights read as"),
         Col("fmt", "FP4 format"),
         Col("layer_us", "layer time", "us"), Col("launch_floor_us", "launch floor", "us"),
         Col("memory_floor_us", "weight-read floor", "us"), Col("compute_floor_us", "compute floor", "us"),
         Col("note", "how")]
LEVERS = [Col("lever", "lever"), Col("gain", "gain (time now / with it)", "ratio"),
          Col("now_us", "now", "us"), Col("with_us", "with it", "us"), Col("per", "per"), Col("basis", "basis")]
GATE = [Col("backend", "backend"), Col("fmt", "format"), Col("points_failed", "points failed", "int"),
        Col("points_total", "of", "int"), Col("worst_rel_err", "worst relative error", "sig2"),
        Col("example_error", "the gate's message")]
PROJECTION = [Col("gpu_arch", "GPU"), Col("math_dtype", "math in"),
              Col("weight_floor_us", "weight-read floor", "us"), Col("math_floor_us", "math floor", "us"),
              Col("launch_floor_us", "launch floor", "us"), Col("floor_us", "layer floor", "us"),
              Col("bound", "bound by"), Col("measured_us", "measured here", "us"),
              Col("at_measured_ratio_us", "as far from its floor as here", "us")]
CALL_TIMES = [Col("timing", "timing"), Col("fmt", "FP4 format"), Col("us", "time a call", "us"),
              Col("how", "how it was timed")]
CONCURRENCY = [Col("batch", "B", "int"), Col("mean_m", "mean tokens per expert", "sig"),
               Col("busiest_m", "busiest expert", "sig"), Col("layer_us", "layer time", "us"),
               Col("us_per_token", "us per token per layer", "sig")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          preset=None, decode_batch=None, backend=None, routing=None, steps=None):
    context = open_context(TITLE, run_dir, reference_dir, profile, device, preset=preset,
                           decode_batch=decode_batch, backend=backend, routing=routing, steps=steps)
    config = decode.DiagnosisConfig.from_profile(context.profile, preset=preset, decode_batch=decode_batch,
                                                 backend=backend, routing=routing, steps=steps)
    resolve_parameters(context, preset=config.preset, decode_batch=config.decode_batch, backend=config.backend,
                       routing=config.routing, steps=config.steps)
    parameters_block(context)
    diagnosis = decode.diagnose(context.run, config)
    fill(context, diagnosis)
    return context.page


# -- the sentences (front page, chapter, share file) ------------------------------------------------

def layer_words(d: decode.Diagnosis) -> str:
    from fp4lab.moe import presets

    return f"one {text.md(presets.get(d.config.preset).name)} MoE layer at a decode batch of {d.config.decode_batch}"


def verdict_sentence(d: decode.Diagnosis) -> str:
    """The verdict in one sentence with its numbers."""
    if d.smoke:
        return smoke_sentence(d)
    if d.chosen is None or d.verdict is None:
        return f"No verdict for {text.md(d.view.device)}: " + text.md(d.chosen_reason) + "."
    path, v = d.chosen, d.verdict
    # far above its memory floor, the bold words must not read as "HBM is the limit"
    regime = "**kernel-limited above its memory floor**" if v["kernel_limited"] else f"**{v['verdict']}**"
    # short sentences: the box is read in seconds, so no clause hangs off another's colon
    head = (f"On {text.md(d.view.device)}, {layer_words(d)} is {regime}. Its fastest measured "
            f"path, {text.md(path['path'])}, takes {text.us(path['layer_us'])}")
    if v["verdict"] == "power-bound":
        p = d.decode_power
        return head + (f", and at the decode point the GPU draws {text.sig(p['avg_power_w'])} W, "
                       f"{text.pct(100 * p['fraction'])} of its {text.sig(p['power_limit_w'])} W limit.")
    stored = (str(path["fmt"]).upper() if path["weight_dtype"] == "fp4" and isinstance(path.get("fmt"), str)
              else path["weight_dtype"])
    meaning = {"memory": f"reading its {text.sig(path['weight_bytes'] / 1e9)} GB of active "
                         f"{text.md(stored)} weights once at the measured {text.sig(d.bandwidth_tbps)} TB/s",
               "launch": f"launching its {int(path['kernels'])} expert-GEMM kernels at the measured launch floor",
               "compute": f"the arithmetic at the {text.md(path['math_dtype'])} peak"}[v["floor"]]
    if v["kernel_limited"]:     # the largest floor, yet under KERNEL_GAP of the layer
        tail = (f"; its largest floor, {meaning}, takes {text.us(v['floor_us'])} "
                f"({text.pct(100 * v['explained'])} of that).")
    else:
        tail = (f"; {meaning} takes {text.us(v['floor_us'])}, {text.pct(100 * v['explained'])} of the layer, "
                "and the rest is kernel time above every floor.")
    if not v.get("reliable", True):
        tail += (" That floor is longer than the layer itself: the ceilings do not describe this device, "
                 "so the verdict is unreliable.")
    return head + tail + fix_clause(d) + power_cap_clause(d.chosen_power)


def fix_clause(d: decode.Diagnosis) -> str:
    """For a kernel-limited verdict, what would fix it, from the diagnosed call's own dissection
    where the run has one (`decode.math_alone`): the verdict box answers "what would fix it" too."""
    v = d.verdict
    if not v["kernel_limited"] or not v.get("reliable", True):
        return ""
    math = decode.math_alone(d.chosen_anatomy)
    if math is None:
        return (" The fix is in the kernel, not HBM: at that floor the layer would run "
                f"{text.ratio(1 / v['explained'])} faster.")
    # the gain is the glance's floor lever, so the box names only the fix (the seed's table below
    # stays above the fold)
    if math["math_bound"]:
        other = f" ({text.md(math['fmt'].upper())})" if math["fmt"] else ""
        # a ratio of two builds timed in one worker: its times are that worker's, not the table's
        return (" The fix is **fewer instructions per weight**, not faster loads: without the weight read"
                f"{other} its decode and MMAs take {text.ratio_to_one(math['math_to_load'])} as long as its loads "
                "alone.")
    return " The fix is **its decode and MMAs hidden under its loads**, which alone take longer."


def power_cap_clause(own: dict | None) -> str:
    """The sustained view the timer's burst hides, for the verdict: the diagnosed path replayed
    back to back at the power limit, and how much longer a call takes there."""
    if own is None or not own["capped"]:
        return ""
    which = (f"its {text.md((own['fmt'] or '').upper())} build" if own.get("other_format") else "it")
    slower = own["window_over_timed"]
    # both times, the build's own: the timed one may be another format's than the verdict's
    # the sustained call beside the timer's burst, which the verdict's own time is
    # the window's mean may pass the limit: the board holds it on a longer average
    return (f" Back to back {which} is also **power-capped** ({text.sig(own['avg_power_w'])} W, "
            f"limit {text.sig(own['power_limit_w'])} W) at {text.us(own['window_us_per_call'])} a call, "
            f"{text.pct(100 * abs(slower))} {'over' if slower >= 0 else 'under'} the timed "
            f"{text.us(own['timed_us'])}.")


def _table_time(path: dict) -> str:
    """The path's time in the table of methods, with its samples' 20th-80th percentiles where it is
    one timed call's median: a second process's timing of the call may land anywhere in them."""
    low, high = path.get("layer_p20_us"), path.get("layer_p80_us")
    if text.is_missing(low) or text.is_missing(high):
        return f"{text.us(path['layer_us'])} in the table of methods"
    return (f"the table of methods' median is {text.us(path['layer_us'])}, its samples' "
            f"{text.percentile_spread(low, high)}")


def kernel_time_sentence(d: decode.Diagnosis) -> str | None:
    """What a kernel-limited verdict means: the time above the memory floor is the kernel's own;
    where the run dissected the diagnosed call (chapter 03), what that time is made of."""
    v, path = d.verdict, d.chosen
    if d.smoke or v is None or path is None or not v["kernel_limited"]:
        return None
    head = (f"Above its weight-read floor, {text.us(path['layer_us'] - v['floor_us'])} "
            f"({text.pct(100 * (1 - v['explained']))}) of the layer is the kernel's own time, not HBM")
    a = d.chosen_anatomy
    if a is None:
        return (head + f": at its weight-read floor the layer would run {text.ratio(1 / v['explained'])} faster "
                "(what such time is made of: chapter 01, the anatomy of fp4lab's own kernels and the hardware "
                "counters of the kernels profiled).")
    # the builds' increments are what the loads did not hide, not the decode's and MMAs' whole work
    # two timings of one call in two processes: the dissection's own whole, so its parts add up
    # one frame for the dissection's numbers: its own worker's whole and parts, not a second "above"
    dissected = (f". Where that time goes: the same call, dissected in a worker process of its own (chapter "
                 f"03), took {text.us(a['full'])} there ({_table_time(path)}), of "
                 f"which its loads alone take {text.us(a['load'])} (the weights at {text.pct(a['load_rate_pct'])} "
                 f"of the copy bandwidth: {text.us(a['load'] - a['read_floor_us'])} over the floor), and the "
                 f"decode adds {text.signed_us(a['decode_added_us'])} and the MMAs "
                 f"{text.signed_us(a['mma_added_us'])} that the loads do not hide")
    math = decode.math_alone(a)
    if math is None:
        return (head + dissected + ". Wholly hidden under the loads they would take the layer toward its "
                "loads-only time, if they alone are shorter (this run did not time them without the weights' "
                "read).")
    if math["fmt"] is not None:      # only the same call in the other format was timed without its read
        fmt = text.md(math["fmt"].upper())
        return (head + dissected + f". Timed without the weights' read ({fmt} weights only), the decode and "
                f"MMAs alone take {text.us(math['compute_us'])}, {text.ratio_to_one(math['math_to_load'])} the {fmt} "
                f"loads alone ({text.us(math['load_us'])})"
                + (": even wholly hidden under the loads the call could not go much below its math."
                   if math["math_bound"] else
                   ": hidden under the loads, the call would take about its loads-only time."))
    alone = (f". Without the weights' read they alone take {text.us(math['compute_us'])}, "
             f"{text.ratio_to_one(math['math_to_load'])} the loads")
    if math["math_bound"]:
        return (head + dissected + alone + f": even wholly hidden, the layer could not go below "
                f"{text.us(a['overlapped_us'])} in that worker.")
    return (head + dissected + alone + f": hidden under the loads, the layer would take about the loads' "
            f"{text.us(math['load_us'])}.")


def smoke_sentence(d: decode.Diagnosis) -> str:
    gemm = len(d.gemm.ok) if d.gemm else 0
    moe = len(d.moe.ok) if d.moe else 0
    return (f"This is a CPU smoke run on {text.md(d.view.device)}: it checked the pipeline ({gemm} GEMM points "
            f"and {moe} MoE points passed the correctness gate and were timed, and every chapter rendered). "
            "It measures no GPU, so it issues no verdict.")


def load_sentence(d: decode.Diagnosis) -> str:
    load = d.load
    return (f"At B={d.config.decode_batch} ({text.md(d.config.routing)} routing) each of "
            f"{text.sig(load['active_experts'])} active experts gets {text.sig(load['mean_m'])} tokens on "
            f"average and the busiest {text.sig(load['busiest_m'])}: every expert GEMM is a decode-sized "
            "GEMM, a weight read.")


def own_power_sentence(own: dict) -> str:
    """The diagnosed path's own energy window: its power against the limit, the clock, and the
    time a call took there against the timer's burst."""
    reasons = ", ".join(text.md(r) for r in own["throttle_reasons"]) or "none read"
    slower = own["window_over_timed"]
    which = (f"{text.md(own['path'])} (with {text.md((own['fmt'] or '').upper())} weights: the run has no window "
             "of the diagnosed format)" if own.get("other_format") else text.md(own["path"]))
    return (f"Power {'caps' if own['capped'] else 'does not cap'} the diagnosed path: replayed back to back"
            f"{decode.window_length(own)}, "
            f"{which} drew {text.sig(own['avg_power_w'])} W on average over the window, "
            f"{text.pct(100 * own['fraction'])} of the {text.sig(own['power_limit_w'])} W limit (enforced "
            f"on ~1 s averages: chapter 02), with the SM clock at {text.sig(own['window_sm_clock_mhz'])} MHz "
            f"(clock-event reasons: {reasons}); a call took {text.us(own['window_us_per_call'])} there, "
            f"{text.pct(100 * abs(slower))} {'over' if slower >= 0 else 'under'} the timer's "
            f"{text.us(own['timed_us'])}, whose samples are a burst at the clock of the moment"
            + clock_share(own) + ".")


def clock_share(own: dict) -> str:
    """How much of a longer call back to back the SM clock's fall can explain: at most its own
    ratio (loads do not slow with the SM clock); the rest these rows do not place."""
    stretch, slower = own.get("clock_stretch"), own["window_over_timed"]
    if stretch is None or slower <= 0 or stretch <= 0:
        return ""
    head = (f" (the SM clock read before and after this one averaged {text.sig(own['timed_sm_clock_mhz'])} MHz): "
            "the clock's fall ")
    if stretch >= slower:
        return head + f"alone could account for it (at most {text.pct(100 * stretch)})"
    return (head + f"stretches a call by at most {text.pct(100 * stretch)}, so these rows do not say "
            "where the rest goes")


def power_sentence(d: decode.Diagnosis) -> str | None:
    """The diagnosed path's own energy window where the run has one; else the decode GEMMs' power
    against the limit, and whether the diagnosed path's own timing saw the SM clock fall."""
    p, clock = d.decode_power, d.chosen_clock
    if d.verdict and d.verdict["verdict"] == "power-bound":
        return None
    if d.chosen_power is not None:
        return own_power_sentence(d.chosen_power)
    gemms = None if not p else (
        f"at the decode point (M = {text.join(p['m_values'])} on the expert shapes) {text.md(p['backend'])}'s "
        f"GEMMs drew {text.sig(p['avg_power_w'])} W, the median of {p['points']} energy windows, "
        f"{text.pct(100 * p['fraction'])} of the {text.sig(p['power_limit_w'])} W limit")
    if clock is None:
        return None if gemms is None else (
            f"Power does not limit decode: {gemms} (single expert GEMMs at decode sizes: the MoE sweep's layer "
            "kernels carry no energy window).")
    fell = (f"the diagnosed path, {text.md(clock['path'])}, read the SM clock at {text.sig(clock['sm_clock_mhz'])} MHz "
            f"in its own timing, {text.pct(100 * clock['fraction'])} of the GPU's {text.sig(clock['max_sm_clock_mhz'])} MHz "
            "maximum: the clock fell while it ran. Its layer kernels carry no energy window, so whether the power "
            "limit lowered it is not measured here; a kernel that streams the weights near the copy bandwidth is "
            "not the single expert GEMM whose power was measured")
    if gemms is None:
        return f"The clock may limit decode: {fell}."
    return f"Power does not limit the decode GEMMs: {gemms}. But {fell}."


def fp4_sentence(d: decode.Diagnosis) -> str | None:
    """The FP4 lever as measured: the fastest FP4-weight path against its floor and the bf16/fp8 paths."""
    fp4 = d.fp4
    if not fp4 or d.smoke:
        return None
    floor = fp4["floor_us"]
    line = (f"FP4 weights at B={d.config.decode_batch}: reading the active experts' {text.md(fp4['fmt'].upper())} "
            f"weights once, their weight-read floor, takes {text.us(floor)}")
    best = fp4.get("best")
    if best is None:
        return line + "; no FP4-weight path ran correctly here."
    line += (f"; the fastest FP4-weight path measured, {text.md(best['path'])}, takes {text.us(best['layer_us'])}, "
             f"{text.ratio(best['layer_us'] / floor)} that floor")
    for dtype in ("bf16", "fp8"):
        other = fp4.get(dtype)
        if other is not None:
            line += f"; it is {text.as_fast(best['layer_us'], other['layer_us'])} the best {dtype} path ({text.md(other['path'])}, {text.us(other['layer_us'])})"
    native = (d.view.info.get("provenance") or {}).get("device", {}).get("native_fp4")
    if isinstance(native, list) and not native:
        line += f". {text.md(d.view.device)} has no FP4 tensor cores: FP4 runs there as weight-only kernels"
    return line + "."


def lever_lines(d: decode.Diagnosis, top: int | None = None, from_path: bool | None = None) -> list[str]:
    """Levers with a gain, largest first; `from_path` True: only those on the diagnosed path itself,
    False: only those against another baseline."""
    levers = d.levers[d.levers["gain"] > 1 + decode.SAME_SPEED_WITHIN]
    if from_path is not None:
        levers = levers[levers["from_path"] == from_path]
    rows = levers.head(top) if top else levers
    return [f"{text.md(r.lever)}: {text.ratio(r.gain)} ({text.us(r.now_us)} → {text.us(r.with_us)} a {r.per}; "
            f"{text.md(r.basis)})" for r in rows.itertuples(index=False)]


def path_levers_header(d: decode.Diagnosis, shown_of: tuple[int, int] | None = None) -> str:
    """What the levers on the diagnosed path are: some replace its kernel or its batch, so they
    decode more tokens a second than the path at its batch (a larger batch's call takes longer),
    not the path made faster (the glance and the findings). `shown_of`: (shown, all) where only
    some are listed (the glance's column, one line: its gains show the order)."""
    head = f"more tokens/s than {d.chosen['path']} at B={d.config.decode_batch}"
    return head + (f" ({shown_of[0]} of {shown_of[1]})" if shown_of else ", largest first")


def findings(d: decode.Diagnosis) -> list[str]:
    lines = [verdict_sentence(d)]
    if d.smoke:
        return lines + [line for line in gap_lines(d)]
    lines += [line for line in (kernel_time_sentence(d), load_sentence(d)) if line]
    lines += [line for line in (power_sentence(d), fp4_sentence(d)) if line]
    if d.chosen is not None:
        lines.append(f"The diagnosed path is {text.md(d.chosen['path'])} because {text.md(d.chosen_reason)}.")
    # one lever a line (run into one sentence they made a paragraph of 130 words); the path's own
    # first, as on the front page, then what it gains over other baselines
    # a lever on the path implies a diagnosed path (decode.levers)
    on_path_lead = text.upper_first(text.md(path_levers_header(d))) + ":" if d.chosen is not None else ""
    for lead, on_path in ((on_path_lead, True), ("Against other baselines:", False)):
        levers = lever_lines(d, from_path=on_path)
        if levers:
            lines.append(lead + "".join(f"\n  - {line}" for line in levers))
    return lines + gap_lines(d)


def gap_lines(d: decode.Diagnosis) -> list[str]:
    lines = [f"This run has no rows from {text.md(source)}: what depends on it is left out." for source in d.missing]
    if len(d.gate):
        lines.append(f"{text.count(len(d.gate), 'backend/format pair')} failed the correctness gate and are "
                     "excluded: " + text.md(", ".join(f"{r.backend} ({r.fmt})" for r in d.gate.itertuples())) + ".")
    return lines


# -- the page --------------------------------------------------------------------------------------

def fill(context: Context, d: decode.Diagnosis) -> None:
    page = context.page
    page.html("verdict", verdict_box(d))
    if not d.smoke:
        page.html("verdict", glance_html(d))
    if len(d.gate):
        page.html("gate", html_table(d.gate, GATE, caption="these points are excluded from every number below"))
    else:
        total = d.gemm.frame["backend"].nunique() if d.gemm is not None else 0
        ran = len(d.gemm.ok["backend"].unique()) if d.gemm is not None else 0
        errors = gemm_analysis.failure_counts(d.gemm) if d.gemm is not None else {}
        stopped = text.join([f"{count} {text.md(backend)} points with {text.md(status)}"
                             for (backend, status), count in errors.items()])
        others = f" Stopped before reaching it: {stopped} (chapter 01 says why)." if errors else ""
        page.prose("gate", f"No point failed the correctness gate ({ran} of {total} backends ran here).{others}")
    if d.smoke:
        elsewhere(page, d)         # spec sheets and rules only: the same on any machine
        page.bullets("findings", findings(d))
        return
    if len(d.seed):
        page.prose("seed", seed_sentence(d))
    if d.chosen is not None:
        page.figure("breakdown", figures.layer_against_floors(d.chosen, d.fp4["floor_us"] if d.fp4 else None),
                    d.view.caption(f"{d.config.preset}, B={d.config.decode_batch}; floors from the run's measured ceilings"))
        page.prose("breakdown", load_sentence(d))
    if len(d.call_times) > 1:
        page.html("breakdown", html_table(d.call_times, CALL_TIMES, caption=d.view.caption(
            f"every time this run measured for one {d.chosen['path']} call at B={int(d.chosen['batch'])}, "
            "fastest first: the verdict and the levers read the layer table; the dissecting worker's parts "
            "(chapter 03) add up to its own whole; back to back, at the power limit, a call takes longer "
            "(chapter 02)")))
    if len(d.paths):
        drawn = min(len(d.paths), figures.PATHS_DRAWN)
        which = ("every path" if drawn == len(d.paths)
                 else f"the {drawn} fastest of {len(d.paths)} paths (all in the table)")
        page.figure("paths", figures.paths(d.paths), d.view.caption(
            f"{which} at decode; bars: layer time, ticks: its weight-read floor"))
        page.html("paths", html_table(d.paths, PATHS, caption=d.view.caption(
            "launch floor: the path's expert-GEMM launches (two for a fused, grouped or padded path, two an "
            "active expert for a loop) at the measured launch time, a lower bound: routing and glue kernels are "
            "not counted; weight-read floor: its weights' bytes at the measured copy bandwidth; compute floor: "
            "its FLOPs at the measured peak of its math dtype")))
    page.bullets("power", [line for line in (power_sentence(d), fp4_sentence(d)) if line])
    if len(d.levers):
        page.html("levers", html_table(d.levers, LEVERS, caption=d.view.caption("largest gain first")))
    if len(d.concurrency) > 1:
        page.figure("concurrency", figures.concurrency(d.concurrency, d.config.decode_batch),
                    d.view.caption(f"{d.chosen['path']} as the MoE sweep measured it at each batch"
                                   if d.concurrency_basis == decode.MEASURED_BATCHES else
                                   f"{d.seed_backend} GEMM times, tokens per expert from the routing model"))
    elsewhere(page, d)
    if context.reference is not None and context.reference.run.has_table("gemm"):
        reference = decode.diagnose(context.reference.run, d.config)
        page.prose("reference", f"The run shown beside, {text.code(reference.view.run_id)}: " + verdict_sentence(reference))
    page.bullets("findings", findings(d))


def seed_sentence(d: decode.Diagnosis) -> str:
    """The seed's table in one sentence: the table itself is on the front page and in chapter 01
    (one table, not three copies of it)."""
    regimes = gemm_analysis.seed_regimes(d.seed)
    peak = f"{dtype} peak" if (dtype := gemm_analysis.seed_math_dtype(d.gemm, d.seed_backend)) else "math peak"
    parts = []
    if regimes["memory_until"] is not None:
        parts.append(f"up to M = {regimes['memory_until']} its GEMMs are bound by launches and memory, "
                     f"at most {text.pct(regimes['memory_best_pct'])} of the measured {peak}")
    if regimes["compute_from"] is not None:
        parts.append(f"from M = {regimes['compute_from']} the compute floor is the largest at some shapes, "
                     f"and it reaches at most {text.pct(regimes['compute_best_pct'])} of that peak "
                     f"(M = {regimes['compute_best_m']})")
    return (f"The seed's table for this GPU, {text.md(d.seed_backend)} ({seed_why(d.seed_loop)}), is on the "
            f"front page and in chapter 01: " + "; ".join(parts) + ".")


def seed_why(loop: dict | None) -> str:
    """Why the seed's table is this backend's: its modelled loop of expert GEMMs, the fastest of
    the backends that ran every M, and the MoE sweep's own timing of that loop where it has one
    (the one the paths table shows)."""
    if loop is None:
        return "its GEMM-sweep times model a loop of expert GEMMs fastest at decode"
    fmt = f" ({loop['modelled_fmt']})" if loop["modelled_fmt"] else ""
    why = (f"its GEMM-sweep times model a loop of expert GEMMs at {text.us(loop['modelled_us'])}{fmt}, the "
           "fastest of the backends that ran every M")
    if loop["measured_us"] is not None:
        why += (f"; the MoE sweep timed that loop itself, launches between its GEMMs included, at "
                f"{text.us(loop['measured_us'])} ({loop['measured_fmt']})")
        # the paths table lists the loop in every format the sweep timed it in
        why += ("; the paths below show it" if loop["shown_fmt"] == loop["measured_fmt"] else
                f", and at {text.us(loop['shown_us'])} in {loop['shown_fmt']}; the paths below show both")
    return why


def elsewhere(page, d: decode.Diagnosis) -> None:
    """The same layer on the GPUs the book's users run: projected floors, the FP4 MoE tiles'
    shared-memory fit, and which backend runs where."""
    from fp4lab.analysis import other_gpus
    from fp4lab.plots.tables import frame_columns

    projected = other_gpus.projected(d)
    check = projected["floor_over_measured"].dropna()
    caption = (f"{projected['label'].iloc[0]}; {projected['fmt'].iloc[0]} weights, B={d.config.decode_batch}; "
               f"floors from each GPU's spec sheet (the paths table above divides by this run's measured "
               f"ceilings); launch floor: {int(projected['kernels'].iloc[0])} kernels (every kernel of a grouped "
               f"FP4 MoE layer: routing, activation quantize, two grouped GEMMs, SiLU, finalize; the paths table "
               f"counts the expert GEMMs only) x {text.us(projected['launch_us'].iloc[0])} "
               f"({projected['launch_source'].iloc[0]})")
    # the GPU and its arch in one column: ten columns overflowed the page's width
    shown = projected.assign(gpu_arch=projected["name"] + " (" + projected["arch"] + ")")
    columns = PROJECTION
    if len(check):   # the header names the ratio it applies ("as far from its floor as here" wrapped to 4 lines)
        columns = [dataclasses.replace(c, header=f"at {text.ratio(1 / check.iloc[0], 3)} its spec floor, as here")
                   if c.source == "at_measured_ratio_us" else c for c in PROJECTION]
    page.html("elsewhere", html_table(shown, columns, caption=caption))
    if len(check):
        measured = projected[projected["measured_us"].notna()].iloc[0]
        v = d.verdict or {}
        measured_floor = (f"; the verdict's floor uses the bandwidth this run measured instead, "
                          f"{text.sig(d.bandwidth_tbps)} TB/s: {text.us(v['floor_us'])}, "
                          f"{text.pct(100 * v['explained'])}" if v.get("floor") == "memory" else "")
        page.prose("elsewhere", f"Every GPU in this table is projected from its spec sheet, so that they compare. "
                                f"On {text.md(d.view.device)} the sheet's {text.sig(measured['bandwidth_tbps'])} TB/s "
                                f"give a floor of {text.us(measured['floor_us'])} against "
                                f"{text.us(measured['measured_us'])} measured ({text.md(measured['measured_method'])}), "
                                f"{text.pct(100 * check.iloc[0])}{measured_floor}. The last column assumes the other "
                                "GPUs' kernels sit as far from theirs: an order of magnitude, not a prediction.")
    smem = other_gpus.smem_fit()
    page.html("elsewhere", html_table(smem, frame_columns(smem), caption=(
        "FlashInfer's CUTLASS FP4 MoE tiles (M x N x K): the shared memory each needs at the stages it is "
        "built with, against each GPU's per-block limit from the spec sheet (fp4lab.tiles; no measurement)")))
    matrix = other_gpus.where_matrix()
    page.html("elsewhere", "<details><summary>Which backend and MoE method runs on which GPU</summary>"
              + html_table(matrix, frame_columns(matrix), caption="by each backend's capability rule "
                           "(fp4lab.where); 'runs' still needs its package installed") + "</details>")


def verdict_box(d: decode.Diagnosis) -> str:
    """The verdict as the first thing on the page (and on the front page)."""
    from fp4lab.chapters.page import note_html

    span = d.view.measured_span                # rows may have been added to the run days later
    title = ("CPU smoke run: no GPU verdict" if d.smoke else
             f"Verdict for {d.view.device}" + (f", measured {span}" if span else ""))
    return note_html(verdict_sentence(d), "smoke" if d.smoke else "note", title, markdown=True)


GLANCE_LEVERS = 3      # the levers the verdict shows under its numbers: the largest, and its own floor's


def glance_html(d: decode.Diagnosis) -> str:
    """Under the verdict box, what a reader takes away in 30 seconds besides the verdict's own
    numbers: tokens per expert, power against the limit, FP4 against bf16 and fp8, and the
    largest levers (every value from the diagnosis, none computed here)."""
    from fp4lab.plots.tables import html_table

    # the decode batch leads: every fact on the line is at it (a lever below may be at another)
    facts = {f"At B={d.config.decode_batch}":
             f"{text.sig(d.load['mean_m'])} tokens per expert ({text.sig(d.load['busiest_m'])} busiest)"}
    # the diagnosed layer's own window before the decode GEMMs'; a capped one the verdict states
    if d.chosen_power and not d.chosen_power["capped"]:
        p = d.chosen_power
        fmt = f", {p['fmt'].upper()}" if p.get("other_format") and p.get("fmt") else ""
        facts[f"power of {p['path']}{fmt} replayed"] = (
            f"{text.sig(p['avg_power_w'])} W of {text.sig(p['power_limit_w'])} W ({text.pct(100 * p['fraction'])}), "
            f"SM clock {text.sig(p['window_sm_clock_mhz'])} MHz")
    elif d.chosen_power is None and d.decode_power:
        p = d.decode_power
        facts[f"power at decode ({p['backend']} GEMMs, M = {text.join(p['m_values'])})"] = (
            f"{text.sig(p['avg_power_w'])} W of {text.sig(p['power_limit_w'])} W ({text.pct(100 * p['fraction'])})")
    best = (d.fp4 or {}).get("best")
    others = [(dtype, d.fp4[dtype]) for dtype in ("bf16", "fp8") if best is not None and d.fp4.get(dtype)]
    if others:
        # a call at the decode batch: a lever below, in tokens/s at another batch, may favour
        # another dtype (fp8 at 2048), so the unit is named where the two could be read as one
        facts[f"best FP4 vs {' / '.join(dtype for dtype, _ in others)} call"] = (
            " / ".join(text.as_fast(best["layer_us"], other["layer_us"]).removesuffix(" as fast as")
                       for _, other in others) + " as fast")
    numbers = ('<p class="fp4lab-facts" style="margin:0.4em 0;font-size:0.9em">'
               + " · ".join(f"<b>{text.html(name)}</b>: {text.html(value)}" for name, value in facts.items()) + "</p>")
    # what would make the diagnosed path faster; only without such a lever, the other baselines'
    levers = d.levers[d.levers["gain"] > 1 + decode.SAME_SPEED_WITHIN]
    on_path = levers[levers["from_path"].astype(bool)]
    path_only = d.chosen is not None and len(on_path) > 0
    if path_only:
        levers = on_path
    ranked = levers.sort_values("gain", ascending=False, kind="stable")
    # the verdict's own lever (the path at its floor) is shown even when others are larger: it
    # takes the last row (the seed's table stays above the fold)
    own = ranked[ranked["from_path"].astype(bool) & (ranked["kind"] == "bound")]
    levers = ranked.head(GLANCE_LEVERS)
    if len(own) and own.index[0] not in levers.index:
        levers = pd.concat([levers.head(GLANCE_LEVERS - 1), own.head(1)])
    shown_of = (len(levers), len(ranked)) if len(levers) < len(ranked) else None   # the rest: chapter 04's
    if path_only:
        header = path_levers_header(d, shown_of)
    else:
        header = "largest levers" + (f" ({shown_of[0]} of {shown_of[1]})" if shown_of else "")
    # a token's time or a call's: the batch and EP levers trade a longer call for more tokens
    # (an EP lever's words say what it leaves out: "all-to-alls not measured: worth it under ...")
    levers = levers.assign(change=[f"{text.us_change(r.now_us, r.with_us)} a {r.per} ({r.kind})"
                                   for r in levers.itertuples()])
    lever_table = html_table(levers, [Col("lever", header),
                                      Col("gain", "gain", "ratio"), Col("change", "now → with it (basis)")],
                             empty="No lever with a measured gain.")
    return f'<div class="fp4lab-glance">{numbers}{lever_table}</div>'
