"""Chapter 03, MoE expert scatter: how routing scatters a decode batch over the experts (mean
and busiest expert), what each MoE method takes for one layer at those loads, and how well a
model built from one expert's dense GEMM curve predicts it; other model presets swept into the
same run are tabled beside it at the same decode batch.

On a GPU the chapter measures the real preset; on a CPU a scaled-down stand-in (its rows say
`scaled`; its times say nothing about the model). A run is shown as measured, whatever machine
renders it. The layer times at the decode batch are the ones chapter 04 diagnoses (one function,
fp4lab.analysis.moe.layer_times, computes both).
"""

from __future__ import annotations

from fp4lab import params, profiles, text
from fp4lab.analysis import moe as analysis
from fp4lab.backends.moe import OWN_LAYER_METHODS
from fp4lab.chapters.context import Context, open_context, parameters_block, resolve_parameters
from fp4lab.moe import layer_model, presets
from fp4lab.plots import moe as figures
from fp4lab.plots.tables import Col, html_table
from fp4lab.sweep.config import MoeSweep

TITLE = "03 · MoE expert scatter: tokens per expert and what they cost"
STATS = [Col("batch", "B (tokens a step over all GPUs)", "int"), Col("ep", "EP degree", "int"),
         Col("mean_tokens_per_expert", "mean tokens per expert", "sig"),
         Col("mean_max_tokens_per_expert", "busiest expert (mean over steps)", "sig"),
         Col("busiest_over_mean", "busiest / mean", "ratio"),
         Col("mean_idle_experts", "idle experts per step", "sig"),
         Col("mean_max_tokens_per_rank", "busiest rank's (token, expert) pairs", "sig"),
         Col("rank_max_over_mean", "busiest rank / mean rank", "ratio")]
LAYERS = [Col("method", "method"), Col("fmt", "weights format"), Col("weight_dtype", "weights read as"),
          Col("layer_us", "layer time", "us"), Col("speedup_vs_loop", "speed-up vs loop of bf16 GEMMs", "ratio"),
          Col("read_floor_us", "its weight-read floor", "us"), Col("pct_of_floor", "% of that floor reached", "pct")]
SPREAD = [Col("method", "method"), Col("fmt", "weights format"), Col("ep", "EP degree", "int"),
          Col("tokens_per_step", "tokens a step (all GPUs)", "int"),
          Col("layer_us", "busiest rank's layer time", "us"), Col("us_per_token", "GPU time per token", "us"),
          Col("alone_us_per_token", "alone on one GPU, per token", "us"),
          Col("gain", "gain over the same method alone", "ratio")]
UNAVAILABLE = [Col("method", "method"), Col("status", "status"), Col("error", "why")]
ERRORS = [Col("method", "method"), Col("mean_abs_error_pct", "mean |error| (%)", "sig2"), Col("points", "points", "int")]
NEEDED = [Col("ep", "EP degree", "int"), Col("batch_needed", "smallest B reaching the target", "int"),
          Col("best_utilization", "best predicted utilization", "share")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          preset=None, routing=None, batch_sizes=None, ep_degrees=None, fmts=None, methods=None,
          steps=None, repeats=None, target_utilization=None, decode_batch=None, measure=None):
    knobs = dict(preset=preset, routing=routing, batch_sizes=batch_sizes, ep_degrees=ep_degrees,
                 fmts=fmts, methods=methods, steps=steps, repeats=repeats,
                 target_utilization=target_utilization, decode_batch=decode_batch, measure=measure)
    context = open_context(TITLE, run_dir, reference_dir, profile, device, **knobs)
    section = profiles.section(context.profile, "moe")
    measure = params.check_bool("measure", section["measure"] if measure is None else measure)
    target = params.check_float("target_utilization", section["target_utilization"]
                                if target_utilization is None else target_utilization, 0, 1, strict_minimum=True)
    decode_batch = params.check_int("decode_batch", profiles.section(context.profile, "diagnosis")["decode_batch"]
                                    if decode_batch is None else decode_batch)
    config = MoeSweep.from_profile(
        context.profile, context.device, preset=preset, routing=routing, batch_sizes=batch_sizes,
        ep_degrees=ep_degrees, fmts=fmts, methods=methods, steps=steps,
        timer={"repeats": repeats} if repeats is not None else None)
    resolve_parameters(context, preset=config.preset, routing=config.routing, batch_sizes=config.batch_sizes,
                       ep_degrees=config.ep_degrees, fmts=config.fmts, methods=config.methods,
                       steps=config.steps, repeats=config.timer.repeats, target_utilization=target,
                       decode_batch=decode_batch, measure=measure)
    if measure and context.measures_here:
        from fp4lab.sweep.moe import run_sweep

        context.parameters.append(("points measured now", run_sweep(config, context.run,
                                                                    command="notebook 03_moe_expert_scatter")))
    results = analysis.moe_results(context.run, config.preset)
    later = sorted(set(results.frame["batch"].dropna().astype(int)) - set(config.batch_sizes))
    if later:
        # a later `fp4lab moe-sweep` may add batches (the reference run's 4096): the tables show them
        context.parameters.append(("batches the run also holds", ", ".join(map(str, later))))
    parameters_block(context)
    fill(context, config, results, target, decode_batch)
    return context.page


