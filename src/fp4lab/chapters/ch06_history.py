"""Chapter 06, history: this run against the previous local run and the reference runs, point by
point, with a noise model (fp4lab.analysis.history), and what changed in between."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fp4lab import params, profiles, text
from fp4lab.analysis import decode
from fp4lab.analysis import history as analysis
from fp4lab.chapters.context import Context, open_context, parameters_block, resolve_parameters
from fp4lab.moe import presets
from fp4lab.plots.history import time_ratios
from fp4lab.plots.tables import Col, html_table
from fp4lab.results import REFERENCE_ROOT, find_run_dirs

TITLE = "06 · History: what changed since the last run"
INDEX = [Col("run_id", "run"), Col("kind", "kind"), Col("device", "device"), Col("created", "created"),
         Col("profile", "profile"), Col("tables", "tables"), Col("fp4lab_git_sha", "fp4lab commit")]
POINTS = [Col("backend", "backend"), Col("fmt", "format"), Col("m", "M", "int"), Col("n", "N", "int"),
          Col("k", "K", "int"), Col("before_us", "then", "us"), Col("now_us", "now", "us"),
          Col("time_ratio", "now / then", "ratio")]
BACKENDS = [Col("backend", "backend"), Col("points", "points", "int"),
            Col("geomean_ratio", "now / then (geometric mean)", "ratio"),
            Col("machine_ratio", "the other backends' (median)", "ratio"),
            Col("beyond_machine", "beyond them", "ratio"), Col("share_slower", "share of points slower", "pct")]
CHANGES = [Col("field", "what"), Col("before", "then"), Col("now", "now")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          regression_threshold=None, runs_dir: str = ""):
    context = open_context(TITLE, run_dir, reference_dir, profile, device,
                           regression_threshold=regression_threshold)
    threshold = params.check_float("regression_threshold", profiles.section(context.profile, "history")[
        "regression_threshold"] if regression_threshold is None else regression_threshold, 0, 10, strict_minimum=True)
    params.check_text("runs_dir", runs_dir)
    resolve_parameters(context, regression_threshold=threshold)
    parameters_block(context)
    fill(context, threshold, Path(runs_dir) if runs_dir else context.run.path.parent, reference_dir)
    return context.page


def compared_references(context: Context, reference_dir: str) -> list[Path]:
    """"" = every committed reference run (but this one, or a committed copy of it), "none" =
    none, else the one given."""
    if reference_dir:
        return [context.reference.run.path] if context.reference else []
    return [path for path in find_run_dirs(REFERENCE_ROOT) if path.name != context.run.path.name]


def fill(context: Context, threshold: float, runs_dir: Path, reference_dir: str = "") -> None:
    page = context.page
    references = compared_references(context, reference_dir)
    index = without_copies(analysis.index_runs(runs_dir), context.run.path)
    listed = recent(index)
    older = len(index) - len(listed)
    page.html("index", html_table(runs_shown(listed, context.run.path), INDEX, caption=(
        "the committed reference runs and the newest local runs" + (
            f"; {text.count(older, 'older local run')} not listed (python -m fp4lab runs lists every one)"
            if older else ""))))
    comparisons = []
    diagnosis = decode.DiagnosisConfig.from_profile(context.profile)
    now = analysis.diagnosed_path(context.run, diagnosis)         # once for every comparison

    def compared(other: Path, kind: str) -> analysis.Comparison:
        return dataclasses.replace(analysis.compare(context.run.path, other, kind, threshold),
                                   diagnosed=analysis.diagnosis_change(now, other, diagnosis))

    previous = analysis.previous_run(context.run.path, runs_dir)
    if previous is None and analysis.is_reference_root(runs_dir):
        page.prose("previous", "This run is a committed reference run: the other reference runs below "
                               "are what it is compared with.")
    elif previous is None:
        page.prose("previous", "This is the first local run with GEMM rows: nothing earlier to compare with.")
    else:
        comparisons.append(compared(previous, "previous"))
        show(page, "previous", comparisons[-1])
    for path in references:
        comparisons.append(compared(path, "reference"))
        show(page, "reference", comparisons[-1])
    page.bullets("findings", findings(index, comparisons))


def show(page, section: str, c: analysis.Comparison) -> None:
    page.bullets(section, summary(c))
    if len(c.ratios):
        page.figure(section, time_ratios(c.ratios, None if c.on_cpu else c.threshold),
                    f"run {c.run_id} against {c.other_kind} run {c.other_id}; judged {c.judged}")
    if len(c.regressions):
        columns = BACKENDS if c.on_cpu else POINTS
        page.html(section, html_table(c.regressions.head(20), columns,
                                      caption=f"the worst {min(20, len(c.regressions))} of {len(c.regressions)}"))
    if len(c.changes):
        changes = c.changes.copy()
        commit = changes["field"] == "fp4lab commit"
        changes.loc[commit, ["before", "now"]] = changes.loc[commit, ["before", "now"]].map(text.short_sha)
        page.html(section, html_table(changes, CHANGES, caption="what changed between the two runs"))


def summary(c: analysis.Comparison) -> list[str]:
    label = (f"the same device ({text.md(c.devices[0])}): the ratios show software and conditions" if c.same_device
             else f"different devices ({text.md(c.devices[0])} now, {text.md(c.devices[1])} then): the ratios compare hardware")
    lines = [f"Against {c.other_kind} run {text.code(c.other_id)}: {label}."]
    if not len(c.ratios):
        return lines + ["No point was measured correctly in both runs, so no ratio can be computed."]
    lines.append(f"{text.count(len(c.ratios), 'point')} measured correctly in both; the median point takes "
                 f"{text.ratio(analysis.median_ratio(c))} the time it took then.")
    if c.diagnosed is not None:
        lines.append(diagnosis_sentence(c.diagnosed))
    if not c.same_device:
        return lines
    noun = "backend" if c.on_cpu else "point"
    if len(c.regressions):
        lines.append(f"{text.count(len(c.regressions), noun)} regressed, judged {text.md(c.judged)}.")
    else:
        lines.append(f"No {noun} regressed, judged {text.md(c.judged)}.")
    if len(c.improvements):
        lines.append(improvement_sentence(c.improvements, c.threshold))
    return lines


def diagnosis_sentence(change: dict) -> str:
    """The diagnosed layer then and now: its path and time in each run (chapter 04's number)."""
    def named(side: dict) -> str:
        return text.md(side["path"]) + (f" ({text.md(side['fmt'])})" if side["fmt"] else "")

    now, then = change["now"], change["then"]
    same = (now["path"], now["fmt"]) == (then["path"], then["fmt"])
    what = (f"still {named(now)}" if same else f"{named(then)} then, {named(now)} now")
    # a new path's speed-up is not the old path's: say what the old one takes now
    old_now = change.get("then_path_now_us")
    old_path = ("" if same or old_now is None else
                f"; {named(then)} itself takes {text.us(old_now)} now")
    return (f"The diagnosed layer ({text.md(presets.get(change['model']).name)} at B={change['batch']}, "
            f"chapter 04): {what}, {text.us(then['layer_us'])} then and {text.us(now['layer_us'])} now "
            f"({text.as_fast(now['layer_us'], then['layer_us'])} then{old_path}).")


def improvement_sentence(improved, threshold: float, shown: int = 3) -> str:
    """How many points got faster beyond the noise, by backend, and the most improved ones."""
    by_backend = improved["backend"].value_counts()
    backends = ", ".join(f"{text.md(name)} {count}" for name, count in by_backend.items())
    top = "; ".join(f"{text.md(r.backend)}{f' {text.md(r.fmt)}' if isinstance(r.fmt, str) else ''} "
                    f"{r.n}x{r.k} M={r.m}: {text.us(r.before_us)} → "
                    f"{text.us(r.now_us)}" for r in improved.head(shown).itertuples())
    return (f"{text.count(len(improved), 'point')} got faster by over {threshold:.0%} and beyond the "
            f"p20-p80 spread of both runs ({backends}); the most: {top}.")


def without_copies(index, this_run: Path):
    """The index with each run once: without committed copies of this run (a reference run resumed
    on the machine that measured it is listed where it runs) and without local copies of other
    committed reference runs (the folder a resumed reference run was carried in: the committed one
    is the whole run)."""
    if not len(index):
        return index
    this = is_this_run(index, this_run)
    references = set(index.loc[index["kind"] == "reference", "run_id"])
    local_copy = (index["kind"] != "reference") & index["run_id"].isin(references)
    return index[this | ((index["run_id"] != this_run.name) & ~local_copy)].reset_index(drop=True)


def is_this_run(index, this_run: Path):
    """Per row of the index: is it this run's own folder."""
    return index["path"].map(lambda path: Path(path).resolve() == this_run.resolve())


LOCAL_RUNS_LISTED = 10   # a nightly box keeps months of runs: the table lists the newest


def recent(index):
    """Every reference run and the newest local ones, oldest first, as the index orders them."""
    if not len(index):
        return index
    local = index[index["kind"] != "reference"]
    keep = index["kind"].eq("reference") | index.index.isin(local.index[-LOCAL_RUNS_LISTED:])
    return index[keep]


def runs_shown(index, this_run: Path):
    """The index as a reader scans it: this page's run named as such (a reference run was a local
    one where it ran), times to the minute, the tables spaced so the column wraps."""
    shown = index.copy()
    if len(shown):
        shown.loc[is_this_run(shown, this_run), "kind"] = "this run"
        shown["created"] = shown["created"].map(text.minute_utc)
        shown["tables"] = shown["tables"].fillna("").str.replace(",", ", ")
        shown["fp4lab_git_sha"] = shown["fp4lab_git_sha"].map(text.short_sha)
    return shown


def findings(index, comparisons: list[analysis.Comparison]) -> list[str]:
    kinds = index["kind"].value_counts() if len(index) else {}
    lines = [f"{text.count(len(index), 'run')} on record ({int(kinds.get('local', 0))} local, "
             f"{int(kinds.get('reference', 0))} reference); this run was compared with {len(comparisons)}."]
    same = [c for c in comparisons if c.same_device]
    if same:
        flagged = sum(len(c.regressions) for c in same)
        faster = max(len(c.improvements) for c in same)
        lines.append(f"On the same device, {flagged} regression{'s' if flagged != 1 else ''} flagged"
                     + (f"; up to {text.count(faster, 'point')} faster beyond the noise" if faster else "")
                     + ".")
    else:
        lines.append("No earlier run on this device: no regression can be judged yet.")
    return lines
