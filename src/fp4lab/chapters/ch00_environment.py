"""Chapter 00, the environment: which device the run measured, its spec sheet with sources, the
whole sheet for comparison, library versions, and what FP4 means on this device. The chapter
records the provenance into the run folder when the run has none yet (the machine measuring is
the one it describes); a run rendered elsewhere shows its own provenance."""

from __future__ import annotations

from fp4lab import results, text
from fp4lab.analysis import environment as env
from fp4lab.chapters.context import Context, open_context, parameters_block
from fp4lab.plots.environment import peaks_and_ridges
from fp4lab.plots.tables import Col, html_table, key_values

TITLE = "00 · The environment"
SHEET_COLUMNS = [Col("key", "GPU"), Col("sm", "arch"), Col("fp4_tflops", "FP4 (TFLOP/s)", "sig"),
                 Col("fp8_tflops", "FP8 (TFLOP/s)", "sig"), Col("bf16_tflops", "BF16 (TFLOP/s)", "sig"),
                 Col("memory_bw_tbps", "memory (TB/s)", "sig"), Col("power_w", "power (W)", "int"),
                 Col("smem_per_block_kb", "smem per block (KB)", "int"), Col("native_fp4", "native FP4")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto"):
    context = open_context(TITLE, run_dir, reference_dir, profile, device)
    if "provenance" not in context.run.run_json():
        context.run.update_run_json(None, {"provenance": results.provenance("notebook 00_environment",
                                                                            context.device)})
        context.page.smoke = not context.view.is_gpu
    parameters_block(context)
    fill(context)
    return context.page


def fill(context: Context) -> None:
    page, run_view = context.page, context.view
    page.html("device", key_values(env.device_rows(run_view), caption=run_view.caption("read by detect()")))
    spec = env.spec_for(run_view)
    if spec is not None:
        page.html("spec", html_table(env.spec_rows(spec), [Col("figure", "figure"), Col("value", "value"),
                                                           Col("source", "source")]))
    else:
        page.prose("spec", f"The run measured {text.md(run_view.device)}, which has no entry in fp4lab's "
                           "spec sheet: later chapters place it against measured ceilings only.")
    sheet = env.sheet_table()
    page.html("sheet", html_table(sheet, SHEET_COLUMNS, caption="fp4lab.hardware.SPECS: vendor datasheets, "
                                  "dense figures (derived as sparse/2 where only sparse ones are published)"))
    page.figure("sheet", peaks_and_ridges(sheet, spec.key if spec else None),
                "Spec sheets, not measurements." + (f" In the figure, '{spec.key} *' is the device this run "
                                                    "measured." if spec else ""))
    versions = run_view.versions()
    page.html("versions", html_table(
        _frame([(name, version or "not installed") for name, version in versions.items()]),
        [Col("name", "package"), Col("value", "version")]))
    page.prose("fp4", fp4_paragraph(run_view))
    page.bullets("findings", findings(context))


def _frame(pairs):
    import pandas as pd

    return pd.DataFrame([{"name": name, "value": value} for name, value in pairs])


def fp4_paragraph(run_view) -> str:
    native = env.native_fp4(run_view)
    device = text.md(run_view.device)
    if not run_view.is_gpu:
        return (f"This run is on a CPU ({device}), not a GPU: FP4 GEMMs run only as the emulated "
                "reference (decode, then multiply). No time here says anything about a GPU.")
    if native:
        return (f"{device} has FP4 tensor cores: it multiplies {text.join(native)} operands directly, "
                "so FP4 pays twice, in bytes read and in arithmetic rate.")
    return (f"{device} has no FP4 tensor cores. Here FP4 means weight-only kernels: the weights are "
            f"stored in FP4 ({env.fp4_bytes_saving('nvfp4'):.1f}x fewer bytes to read than bf16 in NVFP4, "
            f"{env.fp4_bytes_saving('mxfp4'):.1f}x in MXFP4, scales included) and decoded to bf16 in "
            "registers before the tensor cores multiply. The FP4 tensor-core backends say why they cannot run.")


def findings(context: Context) -> list[str]:
    run_view = context.view
    lines = []
    spec = env.spec_for(run_view)
    device = text.md(run_view.device)
    if run_view.is_gpu:
        rows = dict(env.device_rows(run_view))
        sheet = (f"it matches the sheet entry {text.md(spec.name)} ({text.sig(spec.memory_bw_tbps)} TB/s, "
                 f"{text.sig(spec.peak_tflops['bf16'])} dense bf16 TFLOP/s)" if spec else
                 "it is not in fp4lab's spec sheet, so % of peak uses measured ceilings only")
        lines.append(f"The run measured {device} ({rows.get('SMs')} SMs, {rows.get('memory (GiB)')} GiB); {sheet}.")
        limit = rows.get("power limit (W)")
        if limit and spec and float(limit) < spec.power_w:
            lines.append(f"Its power limit is set to {text.sig(limit)} W, below the {spec.power_w:.0f} W "
                         "of the sheet: the sheet's peaks may not be reachable.")
    else:
        lines.append(f"This run is on a CPU ({device}): a check of the pipeline, not a measurement of a GPU.")
    native = env.native_fp4(run_view)
    lines.append(f"Native FP4 formats: {text.join(native) if native else 'none'}.")
    versions = run_view.versions()
    missing = [name for name, version in versions.items() if not version]
    if missing:
        lines.append(f"Not installed: {text.md(text.join(missing))}; their backends say so in chapter 01.")
    if context.reference is not None:
        lines.append(f"The run shown beside this one, {text.code(context.reference.run_id)}, "
                     f"measured {text.md(context.reference.device)}.")
    return lines