def fill(context: Context, config: MoeSweep, results: analysis.MoeResults, target: float,
         decode_batch: int) -> None:
    page = context.page
    model = presets.get(config.preset)
    table, loads = analysis.routing_table(model, config.batch_sizes, config.routing, config.ep_degrees,
                                          config.steps, config.seed)
    routing_note = f"{model.name}, E={model.experts}, top-{model.top_k}, {config.routing} routing, {config.steps} steps"
    page.figure("loads", figures.loads(loads, table), f"routing model (no measurement): {routing_note}")
    page.html("loads", html_table(table, STATS, caption=(
        f"routing model: {routing_note}; an EP row splits the same B tokens over its ranks (the expert-"
        "parallel measurement further down gives each GPU its own B instead)")))
    if not len(results.frame):
        page.note("measured", "This run holds no MoE rows for this preset (measure is off, or the sweep "
                              "did not run).", "warning")
        page.bullets("findings", routing_findings(model, decode_batch, config))
        return
    layers = analysis.layer_times_by_batch(results, config.routing)
    if len(layers):
        page.figure("measured", figures.layer_time_by_batch(layers), results.caption(
            "one MoE layer's routed experts on one device (EP 1), every correct method"))
    at = decorated(results, decode_batch, config.routing)
    if len(at):
        page.html("measured", html_table(at, LAYERS, caption=layer_caption(
            results, at, f"at B={int(at['batch'].iloc[0])}, the measured batch nearest the decode batch "
                         f"{decode_batch}")))
    failed = results.frame[results.frame["status"] != "ok"].drop_duplicates("method")
    if len(failed):
        page.html("measured", html_table(failed, UNAVAILABLE, caption="methods that did not run here"))
    _fused_anatomy(page, results, decode_batch)
    _spread(page, results, config, decode_batch)
    compared = analysis.model_vs_measured(results)
    if len(compared):
        page.figure("model", figures.model_vs_measured(compared), results.caption(
            "layer model (from one expert's dense curve) against the measurement: each bar the mean signed "
            "error of a method's points at that batch (EP degrees, formats), so errors of opposite sign "
            "offset there; the table below, the mean |error| over every point"))
        page.html("model", html_table(analysis.model_error(compared), ERRORS))
    _utilization(page, results, config, target)
    others = analysis.other_presets(context.run, config.preset)
    if not others:
        page.note("others", f"This run swept no model besides {model.name}; the command "
                            f"fp4lab moe-sweep --preset NAME --run-id {context.run.run_id} adds one.")
    for key in others:
        other = analysis.moe_results(context.run, key)
        other_at = decorated(other, decode_batch, config.routing)
        if len(other_at):
            page.html("others", html_table(other_at, LAYERS, caption=layer_caption(
                other, other_at, f"at B={int(other_at['batch'].iloc[0])}, the measured batch nearest the decode "
                                 f"batch {decode_batch}")))
            page.bullets("others", [other_model_finding(other, other_at)])
    if context.reference is not None and context.reference.run.has_table("moe"):
        reference = analysis.moe_results(context.reference.run, config.preset)
        ref_at = decorated(reference, decode_batch, config.routing)
        if len(ref_at):
            # the same columns as this run's table above: without a lead line the two read as one
            fastest = ref_at.loc[ref_at["layer_us"].idxmin()]
            page.prose("reference", f"The same layer in the run shown beside, {text.code(reference.view.run_id)} "
                                    f"({text.md(reference.view.device)}, {text.md(reference.view.created[:10])}): "
                                    f"fastest there {text.md(fastest['method'])} at {text.us(fastest['layer_us'])}.")
            page.html("reference", html_table(ref_at, LAYERS, caption=layer_caption(
                reference, ref_at, f"the run shown beside at B={int(ref_at['batch'].iloc[0])}")))
    page.bullets("findings", routing_findings(model, decode_batch, config) + measured_findings(results, at))


