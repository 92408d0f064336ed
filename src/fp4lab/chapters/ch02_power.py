"""Chapter 02, power and clocks: what the GPU draws and how fast it clocks while the sweep runs,
against its limit; power and TFLOPS/W per point; the throttle reasons NVML reports.

When a GPU run holds no telemetry (a sweep run without the sampler), the chapter samples a steady
bf16 GEMM load itself into the run folder. A CPU run has no GPU telemetry: the page says so and
points to the reference part instead of repeating its figures.
"""

from __future__ import annotations

from fp4lab import params, text
from fp4lab.analysis import gemm as gemm_analysis
from fp4lab.analysis import power as analysis
from fp4lab.chapters.context import Context, open_context, parameters_block, resolve_parameters
from fp4lab.plots import power as figures
from fp4lab.plots.tables import Col, html_table
from fp4lab.references import SEED_POWER

TITLE = "02 · Power, clocks and energy"
MAX_DURATION_S = 600.0
PER_GPU = [Col("gpu_index", "GPU", "int"), Col("pci_bus_id", "PCI bus id"),
           Col("points", f"points at M <= {gemm_analysis.DECODE_M}", "int"), Col("median_power_w", "median power (W)", "sig"),
           Col("median_sm_clock_mhz", "median SM clock (MHz)", "sig"),
           Col("median_vs_box", "time vs the box's median", "ratio")]


def build(run_dir: str = "", reference_dir: str = "", profile: str = "auto", device: str = "auto", *,
          sample_rate_hz=None, duration_s=None):
    from fp4lab import profiles

    context = open_context(TITLE, run_dir, reference_dir, profile, device,
                           sample_rate_hz=sample_rate_hz, duration_s=duration_s)
    section = profiles.section(context.profile, "power")
    rate = params.check_float("sample_rate_hz", section["sample_rate_hz"] if sample_rate_hz is None
                              else sample_rate_hz, 0, 1000, strict_minimum=True)
    seconds = params.check_float("duration_s", section["duration_s"] if duration_s is None else duration_s,
                                 0, MAX_DURATION_S, strict_minimum=True)
    sampled = sample_if_missing(context, rate, seconds)
    resolve_parameters(context, sample_rate_hz=rate, duration_s=seconds)
    parameters_block(context)
    fill(context, sampled)
    return context.page


def sample_if_missing(context: Context, rate_hz: float, seconds: float) -> str:
    """Sample a steady load into a GPU run that has no telemetry; a sentence on the source."""
    run = context.run
    if run.has_table("telemetry") or context.device == "cpu":
        return ""
    from fp4lab.telemetry.load import sample_steady_load

    import torch

    index = torch.device(context.device).index or 0
    frame, meta = sample_steady_load(seconds, rate_hz, device_index=index)
    if not len(frame):
        return f"No telemetry could be sampled: {meta.get('reason')}."
    with run.lock("notebook 02_power_clocks"):
        run.write_table("telemetry", frame)
        run.update_run_json("telemetry", meta)
    return (f"The run had no telemetry, so this chapter sampled {text.sig(seconds)} s of a steady bf16 "
            f"GEMM load ({text.sig(meta['load_tflops'])} TFLOP/s) at {text.sig(rate_hz)} Hz.")


def fill(context: Context, sampled: str) -> None:
    page = context.page
    power = analysis.run_power(context.run)
    if sampled:
        page.prose("source", sampled)
    elif power.has_telemetry:
        numbers = analysis.timeline_numbers(power)
        page.prose("source", f"This run holds {text.count(numbers['samples'], 'NVML sample')} over "
                             f"{text.sig(numbers['seconds'])} s of its sweep (GPU "
                             f"{text.join([str(gpu) for gpu in numbers['gpus']])}) and "
                             f"{text.count(len(power.points), 'energy window')}, one per measured point.")
    if not power.has_telemetry and not len(power.points):
        reason = power.meta.get("reason") or "this run was measured without a GPU"
        page.note("source", f"No GPU telemetry in this run ({reason}). The reference part of the book "
                            "holds the GPU's power chapter; its key numbers are below.", "note")
        if context.reference is not None:
            page.bullets("findings", findings(analysis.run_power(context.reference.run),
                                              *decode_point(context.reference.run, context.profile)))
        return
    if power.has_telemetry:
        page.figure("timeline", figures.timeline(power.telemetry, power.points, power.power_limit_w),
                    power.caption("shaded spans: the sweep's energy windows, coloured by backend"))
        counts = analysis.reason_counts(power.telemetry["throttle_reasons"])
        total = int(power.telemetry["throttle_reasons"].notna().sum())
        if total:
            shares = {name: count / total for name, count in sorted(counts.items(), key=lambda kv: -kv[1])}
            page.figure("throttle", figures.throttle_reasons(shares, analysis.BENIGN_REASONS),
                        power.caption("clocks-event reasons; grey: idle or none, red: throttling"))
    if len(power.points):
        page.figure("points", figures.per_point(power.points, power.power_limit_w),
                    power.caption("one energy window (aligned to the NVML energy counter) per point; "
                                  "a line is the backend's median over the swept shapes and formats "
                                  "at each M, the band their range; a window shorter than the ~1 s over "
                                  "which the limit is enforced can have a mean above the limit"))
        per_gpu = gemm_analysis.gpu_spread(power.gemm)
        if len(per_gpu) > 1:
            page.html("points", html_table(per_gpu, PER_GPU, caption=power.caption("per GPU at decode M")))
    page.bullets("findings", findings(power, *decode_point(context.run, context.profile)))


