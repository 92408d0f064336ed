"""Chapter 05, spreading a step over GPUs: what each collective (all-reduce, the EP all-to-alls,
a pipeline hand-off) costs at decode sizes, and which layout, TP, TP x PP or EP, runs the MoE
part of a decode step fastest on the GPUs measured, from the run's own GEMMs and comm rows.

When the run lacks comm rows and may be measured here, the chapter launches the comm run
itself (torchrun over every GPU of the box with NCCL; on a CPU the two-process gloo check).
A box with one GPU measures the collectives at world size 1 and says that no layout can be
ranked from it. Published all-to-all latencies are shown beside the run's, with their sources.
"""

from __future__ import annotations

from fp4lab import params, profiles, text
from fp4lab.analysis import comm as comm_analysis
from fp4lab.analysis import layouts as analysis
from fp4lab.chapters.context import (Context, annotate_parameters, open_context, parameters_block,
                                     resolve_parameters)
from fp4lab.plots import comm as figures
from fp4lab.plots.tables import Col, html_table

TITLE = "05 · Spreading a step over GPUs: TP, PP or EP"
MAX_TIMEOUT_S = 3600.0
AT_DECODE = [Col("op", "collective"), Col("world_size", "ranks", "int"), Col("tokens", "tokens (per rank)", "int"),
             Col("dtype", "dtype"), Col("routing", "splits"), Col("bytes", "bytes per rank", "int"),
             Col("median_us", "median time", "us"), Col("busbw_gbps", "bus bandwidth (GB/s)", "sig"),
             Col("imbalance", "busiest / mean rank", "ratio")]
# the layout's name carries its GPU count (TP2, TP1xPP2, EP8): no GPUs column, so the table fits
LAYOUTS = [Col("layout", "layout"), Col("layer_gemm_us", "GEMMs a layer", "us"),
           Col("layer_comm_us", "comm a layer", "us"), Col("stage_comm_us", "PP hand-offs a step", "us"),
           Col("step_us", "MoE part of a step", "us"),
           Col("tokens_per_s", "tokens/s", "sig"), Col("comm_share", "in comm", "share"),
           Col("bound", "bound by"), Col("vs_best", "vs fastest", "ratio"), Col("missing", "not measured")]
PUBLISHED = [Col("source", "source"), Col("system", "system, link"), Col("op", "op"),
             Col("world_size", "EP ranks", "int"), Col("tokens", "tokens per rank", "int"),
             Col("dtype", "dtype"), Col("us", "published", "us"), Col("measured_us", "this run", "us")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          measure=None, nproc=None, routing=None, batches=None, preset=None, decode_batch=None,
          timeout_s=None):
    knobs = dict(measure=measure, nproc=nproc, routing=routing, batches=batches, preset=preset,
                 decode_batch=decode_batch, timeout_s=timeout_s)
    context = open_context(TITLE, run_dir, reference_dir, profile, device, **knobs)
    section = profiles.section(context.profile, "comm")
    diagnosis = profiles.section(context.profile, "diagnosis")
    measure = params.check_bool("measure", section["measure"] if measure is None else measure)
    routing = params.check_text("routing", section["routing"] if routing is None else routing)
    batches = params.check_int_list("batches", section["batches"] if batches is None else batches)
    preset = params.check_text("preset", diagnosis["preset"] if preset is None else preset)
    decode_batch = params.check_int("decode_batch", diagnosis["decode_batch"] if decode_batch is None
                                    else decode_batch)
    timeout_s = params.check_float("timeout_s", section["timeout_s"] if timeout_s is None else timeout_s,
                                   0, MAX_TIMEOUT_S, strict_minimum=True)
    nproc = _nproc(context, section["nproc"] if nproc is None else nproc)
    resolve_parameters(context, measure=measure, nproc=nproc, routing=routing, batches=batches, preset=preset,
                       decode_batch=decode_batch, timeout_s=timeout_s)
    launch = measure and context.measures_here and not context.run.has_table("comm")
    if launch:
        context.parameters.append(("comm run now", measure_comm(context, nproc, routing, timeout_s)))
    study = analysis.study(context.run, context.reference, preset, batches, decode_batch, routing)
    if not launch:
        why = _not_launched(context, measure)
        annotate_parameters(context, why, "measure")
        annotate_parameters(context, why + (f": the collectives shown ran at {text.count(study.gpus, 'rank')}"
                                            if study.source is not None else ""), "nproc")
    parameters_block(context)
    fill(context, study)
    return context.page