def layer_caption(results: analysis.MoeResults, at, what: str) -> str:
    """A layer table's caption, naming the rows whose timer read a lower SM clock than the rest."""
    usual, slow = analysis.slow_clock_rows(at)
    if len(slow):
        named = "; ".join(f"{row.method}{f' ({row.fmt})' if isinstance(row.fmt, str) else ''} at "
                          f"{text.sig(row.sm_clock_mhz)} MHz" for row in slow.itertuples())
        what += f"; timed at an SM clock of {text.sig(usual)} MHz but {named}"
    return results.caption(what)


def decorated(results: analysis.MoeResults, batch: int, routing: str):
    """layer_times at `batch` with each method's weight-read floor at the run's bandwidth."""
    at = analysis.layer_times(results, batch, routing)
    bandwidth = analysis.copy_bandwidth_tbps(results)
    at["read_floor_us"] = [analysis.read_floor_us(b, bandwidth) for b in at["weight_bytes"]]
    at["pct_of_floor"] = 100 * at["read_floor_us"] / at["layer_us"]
    return at


def _fused_anatomy(page, results: analysis.MoeResults, decode_batch: int) -> None:
    """fp4lab's fused kernel dissected: its loads-only, decode and whole builds at one layer, and
    its decode and MMAs without the weights' read."""
    table = analysis.fused_anatomy(results)
    if not len(table):
        reason = text.package_relative(analysis.fused_anatomy_reason(results))
        command = text.code(f"fp4lab moe-sweep --methods cuda-w4a16-moe --anatomy-batch {decode_batch} "
                            f"--run-id {results.view.run_id}")
        page.prose("anatomy", f"fp4lab's fused kernel was not dissected in this run ({text.md(reason)}); "
                              f"on a GPU, {command} adds it.")
        return
    page.figure("anatomy", figures.fused_anatomy(table), results.caption(
        "one layer (EP 1); the builds timed one after another in one worker, after the whole call "
        "passed the gate (the other builds write no output)"))
    page.bullets("anatomy", fused_anatomy_findings(table, decode_batch))


SAME_CALL_SPREAD_PCT = 3.0   # two workers' times of one call further apart than this are said to be


def overlap_findings(row, elsewhere: dict | None = None) -> list[str]:
    """What hiding the decode and MMAs under the loads would give: the loads-only time (a time, not
    a ratio: chapter 04's "1.4x" is the layer over its floor, another pair of times) where the
    math alone (the compute build) is shorter; where it is about as long or longer, no overlap takes
    the call below the math, so the SMs' own work bounds it as much as the weight stream. Without
    a compute build, the loads-only time, on that condition."""
    if row["load_share"] >= 90:
        return ["The call is its loads: decode and MMAs hide under them, so what is left is reading the "
                "weights faster."]
    # the increments are the part the loads did not hide, not the decode's and MMAs' whole work
    said = (f"Decode and MMAs add {text.us(row['above_load_us'])} to the loads alone: the part of their work the "
            "loads do not hide.")
    if text.is_missing(row["compute"]) and elsewhere is not None:
        return [said + f" This run timed the call without the weights' read only in "
                       f"{text.md(elsewhere['fmt'])} (its line below): {text.us(elsewhere['compute'])}, "
                       f"{text.ratio_to_one(elsewhere['math_to_load'])} that format's loads alone"
                       + ("; the SMs' own work is as long as the weight stream there, so hiding it under the "
                          "loads would not reach the loads-only time." if elsewhere["math_bound"] else ".")]
    if text.is_missing(row["compute"]):
        return [said + f" Were they hidden under the loads, the layer would take about its loads-only "
                       f"time, {text.us(row['load'])} in this worker, if they alone take less than "
                       f"that: this run did not time the call without the weights' read."]
    alone = (f" Without reading the weights at all (the same launches decoding and multiplying what "
             f"their buffers hold), the call takes {text.us(row['compute'])}, "
             f"{text.ratio_to_one(row['math_to_load'])} its loads alone.")
    if row["math_bound"]:
        return [said + alone + f" So the SMs' own work is as long as the weight stream: even wholly "
                               f"hidden under the loads, the layer could not go below "
                               f"{text.us(row['overlapped_us'])}. On this GPU the kernel is bound by "
                               f"its own instructions (decode and MMAs) "
                               f"{'more than' if row['math_to_load'] > 1 else 'as much as'} by HBM: toward the "
                               f"read floor it needs fewer instructions a weight before anything else."]
    return [said + alone + f" Hidden under the loads (a main loop in which one warp streams the weights "
                           f"into shared memory while the others decode and multiply), they would take "
                           f"the layer to about its loads-only time, {text.us(row['load'])} in this "
                           f"worker."]


