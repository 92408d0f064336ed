"""Chapter 01's anatomy section from a table like `analysis.gemm.anatomy` returns: the stream
stage's line and column appear when the run timed it and not when it did not (older runs)."""

import numpy as np
import pandas as pd

from fp4lab.analysis import gemm as analysis
from fp4lab.chapters import ch01_gemm


def table(stream: float) -> pd.DataFrame:
    row = {"fmt": "nvfp4", "n": 8192, "k": 8192, "m": 1, "stream": stream, "load": 14.7,
           "decode": 23.4, "math": 36.4, "full": 20.2, "decode_x2": 38.2, "copy_floor_us": 8.9,
           "launch_floor_us": 2.2}
    frame = pd.DataFrame([row])
    frame["load_share"] = 100 * frame["load"] / frame["full"]
    return frame[["fmt", "n", "k", "m", *analysis.ANATOMY_STAGES, "copy_floor_us", "launch_floor_us",
                  "load_share"]]


def test_a_timed_stream_gets_its_line_and_column():
    lines = ch01_gemm.anatomy_findings(table(10.2))
    stream, = [line for line in lines if "as a stream" in line]
    assert "10.2 us" in stream and "87%" in stream          # 8.9 / 10.2 of the copy bandwidth
    assert "1.4x it" in stream and "kernel 2.0x" in stream    # load 14.7 / 10.2, full 20.2 / 10.2
    assert "stream" in [c.source for c in ch01_gemm.anatomy_columns(table(10.2))]


def test_a_run_without_the_stream_stage_has_neither():
    old = table(np.nan)
    assert not any("as a stream" in line for line in ch01_gemm.anatomy_findings(old))
    sources = [c.source for c in ch01_gemm.anatomy_columns(old)]
    assert "stream" not in sources and "load" in sources and "full" in sources


def test_a_second_m_gets_its_line_against_the_first():
    """Issue 13 dissects the kernel at M=1 and 16: the larger M is stated against the M=1 time of
    the same shape and format."""
    one = table(10.2)
    sixteen = one.assign(m=16, full=30.0, load=16.0, decode=33.0, copy_floor_us=9.0)
    lines = ch01_gemm.anatomy_findings(pd.concat([one, sixteen], ignore_index=True))
    line, = [line for line in lines if line.startswith("At M=16")]
    assert "30.0 us" in line and "1.5x its M=1 time" in line and "16.0 us" in line and "9.00 us" in line


def test_each_row_says_how_its_kernel_moved_the_tiles():
    """The committed H200 reference timed the anatomy with the presets: TMA at 8192x8192 M=1,
    cp.async at M=16 (benchmarks/NOTES.md, call 31); the table says which, per row."""
    import os

    run = os.path.join(os.path.dirname(__file__), "..", "results", "reference", "20261201T2315Z-h200-full")
    wide = analysis.anatomy(analysis.gemm_results(run)).set_index(["fmt", "n", "k", "m"])
    assert wide.loc[("nvfp4", 8192, 8192, 1), "loads"] == "TMA"
    assert wide.loc[("nvfp4", 8192, 8192, 16), "loads"] == "cp.async"
    note = ch01_gemm.load_paths_note(wide.reset_index())
    assert note == ("; tiles moved by TMA at 8192x8192 M=1 (nvfp4, mxfp4), by cp.async in the "
                    "other rows")
    assert ch01_gemm.load_paths_note(table(10.2)) == ""                # a run without the column
    assert [analysis.load_path(v) for v in ("dot m16n64k256 s2 w4 st3 swap ptx", None)] == ["cp.async", "—"]
    assert analysis.load_path("dot m16n128k256 s4 w4 st3 swap ptx tma tiles") == "TMA from tile-ordered bytes"
    three = wide.reset_index().assign(loads=["TMA from tile-ordered bytes"] + ["TMA"] + ["cp.async"] * (len(wide) - 2))
    first, second = three.iloc[0], three.iloc[1]
    assert ch01_gemm.load_paths_note(three) == (
        f"; tiles moved by TMA from tile-ordered bytes at {first.n}x{first.k} M={first.m} ({first.fmt}); "
        f"by TMA at {second.n}x{second.k} M={second.m} ({second.fmt}); by cp.async in the other rows")
