"""Chapter 01's anatomy section from a table like `analysis.gemm.anatomy` returns: the stream
stage's line and column appear when the run timed it and not when it did not (older runs); the
CUDA kernel's nested stages are stated step by step; with two kernels dissected, the faster one
leads and the other is stated against it."""

import numpy as np
import pandas as pd

from fp4lab.analysis import gemm as analysis
from fp4lab.chapters import ch01_gemm


def table(stream: float) -> pd.DataFrame:
    """The Triton kernel's row (no "mma" stage)."""
    row = {"backend": "triton-w4a16", "fmt": "nvfp4", "n": 8192, "k": 8192, "m": 1, "stream": stream,
           "load": 14.7, "decode": 23.4, "math": 36.4, "mma": np.nan, "full": 20.2, "decode_x2": 38.2,
           "copy_floor_us": 8.9, "launch_floor_us": 2.2}
    return finish(pd.DataFrame([row]))


def cuda_table() -> pd.DataFrame:
    """The CUDA kernel at M=1 and 16 as call 60 measured it (NOTES.md): nested stages."""
    common = {"backend": "cuda-w4a16", "fmt": "nvfp4", "n": 8192, "k": 8192, "stream": 10.36, "math": np.nan,
              "decode_x2": np.nan, "launch_floor_us": 2.2}
    return finish(pd.DataFrame([
        {**common, "m": 1, "load": 9.01, "decode": 9.09, "mma": 9.40, "full": 10.96, "copy_floor_us": 8.90},
        {**common, "m": 16, "load": 10.81, "decode": 11.09, "mma": 14.46, "full": 16.48, "copy_floor_us": 8.94}]))


def finish(frame: pd.DataFrame) -> pd.DataFrame:
    frame["load_share"] = 100 * frame["load"] / frame["full"]
    return frame[["backend", "fmt", "n", "k", "m", *analysis.ANATOMY_STAGES, "copy_floor_us",
                  "launch_floor_us", "load_share"]]


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
    note = ch01_gemm.paths_note(wide.reset_index())
    assert note == ("; tiles moved by TMA at 8192x8192 M=1 (nvfp4, mxfp4), by cp.async in the "
                    "other rows")
    assert ch01_gemm.paths_note(table(10.2)) == ""                # a run without the column
    assert [analysis.load_path(v) for v in ("dot m16n64k256 s2 w4 st3 swap ptx", None)] == ["cp.async", "—"]
    assert analysis.load_path("dot m16n128k256 s4 w4 st3 swap ptx tma tiles") == "TMA from tile-ordered bytes"
    three = wide.reset_index().assign(loads=["TMA from tile-ordered bytes"] + ["TMA"] + ["cp.async"] * (len(wide) - 2))
    first, second = three.iloc[0], three.iloc[1]
    assert ch01_gemm.paths_note(three) == (
        f"; tiles moved by TMA from tile-ordered bytes at {first.n}x{first.k} M={first.m} ({first.fmt}); "
        f"by TMA at {second.n}x{second.k} M={second.m} ({second.fmt}); by cp.async in the other rows")


def test_nested_stages_are_stated_step_by_step_at_each_m():
    lines = ch01_gemm.anatomy_findings(cuda_table())
    steps, = [line for line in lines if line.startswith("Stage by stage")]
    assert ("the loads 9.01 us, the decode +0.080 us, the MMAs +0.31 us, the split-K reduction +1.6 us "
            "(the full kernel, 11.0 us)") in steps
    assert steps.endswith("after the loads, the split-K reduction costs most.")
    sixteen, = [line for line in lines if line.startswith("At M=16")]
    assert "16.5 us" in sixteen and "the MMAs +3.4 us" in sixteen and "the split-K reduction +2.0 us" in sixteen
    assert sixteen.endswith("after the loads, the MMAs cost most.")
    assert not any("decode without math" in line for line in lines)     # the Triton kernel's words