def _of_limit(watts, limit) -> str:
    return f" ({text.pct(100 * watts / limit)} of its {text.sig(limit)} W limit)" if limit and watts else ""


# The limiter holds averaged power at the limit, not under it: a peak this close to it is the limit held.
HELD_LIMIT_TOLERANCE = 0.02


def _against_limit(timeline: dict, limit: float | None) -> str:
    """What instant readings above the power limit mean, given where the averaged reading peaked."""
    if not limit or timeline["instant_max_w"] <= limit:
        return ""
    average = timeline["average_max_w"]
    if average > limit * (1 + HELD_LIMIT_TOLERANCE):
        return (f" The ~1 s averaged reading peaked at {text.pct(100 * average / limit)} of the limit: "
                "the limit was not held during the run.")
    peak = ("stayed within it:" if average <= limit else
            f"peaked at {text.pct(100 * average / limit)} of it: the limiter held the GPU at its limit, and")
    return (f" The limit is enforced on averaged power, and the ~1 s averaged reading {peak} readings above "
            "it over shorter spans (instant samples, short energy windows) are bursts.")


def decode_point(run, profile: str) -> tuple[dict | None, dict | None]:
    """The decode GEMMs' power at the point chapter 04 reads, and the diagnosed layer path's own
    energy window where the run has one (both chapter 04's numbers)."""
    from fp4lab.analysis import decode

    d = decode.diagnose(run, decode.DiagnosisConfig.from_profile(profile))
    return d.decode_power, d.chosen_power


def findings(power: analysis.RunPower, at_decode: dict | None = None, own: dict | None = None) -> list[str]:
    lines = []
    timeline = analysis.timeline_numbers(power)
    device = text.md(power.view.device)
    if timeline:
        lines.append(f"On {device}, over {text.sig(timeline['seconds'])} s sampled ({timeline['samples']} "
                     f"samples), instant power ranged {text.sig(timeline['instant_min_w'])}-"
                     f"{text.sig(timeline['instant_max_w'])} W{_of_limit(timeline['instant_max_w'], power.power_limit_w)}, "
                     f"while the ~1 s averaged reading peaked at {text.sig(timeline['average_max_w'])} W: "
                     "the averaged reading lags every burst." + _against_limit(timeline, power.power_limit_w))
        if timeline["busy_samples"]:
            lines.append(f"Under load (GPU utilisation above {analysis.BUSY_UTIL_PCT}%, {timeline['busy_samples']} "
                         f"samples) the SM clock had a median of {text.sig(timeline['busy_clock_median_mhz'], 4)} MHz "
                         f"(range {text.sig(timeline['busy_clock_min_mhz'], 4)}-{text.sig(timeline['busy_clock_max_mhz'], 4)} MHz).")
        if timeline["throttling"]:
            lines.append("Clocks were held back by " + text.join(
                f"{text.md(name)} in {text.pct(100 * share)}" for name, share in timeline["throttling"].items())
                + f" of {timeline['readings']} readings.")
        elif timeline["readings"]:
            lines.append(f"No throttling reason appeared in {timeline['readings']} readings.")
    points = analysis.point_numbers(power)
    if points:
        if at_decode is not None:
            seed = SEED_POWER["watts"] / SEED_POWER["tdp_w"]
            lines.append(f"At decode sizes (M = {text.join(at_decode['m_values'])} on the expert shapes), one "
                         f"{text.md(at_decode['backend'])} GEMM at a time, replayed on its own (the single expert "
                         f"GEMMs chapter 04's loop model reads), the GPU draws "
                         f"{text.sig(at_decode['avg_power_w'])} W (median of {at_decode['points']} windows)"
                         f"{_of_limit(at_decode['avg_power_w'], power.power_limit_w)}; the seed's GPUs drew "
                         f"{SEED_POWER['watts']} W of {SEED_POWER['tdp_w']} W ({text.pct(100 * seed)}) at decode.")
        if own is not None:      # chapter 04's sentence: the fused layer is not the single GEMM above
            from fp4lab.chapters.ch04_diagnosis import own_power_sentence
            lines.append(own_power_sentence(own) + " That window is the energy counter over the path's own "
                         "replays, not one of the sampled readings above, whose timeline it need not fall in.")
        lines.append(f"At the sweep's largest M ({points['largest_m']}), one GEMM at a time, the GPU draws "
                     f"{text.sig(points['largest_w'])} W (median of {points['largest_points']} windows, every "
                     f"backend){_of_limit(points['largest_w'], power.power_limit_w)}.")
        if "best" in points:
            best = points["best"]
            lines.append(f"The most efficient point is {text.md(best['backend'])} at M = {best['m']} on "
                         f"{best['n']}x{best['k']}: {text.sig(best['tflops_per_w'])} TFLOPS/W; the least "
                         f"efficient, {text.md(points['least']['backend'])} at M = {points['least']['m']} on "
                         f"{points['least']['n']}x{points['least']['k']}, reaches "
                         f"{text.sig(points['least_tflops_per_w'])} TFLOPS/W.")
    return lines