def fused_anatomy_findings(table, decode_batch: int) -> list[str]:
    """Where the fused kernel's time goes at the dissected batch nearest the decode batch, in the
    format the layer table times fastest there (the one chapter 04 diagnoses; NVFP4 where the
    table has neither), then one line for each other dissected point."""
    nearest = table.assign(gap=(table["batch"] - decode_batch).abs(), mx=table["fmt"] != "nvfp4")
    row = nearest.sort_values(["gap", "layer_us", "mx"], na_position="last").iloc[0]
    head = (f"At B={int(row['batch'])} ({text.md(row['fmt'])}) {text.code(row['method'])} takes "
            f"{text.us(row['full'])} a layer in this worker. Its loads alone (the FP4 weights, their "
            f"block scales and the staged activations, nothing decoded or multiplied) take "
            f"{text.us(row['load'])} ({text.pct(row['load_share'])} of this worker's call), reading the weights at "
            f"{text.pct(row['load_rate_pct'])} of the copy bandwidth (their read floor is "
            f"{text.us(row['read_floor_us'])}); decoding them brings it to {text.us(row['decode'])} "
            f"({text.signed_us(row['decode_added_us'])}), the MMAs with the epilogue to {text.us(row['full'])} "
            f"({text.signed_us(row['mma_added_us'])}).")
    lines = [head]
    if row["layer_apart_pct"] > SAME_CALL_SPREAD_PCT:                 # False where NaN
        lines.append(f"The sweep's layer table times the same call at the same point at "
                     f"{text.us(row['layer_us'])}, in its own worker; this worker's {text.us(row['full'])} is "
                     f"{text.pct(row['layer_apart_pct'])} off it{apart_why(row)}. Read this section's "
                     f"increments, each timed beside the others in one worker, rather than its totals.")
    lines += overlap_findings(row, analysis.math_in_other_format(table, row))
    if row["load_rate_pct"] < 80:
        lines.append(f"Even alone the loads reach {text.pct(row['load_rate_pct'])} of the copy bandwidth: "
                     f"to reach the floor the kernel must also keep more weight bytes in flight.")
    if (table[["decode_added_us", "mma_added_us"]] < 0).any().any():
        lines.append("Somewhere a build that leaves work out is slower than the one that does it: each "
                     "build is its own compilation (registers, warps an SM), so its increments are not "
                     "strict costs.")
    for other in table.drop(index=row.name).itertuples(index=False):
        elsewhere = (f" (the layer table: {text.us(other.layer_us)}, {text.pct(other.layer_apart_pct)} off it, "
                     "the same spread between workers)"
                     if other.layer_apart_pct > SAME_CALL_SPREAD_PCT else "")
        alone = ("" if text.is_missing(other.compute) else
                 f"; without the weights' read {text.us(other.compute)} ({text.ratio_to_one(other.math_to_load)} "
                 f"its loads)")
        lines.append(f"{text.md(other.fmt)} at B={int(other.batch)}: the whole call {text.us(other.full)}"
                     f"{elsewhere}, its loads {text.us(other.load)} ({text.pct(other.load_share)}), decode "
                     f"{text.signed_us(other.decode_added_us)}, MMAs {text.signed_us(other.mma_added_us)}{alone}.")
    return lines


