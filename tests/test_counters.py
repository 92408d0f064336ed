"""The committed Nsight Compute profile read into one row per kernel launch, what the chapter
says from it, and the errors a broken profile folder gets."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from fp4lab import text
from fp4lab.analysis import counters

REPO = os.path.join(os.path.dirname(__file__), "..")
PROFILE = os.path.join(REPO, "results", "measurements", "20261202T0215Z-h200-ncu")
PEERS = os.path.join(REPO, "results", "measurements", "20261202T0230Z-h200-ncu-humming")
CUDA = os.path.join(REPO, "results", "measurements", "20261202T1849Z-h200-ncu-cuda")
MOE_H200 = os.path.join(REPO, "results", "measurements", "20261206T2231Z-h200-ncu-cuda")
CUDA_BUILDS = os.path.join(REPO, "results", "measurements", "20261202T0740Z-h200-ncu-cuda-builds")
M64 = os.path.join(REPO, "results", "measurements", "20261207T1040Z-h100-ncu-m64")


def test_the_committed_profile_reads_as_one_row_per_launch():
    profile = counters.read_counters(PROFILE)
    table = profile.table.set_index("launch")
    assert len(table) == 8 and profile.device == "NVIDIA H200"
    full = table.loc["dense 8192x8192 M=1 full"]
    assert full["us"] == pytest.approx(21.152) and full["registers"] == 171
    # 8.44 M warp instructions x 32 lanes over 67.1 M weights
    assert full["instr_per_weight"] == pytest.approx(8_441_280 * 32 / 8192**2)
    assert full["stalls"].startswith("long scoreboard 0.67") and "selected" not in full["stalls"]
    assert table.loc["moe glm-5 B=512 gate_up", "l2_over_dram"] == pytest.approx(8_297_289_888 / 3_687_810_304)
    assert table["instr_per_weight"].isna().sum() == 2           # routing and the top-k sum read no weights


def test_findings_come_from_the_rows():
    ours, humming = counters.read_counters(PROFILE), counters.read_counters(PEERS)
    assert ours.issue_slots_per_ns == pytest.approx(132 * 4 * 1.98)      # from ncu's device attributes
    bound, dense, moe, peer_dense, peer_moe = counters.counters_findings([ours, humming], 4.24)
    assert "4.0 instructions per weight" in dense and "49% of cycles" in dense and "11% of warp" in dense
    assert "39% of Nsight Compute's DRAM peak" in dense and "reaches 69%" in dense
    # 4.0 instructions per weight is under the 4.4 at which issuing takes the read time: no claim
    assert "set its time" not in dense
    assert "its instructions, not its bytes, set its time" in peer_dense     # 4.7 >= 4.4
    assert moe.startswith("fp4lab's Triton fused MoE (triton-w4a16-moe)")
    assert "gate\\_up 1.56 ms" in moe and "4.6 instructions" in moe
    # each launch's stalls, as the front page quotes the diagnosed kernel's
    assert "2.2x its DRAM bytes; stall cycles per instruction: not selected 1.38, barrier 1.07, wait 0.82;" in moe
    assert peer_dense.startswith("humming\\-w4a16") and "4.7 instructions per weight" in peer_dense
    assert peer_moe.startswith("Humming's MoE GEMMs") and "torch kernels between its GEMMs take 228 us" in peer_moe
    # 32 lanes x 4.18e12 warp instructions/s x 0.5625 B / 4.24e12 B/s
    assert "run 4.0-5.0 instructions per weight" in bound and "At 4.44 instructions" in bound
    assert "the copy bandwidth measured in this run (4.24 TB/s)" in bound
    assert ("5 of the 7 GEMM launches (the anatomy's loads-only and stream builds left out) issue more than "
            "that: their instructions bound them") in bound
    # the leanest (4.0) waits on loads for 0.67 cycles an instruction: too little to say so
    assert "The leanest, dense 8192x8192 M=1 full" in bound and "waits on its global loads" not in bound
    spec = counters.counters_findings([ours])[0]                        # no run bandwidth: the spec's
    assert "the spec sheet's bandwidth (4.80 TB/s)" in spec and "At 3.92 instructions" in spec
    # a CPU page states the threshold of the run shown beside it, measured on the profiles' GPU
    beside = counters.counters_findings([ours], 4.24, "run 20261203T1155Z-h200-full")[0]
    assert "the copy bandwidth measured in run 20261203T1155Z-h200-full (4.24 TB/s)" in beside


def test_a_kernel_under_the_break_even_is_named_with_what_it_waits_on():
    profiles = [counters.read_counters(folder) for folder in (PROFILE, PEERS, CUDA)]
    bound = counters.instruction_bound(profiles, 4.27)
    assert "(fp4lab's Triton kernels, humming and fp4lab's CUDA kernels) run 2.9-5.0" in bound
    assert "6 of the 9 GEMM launches (the anatomy's loads-only and stream builds left out) issue more" in bound
    assert "The leanest, cuda\\-w4a16 8192x8192 M=1 (fp4lab's CUDA kernels), issues 2.9 instructions per weight, on 50% of its cycles" in bound
    assert "largest stall is long scoreboard (3.30 cycles per instruction issued)" in bound
    assert "waits on its global loads" in bound
    # the slots counted, with the clock they assume (the power cap's slower clock has fewer)
    first = profiles[0].table.iloc[0]
    assert (f"schedulers ({int(first['sms'])} SMs x 4 at its {first['clock_khz'] / 1000:.0f} MHz max SM clock) "
            "takes as long as") in bound
    every = counters.instruction_bound([counters.read_counters(PEERS)], 4.27)   # humming alone
    assert "every launch issues more" in every and "the kernels' instructions" in every


def test_a_kernels_own_launches_say_what_holds_their_warps_back():
    """The fused MoE profiled on the H200 (call 127): its launches in the format asked for, their
    common point named once; every format's launches where none is in that format."""
    moe = [counters.read_counters(MOE_H200)]
    mxfp4 = counters.kernel_sentence(moe, "cuda-w4a16-moe", "mxfp4")
    assert mxfp4.startswith("cuda\\-w4a16\\-moe, profiled (mxfp4 glm\\-5 B=512: "
                            "gate\\_up 1.10 ms, down 573 us), issues 3.3-3.4 instructions per weight "
                            "with its issue slots busy on 65-66% of cycles, and reads DRAM at 64-66% of "
                            "Nsight Compute's DRAM peak")
    assert "largest stalls are 'not selected' (2.20 cycles per instruction issued) and 'math pipe throttle' (2.08)" \
        in mxfp4 and mxfp4.endswith("not for their loads.")
    every = counters.kernel_sentence(moe, "cuda-w4a16-moe", "fp8", subject="It")
    assert every.startswith("It, profiled (mxfp4 glm\\-5 B=512 gate\\_up 1.10 ms, mxfp4 glm\\-5 B=512 down") \
        and "nvfp4 glm\\-5 B=512 down 594 us), issues 3.3-3.5" in every
    assert counters.kernel_sentence(moe, "humming-moe-indexed") is None
    # a launch held back by its loads is not called issue-bound
    dense = counters.kernel_sentence(moe, "cuda-w4a16", "nvfp4")
    assert "'long scoreboard' (3.63 cycles per instruction issued)" in dense and "not for their loads" not in dense