def _not_launched(context: Context, measure: bool) -> str:
    """Why the page launched no comm run."""
    why = ("measure is off" if not measure else "the run already holds its collectives"
           if context.run.has_table("comm") else "rendering only")
    return f"no comm run launched ({why})"


def _nproc(context: Context, value) -> int:
    """`all`: every GPU torch sees (2 processes on a CPU); else a count >= 1."""
    if value == "all":
        if context.device == "cpu":
            return 2
        import torch

        return max(torch.cuda.device_count(), 1)
    return params.check_int("nproc", value)


def measure_comm(context: Context, nproc: int, routing: str, timeout_s: float) -> str:
    """Launch the comm run into the chapter's run folder; one line on how it went."""
    from fp4lab.comm import launch

    run = context.run
    if context.device == "cpu":
        result = launch.smoke_into(run.path, nproc=nproc, timeout_s=timeout_s)
    else:
        worker_args = ["--device", "cuda", "--profile", context.profile, "--routing", routing, "--quiet",
                       "--out", str(run.path.parent), "--run-id", run.run_id]
        result = launch.launch(nproc, worker_args, run.path, timeout_s=timeout_s, capture=True)
    if not result.ok:
        context.page.note("measured", f"The comm run failed: {result.message}", "warning")
    return f"{text.count(nproc, 'rank')}: {result.status}, {text.count(result.rows, 'row')}"


def fill(context: Context, study: analysis.LayoutStudy) -> None:
    page = context.page
    if study.source is None:
        page.note("measured", f"No collective was measured: {study.why_not}.", "warning")
        page.bullets("findings", findings(study))
        return
    source = study.source
    where = f" (the run shown beside, {source.run_id})" if study.from_reference else ""
    ok = study.ok
    if len(ok):
        # at one rank an all-to-all moves nothing between GPUs: each is a copy of its buffer, and
        # their lines lie on one another
        one_rank = "; at one rank every all-to-all is a local copy, so their lines coincide" if study.gpus == 1 else ""
        page.figure("measured", figures.comm_times(ok), source.caption(
            f"{ok['backend'].iloc[0]} over {text.count(study.gpus, 'rank')}{where}; slowest rank's median per call"
            f"{one_rank}"))
        at = analysis.at_decode(study, study.decode_batch)
        page.html("measured", html_table(at, AT_DECODE, caption=source.caption(
            f"at {int(at['tokens'].iloc[0])} tokens, the measured count nearest the decode batch {study.decode_batch}")))
    failed = study.frame[study.frame["status"] != "ok"]
    if len(failed):
        page.note("measured", f"{len(failed)} comm point(s) did not run: "
                              f"{failed['error'].dropna().iloc[0] if failed['error'].notna().any() else failed['status'].iloc[0]}",
                  "warning")
    if study.why_not:
        page.note("layouts", text.upper_first(study.why_not) + ".", "note", "No layout to rank")
    elif len(study.layouts):
        page.figure("layouts", figures.layout_steps(study.layouts, study.decode_batch), source.caption(
            f"{study.model.name}, {study.backend} GEMM times, measured comm, {study.layouts['routing'].iloc[0]} routing; "
            "MoE layers only"))
        at = study.layouts[study.layouts["batch"] == study.decode_batch]
        # "not measured" only where some layout lacks a measurement: the column that overflowed the page
        shown = [c for c in LAYOUTS if c.source != "missing" or at["missing"].fillna("").astype(str).str.strip().any()]
        page.html("layouts", html_table(at, shown, caption=source.caption(f"B={study.decode_batch}, fastest first")))
    page.html("published", published_table(comm_analysis.published_beside_measured(study.frame)))
    page.bullets("findings", findings(study))