def _spread(page, results: analysis.MoeResults, config: MoeSweep, decode_batch: int) -> None:
    """Each method timed on the busiest EP rank at P x the decode batch against itself alone."""
    spread = analysis.expert_parallel_times(results, decode_batch, config.routing)
    if not len(spread):
        command = text.code(f"fp4lab moe-sweep --ep P --batch N --run-id {results.view.run_id}")
        page.prose("spread", f"No method was timed on an expert-parallel rank at P x {decode_batch} tokens: "
                             f"{command} with N = P x {decode_batch} adds it.")
        return
    page.html("spread", html_table(spread, SPREAD, caption=results.caption(
        f"P GPUs each bring B={decode_batch} tokens: the busiest rank's measured share of the layer "
        "(its experts, the pairs routed to them); all-to-all not included")))
    fastest = analysis.fastest_spread(results, decode_batch, config.routing, spread)
    if fastest is None:
        return
    best, alone = fastest["spread"], fastest["alone"]

    def named(row) -> str:
        return text.md(row["method"]) + (f" ({text.md(row['fmt'])})" if isinstance(row.get("fmt"), str) else "")

    page.prose("spread", f"The fastest spread, {named(best)} at EP {int(best['ep'])}, takes "
                         f"{text.us(best['us_per_token'])} of GPU time per token; the fastest method alone "
                         f"on one GPU, {named(alone)}, {text.us(alone['us_per_token'])}: "
                         f"{text.ratio(fastest['gain'])}. Each rank reads 1/{int(best['ep'])} of the "
                         "weights for as many pairs as one GPU alone, so its experts' GEMMs are "
                         f"{int(best['ep'])}x taller and a different kernel can win.")


def _utilization(page, results: analysis.MoeResults, config: MoeSweep, target: float) -> None:
    from fp4lab import hardware

    curves = analysis.model_curves(results)
    spec = hardware.SPECS.get(results.view.device_key or "")
    peak = spec.peak_tflops.get("bf16") if spec else None
    if curves is None or not peak:
        return
    layer = layer_model.layer_table(results.model, curves, config.batch_sizes, config.ep_degrees,
                                    config.routing, min(config.steps, 16), config.seed, peak_tflops=peak)
    needed = layer_model.concurrency_for_utilization(layer, target)
    page.prose("utilization", utilization_sentence(layer, needed, target))
    page.figure("utilization", figures.utilization(layer, target), results.caption(
        f"predicted by the layer model; % of the spec bf16 peak ({peak:g} TFLOP/s)"))
    page.html("utilization", html_table(needed, NEEDED))


def utilization_sentence(layer: pd.DataFrame, needed: pd.DataFrame, target: float) -> str:
    """What the utilization figure says, and why its EP curves can coincide: the model splits B
    over the ranks (the routing table's convention), which leaves the tokens per expert as they are."""
    reached = needed[needed["batch_needed"].notna()]
    best = needed.loc[needed["best_utilization"].idxmax()]
    if len(reached):
        first = reached.loc[reached["batch_needed"].idxmin()]
        said = (f"The layer model predicts the busiest rank's grouped bf16 call reaches {text.pct(100 * target, 0)} "
                f"of the spec bf16 peak from B={int(first['batch_needed'])} (EP={int(first['ep'])})")
    else:
        said = (f"No batch swept reaches {text.pct(100 * target, 0)} of the spec bf16 peak in the layer model's "
                f"prediction (the busiest rank's grouped bf16 call): at best "
                f"{text.pct(100 * best['best_utilization'])} (EP={int(best['ep'])})")
    spread = layer.groupby("batch")["grouped_utilization"].agg(lambda u: u.max() - u.min())
    if layer["ep"].nunique() > 1 and float(spread.max()) < 0.02:
        said += (". Here B is the step's tokens split over the ranks, as in the routing table: that leaves the "
                 "tokens per expert as they are, so the EP curves coincide; expert parallelism raises them only "
                 "when each GPU brings its own B, as measured above")
    return said + "."


def routing_findings(model, decode_batch: int, config: MoeSweep) -> list[str]:
    load = analysis.tokens_per_expert(model, decode_batch, config.routing, config.steps, config.seed)
    return [f"At a decode batch of {decode_batch} ({text.md(config.routing)} routing) the mean "
            f"{text.md(model.name)} expert gets {text.sig(load['mean_m'])} tokens "
            f"(B x k / E = {text.sig(load['closed_form_mean'])}), but the busiest gets "
            f"{text.sig(load['busiest_m'])} on average: the busiest expert sets the step time."]