def test_a_kernel_under_the_line_held_back_by_its_issue_rate_says_so():
    """The fused MoE issues fewer instructions per weight than the break-even, but on two thirds of
    its cycles: at that rate they take longer than its weights' read (call 127's profile)."""
    moe = [counters.read_counters(MOE_H200)]
    # the break-even of MXFP4's bytes (a code and 1/32 of an e8m0 scale: 0.53125 B a weight)
    even = counters.break_even(moe, 4.24, fmt="mxfp4")[0]
    assert even == pytest.approx(counters.break_even(moe, 4.24)[0] * 0.53125 / 0.5625)
    rate = counters.issue_rate_sentence(moe, "cuda-w4a16-moe", "mxfp4", 4.24, "The kernel")
    rows = moe[0].table[moe[0].table["launch"].str.contains("cuda-w4a16-moe mxfp4") & (moe[0].table["weights"] > 0)]
    at_rate = [r.instr_per_weight / (r.issue_pct / 100) for r in rows.itertuples()]
    assert len(at_rate) == 2 and all(r.instr_per_weight < even < v for r, v in zip(rows.itertuples(), at_rate))
    low, high = min(at_rate), max(at_rate)
    assert rate == (f"The kernel needs fewer than {even:.2f} instructions per weight with MXFP4 weights (3.3-3.4), "
                    f"but it issues on only 65-66% of its cycles: at that rate they take as long as "
                    f"{low:.1f}-{high:.1f} would on every slot, {text.span([low / even, high / even], lambda v: f'{v:.1f}x')} "
                    "the time of reading its weights, so its instructions, more than its loads, set its time.")
    assert 1 < low / even < high / even < 1.3
    # a kernel that waits on its loads, one over the line (a faster read), one whose instructions
    # fit in a slower read, and one never profiled: nothing to say
    assert counters.issue_rate_sentence(moe, "cuda-w4a16", "nvfp4", 4.24) is None
    assert counters.issue_rate_sentence(moe, "cuda-w4a16-moe", "mxfp4", 12.0) is None
    assert counters.issue_rate_sentence(moe, "cuda-w4a16-moe", "mxfp4", 2.0) is None
    assert counters.issue_rate_sentence(moe, "humming-moe-indexed", None, 4.24) is None