def test_the_faster_kernel_leads_and_the_other_is_stated_against_it():
    both = pd.concat([table(10.36), cuda_table()], ignore_index=True)
    assert analysis.anatomy_kernel(both) == "cuda-w4a16"       # 10.96 against 20.2 at the shared point
    other, = ch01_gemm.other_kernel_lines(both, "cuda-w4a16")
    assert other.startswith("`triton-w4a16`") and "20.2 us" in other and "1.8x" in other and "14.7 us" in other
    slower = both.assign(full=np.where(both["backend"] == "cuda-w4a16", 30.0, both["full"]))
    assert analysis.anatomy_kernel(slower) == "triton-w4a16"
    assert analysis.anatomy_kernel(both.iloc[0:0]) is None


def test_the_cuda_kernels_rows_name_its_load_path():
    """Each kernel has its own table: the CUDA kernel's caption says how it reads its weights."""
    rows = cuda_table().assign(loads=[analysis.load_path("cuda g8 d4 w16 k1 b2 pdl-all")] * 2)
    assert ch01_gemm.paths_note(rows) == "; tiles moved by 16-byte loads to registers in every row"
    assert analysis.load_path("") == "cp.async" and analysis.load_path(None) == "—"


def test_the_cuda_kernels_rows_say_how_each_adds_its_split_k():
    """The 1155Z reference run's presets: teams cover K=2048 at every M (call 74), float atomics
    elsewhere (at 4096x6144 M=1 since call 80's team build: 384 CTAs, 3 splits); a thread-block
    cluster adds the splits of a build that names one (the preset at 4096x6144 M=4, call 66)."""
    import os

    run = os.path.join(os.path.dirname(__file__), "..", "results", "reference", "20261203T1155Z-h200-full")
    wide = analysis.anatomy(analysis.gemm_results(run))
    cuda = wide[wide["backend"] == "cuda-w4a16"].set_index(["fmt", "n", "k", "m"])["reduction"]
    assert cuda[("nvfp4", 6144, 2048, 1)] == "no split-K (one CTA covers K)"
    assert cuda[("nvfp4", 4096, 6144, 1)] == "split-K added by float atomics at L2"
    assert analysis.reduction_path("cuda g16 d4 w16 k1 b2 c6 pdl-tail", 6144) == \
        "split-K added in a 6-CTA cluster (distributed shared memory)"
    assert cuda[("nvfp4", 6144, 2048, 16)] == "no split-K (one CTA covers K)"
    assert cuda[("nvfp4", 8192, 8192, 16)] == "split-K added by float atomics at L2"
    assert set(wide.loc[wide["backend"] == "triton-w4a16", "reduction"]) == {"—"}    # not said for Triton
    note = ch01_gemm.paths_note(wide[wide["backend"] == "cuda-w4a16"])
    assert note == ("; tiles moved by 16-byte loads to registers in every row"
                    "; no split-K (one CTA covers K) at 6144x2048 M=1 (nvfp4), 6144x2048 M=16 (nvfp4); "
                    "split-K added by float atomics at L2 in the other rows")
    lines = ch01_gemm.anatomy_findings(wide[wide["backend"] == "cuda-w4a16"].reset_index(drop=True))
    assert lines[-1].startswith("At 4096x6144 M=1 (nvfp4), 6144x2048 M=1 (nvfp4), 6144x2048 M=16 (nvfp4) "
                                "a variant that leaves stages out is slower than the full kernel")
    assert ch01_gemm.unnested_points(wide[(wide["backend"] == "cuda-w4a16") & (wide["n"] == 8192)]) == []
    assert analysis.reduction_path("cuda g8 d4 w16 k1 b2 c4 pdl-tail", 512) == "no split-K (one CTA covers K)"
    assert analysis.reduction_path(None, 8192) == analysis.reduction_path("dot m16 tma", 8192) == "—"