def apart_why(row) -> str:
    """Why two workers' times of one call differ, from their bursts: different clocks, or one
    clock and a spread within the burst (near the power limit a burst's samples split: chapter
    02); nothing where the rows hold no clock."""
    table, worker = row["layer_sm_clock_mhz"], row["full_sm_clock_mhz"]
    if text.is_missing(table) or text.is_missing(worker):
        return ""
    if abs(table - worker) >= 0.02 * max(table, worker):
        return (f": the table's burst read the SM clock at {table:.0f} MHz, this worker's at {worker:.0f} MHz "
                "(near the power limit a burst runs at the clock of its moment: chapter 02)")
    if text.is_missing(row["full_p20_us"]) or text.is_missing(row["full_p80_us"]):
        return f": both bursts read {worker:.0f} MHz"
    spread = text.percentile_spread(row["full_p20_us"], row["full_p80_us"])
    return (f": both bursts read {worker:.0f} MHz, and this worker's own samples have their {spread} "
            "(near the power limit a burst's samples split: chapter 02)")


def against_floor(row) -> str:
    """"R x its weight-read floor (T)" for one row of `decorated`: the ratio chapter 04 states
    (a time as "P% of its floor" read as a time under the floor)."""
    return (f"{text.ratio(row['layer_us'] / row['read_floor_us'])} its weight-read floor "
            f"({text.us(row['read_floor_us'])})")


def other_model_finding(results: analysis.MoeResults, at) -> str:
    """One line on another model's layer at the decode batch: the fastest method, the fastest
    FP4-weight one against its floor, fp4lab's fastest fused kernel and grouped FP8 where they
    ran."""
    _, slow = analysis.slow_clock_rows(at)

    def named(row) -> str:
        return text.md(row["method"]) + (f" ({text.md(row['fmt'])})" if row["fmt"] else "")

    def timed(row) -> str:
        """Its time, and the clock where its burst ran slower than the table's others (the caption's)."""
        clock = f" (timed at {row['sm_clock_mhz']:.0f} MHz)" if row.name in slow.index else ""
        return text.us(row["layer_us"]) + clock

    best, fp4 = at.iloc[0], at[at["weight_dtype"] == "fp4"]
    parts = [f"{text.md(results.model.name)} at B={int(best['batch'])}: the fastest method is "
             f"{named(best)} at {timed(best)}"
             + (f", {against_floor(best)}" if best["weight_dtype"] == "fp4" else "")]
    if len(fp4) and fp4.index[0] != at.index[0]:
        parts.append(f"the fastest FP4-weight one is {named(fp4.iloc[0])} at "
                     f"{timed(fp4.iloc[0])}, {against_floor(fp4.iloc[0])}")
    fused = at[at["method"].isin(OWN_LAYER_METHODS)]
    if len(fused) and fused.index[0] != at.index[0]:
        own = fused.iloc[0]
        parts.append(f"fp4lab's fastest fused kernel ({text.md(own['method'])}) takes "
                     f"{timed(own)} ({text.md(own['fmt'])}, "
                     f"{text.ratio(own['layer_us'] / own['read_floor_us'])} its floor)")
    fp8 = at[at["method"] == "grouped-fp8"]
    if len(fp8):
        parts.append(f"the grouped FP8 GEMMs {text.us(fp8.iloc[0]['layer_us'])}")
    return "; ".join(parts) + "."


def measured_findings(results: analysis.MoeResults, at) -> list[str]:
    if not len(at):
        return []
    best = at.iloc[0]
    scaled = " (the scaled CPU stand-in: a pipeline check, not the model)" if results.model.scaled else ""
    bf16 = at[(at["weight_dtype"] == "bf16") & (at["method"] != best["method"])]
    # against the fastest bf16 method, as chapter 04 and the front page state it
    against = (f"{text.ratio(bf16.iloc[0]['layer_us'] / best['layer_us'])} as fast as the fastest "
               f"bf16 method ({text.md(bf16.iloc[0]['method'])})"
               if best["weight_dtype"] != "bf16" and len(bf16) else
               f"{text.ratio(best['speedup_vs_loop'])} as fast as the loop of bf16 GEMMs")
    lines = [f"At B={int(best['batch'])} the fastest method is {text.md(best['method'])} at "
             f"{text.us(best['layer_us'])} per layer{scaled}, {against}."]
    grouped = at[at["method"] == "grouped-bf16"]
    if len(grouped):
        lines.append(f"One grouped bf16 call is {text.ratio(grouped['speedup_vs_loop'].iloc[0])} as fast as the "
                     f"loop at B={int(best['batch'])}.")
    fp4 = at[at["weight_dtype"] == "fp4"]
    if len(fp4):
        row = fp4.iloc[0]
        lines.append(f"The fastest FP4-weight method is {text.md(row['method'])} ({text.md(row['fmt'])}) at "
                     f"{text.us(row['layer_us'])}: {against_floor(row)}.")
    return lines
