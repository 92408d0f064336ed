"""Chapter 02's timeline of a resumed run: the reference run's sessions sat 30 minutes apart and
the figure drew straight lines across the pause (an SM-clock diagonal from 2000 to 330 MHz)."""

import numpy as np
import pandas as pd
import pytest

from fp4lab.plots import power


def telemetry(times) -> pd.DataFrame:
    return pd.DataFrame({"t": times, "gpu": 0, "power_instant_w": 300.0, "power_avg_w": 290.0,
                         "sm_clock_mhz": 1980.0})


def test_a_pause_is_cut_to_a_marked_gap_and_no_line_crosses_it():
    times = np.concatenate([np.arange(100.0, 110.0, 0.05), np.arange(2000.0, 2010.0, 0.05)])
    axis = power.SampledTime(pd.Series(times))
    assert axis(100.0) == 0.0
    assert axis(2000.0) == pytest.approx(axis(109.95) + power.GAP_SHOWN_S)
    assert list(axis.cuts()) == pytest.approx([axis(2000.0) - power.GAP_SHOWN_S / 2])
    points = pd.DataFrame({"backend": ["torch-bf16"], "window_start_s": [2001.0], "window_end_s": [2002.0]})
    fig = power.timeline(telemetry(times), points, 700.0)
    clock = fig.axes[1]
    drawn = [line for line in clock.get_lines() if line.get_label() == "SM clock" or line.get_label().startswith("_")]
    spans = [np.ptp(line.get_xdata()) for line in drawn if len(line.get_xdata()) > 2]
    assert len(spans) == 2 and max(spans) < 10.0          # one line per session, none across the pause
    assert "pauses between sessions cut" in clock.get_xlabel()


def test_an_unbroken_run_keeps_plain_seconds():
    axis = power.SampledTime(pd.Series(np.arange(0.0, 30.0, 0.05)))
    assert len(axis.starts) == 0 and axis(12.5) == pytest.approx(12.5)
    fig = power.timeline(telemetry(np.arange(0.0, 30.0, 0.05)), pd.DataFrame(
        columns=["backend", "window_start_s", "window_end_s"]), None)
    assert fig.axes[1].get_xlabel() == "seconds of sampling since the first sample"


def test_a_backend_keeps_its_colour_from_figure_to_figure():
    """Chapter 01 drew triton-w4a16 brown in one figure and purple in the next, and torch-fp8
    in that purple: colours are the backend's, not its place in a figure's legend."""
    from fp4lab.backends import names
    from fp4lab.plots.common import BACKEND_COLOUR_ORDER, backend_palette

    assert set(names()) <= set(BACKEND_COLOUR_ORDER), "a new backend needs its place in BACKEND_COLOUR_ORDER"
    every = backend_palette(names())
    assert len(set(every.values())) == len(every)                       # distinct across all backends
    some = backend_palette(["triton-w4a16", "torch-bf16"])
    assert some["triton-w4a16"] == every["triton-w4a16"] and some["torch-bf16"] == every["torch-bf16"]
    assert backend_palette(["a-new-backend"])["a-new-backend"] not in every.values()


def test_the_seconds_sampled_leave_the_pause_between_sessions_out():
    """A CPU page quoted the reference run's telemetry as "110285 s sampled (21947 samples)": the
    span from its first session to a re-sweep a day later."""
    from fp4lab.analysis.power import sampled_seconds

    times = np.concatenate([np.arange(100.0, 110.0, 0.05), np.arange(90_000.0, 90_004.0, 0.05)])
    frame = telemetry(times)
    assert sampled_seconds(frame) == pytest.approx(9.95 + 3.95)
    two_gpus = pd.concat([frame, telemetry(np.arange(0.0, 2.0, 0.05)).assign(gpu=1)])
    assert sampled_seconds(two_gpus) == pytest.approx(9.95 + 3.95)   # the longest-sampled GPU


def test_a_window_measured_while_no_telemetry_was_kept_is_not_drawn_at_a_far_place():
    """The reference run's page drew its 1098 s of sampling in the first fortieth of an axis 40000
    s long: four re-measured points' windows lay in a pause between sessions."""
    times = np.concatenate([np.arange(100.0, 110.0, 0.05), np.arange(2000.0, 2010.0, 0.05)])
    axis = power.SampledTime(pd.Series(times))
    assert list(axis.sampled([101.0, 109.0, 500.0, 2005.0, 3000.0])) == [True, True, False, True, False]
    points = pd.DataFrame({"backend": ["torch-bf16", "torch-fp8"], "window_start_s": [2001.0, 40_000.0],
                           "window_end_s": [2002.0, 40_001.0]})
    fig = power.timeline(telemetry(times), points, 700.0)
    assert fig.axes[1].get_xlim()[1] < 30.0
    assert any("1 energy window measured outside" in t.get_text() for t in fig.axes[1].texts)