def published_table(published) -> str:
    """The published figures in a page's width: each source named once (all are tabulated with
    their links in docs/REFERENCES.md), its note beside it, and the 'this run' column only where
    the run measured one of the points."""
    refs = comm_analysis.REFERENCES_FILE
    named = (published["source"].str.replace(f" (as tabulated in {refs})", "", regex=False)
             .str.replace(f" ({refs})", "", regex=False))
    shown = published.assign(
        source=named.where(published["note"] == "", named + ", " + published["note"]),
        system=published["system"] + ", " + published["link"],
        op=published["op"].str.replace("all_to_all_", "", regex=False))
    columns = [col for col in PUBLISHED if col.source != "measured_us" or shown["measured_us"].notna().any()]
    here = ("'this run': the same op, ranks and sizes here" if len(columns) == len(PUBLISHED) else
            f"this run measured none of these points (the same op at {int(published['world_size'].min())} "
            "or more ranks and these sizes)")
    return html_table(shown, columns, caption=f"published figures; sources with links in {refs}; {here}")


def findings(study: analysis.LayoutStudy) -> list[str]:
    if study.source is None:
        return [text.md(f"No collective was measured: {study.why_not}.")]
    lines = []
    smallest = analysis.smallest_time(study)
    device = text.md(study.source.device)
    if study.from_reference:
        device += f" (in the run shown beside, {text.code(study.source.run_id)}: this run measured no collective)"
    if smallest and study.gpus == 1:
        # one rank: each collective is a copy inside one GPU, a floor of the call, not a cost of spreading
        low, high = smallest["tokens_span"]
        lines.append(f"On {device} every collective ran at one rank, a copy inside one GPU: the cheapest of the "
                     f"{smallest['calls_measured']} calls measured ({low}-{high} tokens), "
                     f"{text.md(smallest['op'])} at {smallest['tokens']} tokens, takes "
                     f"{text.us(smallest['us'])} ({text.md(smallest['backend'])}), the call's own floor"
                     + (f" ({smallest['calls_per_sample']} calls back to back in each timed sample, so "
                        "they share the launch and timer cost that chapter 01's launch floor puts on a "
                        "single kernel)" if (smallest["calls_per_sample"] or 1) > 1 else "")
                     + f"{_at_table(smallest)}.")
    elif smallest:
        lines.append(f"On {device} the cheapest collective measured is {text.md(smallest['op'])} at "
                     f"{text.count(int(smallest['world_size']), 'rank')}, {text.count(int(smallest['tokens']), 'token')}: {text.us(smallest['us'])} "
                     f"({text.md(smallest['backend'])}){_at_table(smallest)}; every layer of a spread step pays at "
                     "least one such call.")
    if study.fastest.get("layout"):
        lines.append(text.md(study.fastest["sentence"]) + ".")
        if study.model is not None and study.model.scaled:
            lines.append("These are the scaled-down stand-in's sizes on a CPU: a check of the pipeline, "
                         "not a ranking of layouts on any GPU.")
    elif study.fastest.get("sentence"):
        lines.append("No layout could be timed: " + text.md(study.fastest["sentence"]) + ".")
    elif study.why_not:
        lines.append(text.md(text.upper_first(study.why_not)) + ".")
    return lines


def _at_table(smallest: dict) -> str:
    """The cheapest call's time at the table's token count, where the table reads another count."""
    if smallest["table_us"] is None or smallest["table_tokens"] == smallest["tokens"]:
        return ""
    return f"; at the table's {smallest['table_tokens']} tokens it takes {text.us(smallest['table_us'])}"