def test_find_profiles_picks_the_newest_of_each_kind_or_the_named_or_none(tmp_path):
    kinds = {"20261201T0000Z-a": "fp4lab", "20261202T0000Z-b": "fp4lab", "20261202T0100Z-p": "humming",
             "20261203T0000Z-c": None,                                  # c holds no profile
             "20261204T0000Z-t": "fp4lab"}                              # t: tuning, not for the book
    for name, kind in kinds.items():
        (tmp_path / name).mkdir()
        if kind:
            (tmp_path / name / "raw.csv").write_text("")
            (tmp_path / name / "launches.json").write_text("[]")
            info = {"profiled": kind, **({"for_book": False} if name.endswith("-t") else {})}
            (tmp_path / name / "run.json").write_text(json.dumps(info))
    assert [f.name for f in counters.find_profiles("", tmp_path)] == ["20261202T0000Z-b", "20261202T0100Z-p"]
    assert counters.find_profiles("none", tmp_path) == []
    named = f"{tmp_path / '20261201T0000Z-a'}, {tmp_path / '20261202T0100Z-p'}"
    assert [f.name for f in counters.find_profiles(named, tmp_path)] == ["20261201T0000Z-a", "20261202T0100Z-p"]
    with pytest.raises(counters.CountersError, match="no raw.csv there"):
        counters.find_profiles(str(tmp_path / "20261203T0000Z-c"), tmp_path)
    assert counters.find_profiles("", tmp_path / "absent") == []


def test_a_profile_whose_launches_disagree_with_ncu_says_so(tmp_path):
    broken = tmp_path / "p"
    shutil.copytree(PROFILE, broken)
    launches = json.loads((broken / "launches.json").read_text())
    (broken / "launches.json").write_text(json.dumps(launches[:-1]))
    with pytest.raises(counters.CountersError, match="8 kernel rows in raw.csv but 7 launches"):
        counters.read_counters(broken)
    (broken / "run.json").unlink()
    with pytest.raises(counters.CountersError, match="no run.json"):
        counters.read_counters(broken)


def test_a_value_that_is_not_a_number_is_named(tmp_path):
    broken = tmp_path / "p"
    shutil.copytree(PROFILE, broken)
    raw = (broken / "raw.csv").read_text().replace('"21,152"', '"n/a"')   # .avg .max .min .sum
    (broken / "raw.csv").write_text(raw)
    with pytest.raises(counters.CountersError, match="'n/a' is not a number"):
        counters.read_counters(broken)


# the driver as it is now against the newest profile of each flag, and of named builds
@pytest.mark.parametrize("flags,folder", [([], PROFILE), (["--peers"], PEERS), (["--cuda"], CUDA),
                                          (["--cuda", "--cuda-builds", "g16d4w8,g16d4w16"], CUDA_BUILDS),
                                          (["--m64"], M64)])
def test_the_driver_describes_the_launches_the_profile_holds(tmp_path, flags, folder):
    out = tmp_path / "launches.json"
    run = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "ncu_profile.py"),
                          "--describe", "--launches", str(out), *flags],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.join(REPO, "src")})
    assert run.returncode == 0, run.stderr[-2000:]
    plan, profiled = json.loads(out.read_text()), json.loads(open(os.path.join(folder, "launches.json")).read())
    assert plan[:len(profiled)] == profiled
    if flags == ["--cuda"] and len(plan) > len(profiled):
        # the presets' profile now also holds cuda-w4a16-moe's call in each format (four launches
        # each), which the committed dense-only profile predates
        moe = plan[len(profiled):]
        assert [row["launch"].split()[1] for row in moe] == ["mxfp4"] * 4 + ["nvfp4"] * 4
        assert [row["kernel"] for row in moe[:4]] == ["route", "fused MoE", "fused MoE", "torch.sum"]
        assert moe[1]["weights"] == 2 * moe[2]["weights"] > 0 and moe[0]["weights"] == moe[3]["weights"] == 0
    elif flags == ["--m64"] and len(plan) > len(profiled):
        # the M=64 profile now ends with the Triton preset's two-warpgroup twin, which the
        # committed profile predates: the preset's tile with 8 warps
        (twin,) = plan[len(profiled):]
        preset = next(row["kernel"] for row in plan if row["launch"] == "triton-w4a16 8192x8192 M=64")
        assert twin["kernel"] == preset.replace(" w4 ", " w8 ") != preset
    else:
        assert len(plan) == len(profiled)


@pytest.mark.parametrize("builds,message", [("g16d4", "is not g<groups>d<depth>w<warps>"),
                                             ("g8d16w4", "depth (16) cannot exceed groups (8)")])
def test_the_driver_names_a_build_it_cannot_make(tmp_path, builds, message):
    run = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "ncu_profile.py"), "--cuda",
                          "--cuda-builds", builds, "--describe", "--launches", str(tmp_path / "l.json")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.join(REPO, "src")})
    assert run.returncode != 0 and message in run.stderr and not (tmp_path / "l.json").exists()


def test_the_page_shows_the_weight_readers_and_one_row_for_the_rest():
    shown = counters.shown_rows(counters.read_counters(PEERS))
    assert list(shown["launch"][:2]) == ["humming-w4a16 8192x8192 M=1", "humming-moe-indexed glm-5 B=512 gate_up"]
    rest = shown.iloc[-1]
    assert rest["launch"].startswith("5 launches that read no weights") and len(shown) == 4
    assert rest["us"] == pytest.approx(24.096 + 24.352 + 71.04 + 73.632 + 34.496)
