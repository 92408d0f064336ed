"""Run history's noise model (fp4lab.analysis.history): unchanged code is not a regression, a real
slowdown is, and the per-point GPU rule needs both the threshold and the spread.

The first two tests run the real sweep (sweep.gemm.run_sweep, worker processes, the timer) twice
into two run folders of one runs folder, as two nightly runs would, and judge the second against
the first the way `make report` does (report.count_regressions: exit status 3 when non-zero).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fp4lab import report
from fp4lab.analysis import history
from fp4lab.results import REFERENCE_ROOT, RunDir
from fp4lab.sweep import GemmSweep
from fp4lab.sweep import gemm as gemm_sweep

# 20 repeats: with 5, two sweeps of unchanged code on a busy 2-core machine now and then differed
# by the CPU rule's 1.5x at these tiny shapes
FAST = {"repeats": 20, "warmup_s": 0.02, "cold_l2": False, "use_graph": False}


def sweep_into(runs_dir, run_id: str, backends: list[str], shape: list[int], m_values: list[int]) -> RunDir:
    """One tiny real CPU sweep into runs_dir/run_id."""
    config = GemmSweep.from_profile("smoke", "cpu", backends=backends, fmts=["nvfp4"], m_values=m_values,
                                    shapes=[shape], timer=FAST)
    run = RunDir.create(runs_dir, run_id=run_id)
    gemm_sweep.run_sweep(config, run, progress=False)
    return run


def judged(current: RunDir, previous: RunDir) -> history.Comparison:
    comparison = history.compare(current.path, previous.path, "previous")
    assert history.previous_run(current.path, current.path.parent) == previous.path.resolve()
    assert comparison.on_cpu and comparison.same_device
    return comparison


# -- the real sweep, twice ------------------------------------------------------------------------

def test_two_sweeps_of_unchanged_code_flag_no_regression(tmp_path):
    # 512 x 1024: the work, not the per-call overhead (which swings 1.5x on a busy 2-core box at
    # tiny shapes), sets the time
    backends, shape, m_values = ["torch-bf16", "emulated"], [512, 1024], [1, 4, 16, 64]
    flagged = []
    # Seen on the 2-core CI machine: a whole backend 2-2.8x slower or faster for the seconds of
    # one sweep (one worker process), in two pairs running (emulated 1.95x in the second pair).
    # A regression must persist, so a flagged pair is measured again, as an engineer would before
    # believing it, up to three pairs; unchanged code must come out clean in one of them, while a
    # real 4x slowdown is flagged in the single pair of the next test.
    for attempt in "abc":
        first = sweep_into(tmp_path, f"20260101T000000Z-cpu-{attempt}1", backends, shape, m_values)
        second = sweep_into(tmp_path, f"20260101T000000Z-cpu-{attempt}2", backends, shape, m_values)
        comparison = judged(second, first)
        assert len(comparison.ratios) == len(backends) * len(m_values)     # every point compared
        if comparison.regressions.empty:
            break
        flagged.append(comparison.regressions.to_string())
    assert comparison.regressions.empty, "\n".join(flagged)
    assert report.count_regressions(second) == 0


def test_a_four_times_slower_backend_is_flagged_and_only_it(tmp_path, fake_backends_env, monkeypatch):
    from fp4lab.sweep.registry import load_extra_backends

    load_extra_backends()
    # 1024 x 1024: the GEMM, not the per-call overhead, sets the time, so doing it four times shows
    # as ~4x; on a CI box whose 2 cores are shared a 2x slowdown measured as 1.48x, so against the
    # rule's 2x the synthetic regression is 4x
    backends, shape, m_values = ["fake-ok", "fake-slow"], [1024, 1024], [1, 8, 32, 64]
    monkeypatch.setenv("FAKE_SLOWDOWN", "1")
    before = sweep_into(tmp_path, "20260101T000000Z-cpu-a", backends, shape, m_values)
    monkeypatch.setenv("FAKE_SLOWDOWN", "4")
    after = sweep_into(tmp_path, "20260101T000000Z-cpu-b", backends, shape, m_values)
    comparison = judged(after, before)
    assert list(comparison.regressions["backend"]) == ["fake-slow"], comparison.ratios.to_string()
    flagged = comparison.regressions.iloc[0]
    assert flagged["geomean_ratio"] > history.CPU_BACKEND_THRESHOLD and flagged["points"] == len(m_values)
    assert report.count_regressions(after) == 1


# -- the per-point GPU rule on synthetic rows -----------------------------------------------------

GPU = {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": [9, 0], "driver": "580.0"}


def gpu_run(runs_dir, run_id: str, points: dict[int, tuple[float, float, float]], device=GPU,
            status: dict[int, str] | None = None) -> RunDir:
    """A run folder on `device` with one torch-bf16 GEMM row per M: {m: (p20, median, p80) us}."""
    run = RunDir.create(runs_dir, run_id=run_id)
    run.update_run_json(None, {"provenance": {"device": device, "versions": {"torch": "2.11.0"}},
                               "report": {"profile": "full"}})
    run.append_rows("gemm", [
        {"run_id": run_id, "backend": "torch-bf16", "fmt": "nvfp4", "m": m, "n": 4096, "k": 4096,
         "status": (status or {}).get(m, "ok"), "p20_us": p20, "median_us": median, "p80_us": p80,
         "device": "cuda", "gpu_index": 0}
        for m, (p20, median, p80) in points.items()])
    return run


BEFORE = {1: (9.8, 10.0, 10.2), 2: (9.8, 10.0, 10.2), 4: (9.8, 10.0, 10.2), 8: (9.8, 10.0, 10.2),
          16: (9.8, 10.0, 10.2), 32: (9.8, 10.0, 10.2)}
AFTER = {
    1: (11.8, 12.0, 12.2),   # 20% slower, spreads apart: flagged
    2: (10.0, 12.0, 14.0),   # 20% slower, but its fast end reaches the old slow end: noise
    4: (10.4, 10.5, 10.6),   # 5% slower, spreads apart: under the 10% threshold
    8: (8.8, 9.0, 9.2),      # faster
    16: (29.0, 30.0, 31.0),  # 3x slower: flagged, and first (worst first)
    32: (19.0, 20.0, 21.0),  # 2x slower, but a wrong result now: never timed into a ratio
}


@pytest.fixture
def gpu_pair(tmp_path):
    before = gpu_run(tmp_path, "20260101T000000Z-h200-a", BEFORE)
    after = gpu_run(tmp_path, "20260101T000000Z-h200-b", AFTER, status={32: "wrong_result"})
    return before, after


def test_gpu_points_are_flagged_only_beyond_threshold_and_spread(gpu_pair):
    before, after = gpu_pair
    comparison = history.compare(after.path, before.path, "previous", threshold=0.10)
    assert not comparison.on_cpu and comparison.same_device
    assert list(comparison.ratios["m"]) == [1, 2, 4, 8, 16]          # the wrong result is left out
    assert list(comparison.regressions["m"]) == [16, 1]
    assert comparison.regressions["time_ratio"].tolist() == pytest.approx([3.0, 1.2])
    assert report.count_regressions(after) == 2


def test_a_point_faster_beyond_threshold_and_spread_is_named_as_such(gpu_pair):
    from fp4lab.chapters import ch06_history

    before, after = gpu_pair
    comparison = history.compare(after.path, before.path, "previous", threshold=0.10)
    assert list(comparison.improvements["m"]) == [8]                  # 10.0 -> 9.0 us, apart
    assert comparison.improvements["time_ratio"].tolist() == pytest.approx([0.9])
    line, = [line for line in ch06_history.summary(comparison) if "faster" in line]
    assert line.startswith("1 point got faster by over 10%") and "M=8: 10.0 us → 9.00 us" in line
    assert "1 point faster" in ch06_history.findings(history.index_runs(before.path.parent), [comparison])[1]
    assert not len(history.compare(after.path, before.path, "previous", threshold=0.2).improvements)


def test_the_threshold_decides_how_much_slower_counts(gpu_pair):
    before, after = gpu_pair
    strict = history.compare(after.path, before.path, "previous", threshold=0.04)
    assert list(strict.regressions["m"]) == [16, 1, 4]                # 5% now counts
    lenient = history.compare(after.path, before.path, "previous", threshold=1.5)
    assert list(lenient.regressions["m"]) == [16]


def test_gpu_point_without_percentiles_is_judged_on_its_medians(tmp_path):
    nan = math.nan
    before = gpu_run(tmp_path, "20260101T000000Z-h200-a", {1: (nan, 10.0, nan)})
    after = gpu_run(tmp_path, "20260101T000000Z-h200-b", {1: (nan, 13.0, nan)})
    assert list(history.compare(after.path, before.path).regressions["m"]) == [1]


def test_another_gpu_is_compared_but_never_a_regression(tmp_path):
    before = gpu_run(tmp_path, "20260101T000000Z-b200-a", BEFORE, device={**GPU, "name": "NVIDIA B200"})
    after = gpu_run(tmp_path, "20260101T000000Z-h200-b", AFTER)
    comparison = history.compare(after.path, before.path)
    assert not comparison.same_device and len(comparison.regressions)   # ratios of hardware, labelled
    assert report.count_regressions(after) == 0                          # exit 3 is for one device


CPU = {"kind": "cpu", "name": "Intel(R) Xeon(R) Processor"}


@pytest.mark.parametrize("ratios, flagged", [
    ((2.5, 2.5, 2.5, 2.5, 2.5, 2.5), True),      # 2.5x slower throughout
    ((2.6, 2.6, 2.6, 2.6, 2.6, 0.9), True),      # 2.2x overall, 5 of 6 slower
    ((10.0, 1.0, 1.0, 1.0, 1.0, 1.0), False),    # one point 10x (geomean 1.47x): CPU noise
    ((10.0, 10.0, 1.0, 1.0, 1.0, 1.0), False),   # geomean 2.2x, but only 2 of 6 points slower
    ((1.8, 1.8, 1.8, 1.8, 1.8, 1.8), False),     # all slower, by less than 2x: one process's swing
])
def test_the_cpu_rule_needs_a_slow_geomean_and_a_majority(tmp_path, ratios, flagged):
    before = gpu_run(tmp_path, "20260101T000000Z-cpu-a", BEFORE, device=CPU)
    slower = {m: tuple(value * ratio for value in BEFORE[m]) for m, ratio in zip(BEFORE, ratios)}
    after = gpu_run(tmp_path, "20260101T000000Z-cpu-b", slower, device=CPU)
    comparison = history.compare(after.path, before.path)
    assert comparison.on_cpu
    assert list(comparison.regressions["backend"]) == (["torch-bf16"] if flagged else [])


def test_the_runs_table_names_this_run_and_reads_at_a_glance(tmp_path):
    """The reference run's own history page listed it as `local` (where it ran) under a book
    that calls it the reference; long time stamps and unspaced table lists overflowed the page."""
    from fp4lab import text
    from fp4lab.chapters import ch06_history

    runs = tmp_path / "runs"
    for run_id, created in (("20261201T0900Z-a", "2026-12-01T09:00:41+00:00"),
                            ("20261201T1000Z-b", "2026-12-01T11:00:00+01:00")):
        run = RunDir.create(runs, run_id=run_id)
        run.update_run_json(None, {"created": created})
        run.append_rows("gemm", [])
    index = history.index_runs(runs, reference_root=tmp_path / "no-references")
    shown = ch06_history.runs_shown(index, runs / "20261201T1000Z-b")
    assert list(shown["kind"]) == ["local", "this run"] and list(index["kind"]) == ["local", "local"]
    assert list(shown["created"]) == ["2026-12-01 09:00 UTC", "2026-12-01 10:00 UTC"]
    assert text.minute_utc("not a time") == "not a time" and text.minute_utc(None) == text.MISSING
    assert text.short_sha("4e7d1f395a7b12997f55617ab0c1d2e3f4a5b6c7") == "4e7d1f3"
    assert text.short_sha("56d9385c5bdbbcc5ce93a3c0-dirty") == "56d9385-dirty"
    assert text.short_sha("b570ac7+chapters 01/03") == "b570ac7+chapters 01/03"   # already short
    assert text.short_sha("deadbeefcafe label") == "deadbee label" and text.short_sha(None) is None


def test_a_page_rendered_inside_the_reference_folder_lists_each_run_once(tmp_path, monkeypatch):
    references = tmp_path / "reference"
    from fakes.runs import gemm_row

    for run_id in ("20261201T0900Z-a", "20261201T1000Z-b"):
        RunDir.create(references, run_id=run_id).append_rows("gemm", [gemm_row("torch-bf16", 1, 64, 64, 5.0)])
    assert history.previous_run(references / "20261201T1000Z-b", references).name == "20261201T0900Z-a"
    monkeypatch.setattr(history, "REFERENCE_ROOT", references)
    index = history.index_runs(references, reference_root=references)
    assert list(index["kind"]) == ["reference", "reference"]
    assert history.previous_run(references / "20261201T1000Z-b", references) is None


def listed_once(tmp_path, runs: list[tuple[str, str]], this_run: str):
    """Run folders {(root, run id)} under tmp_path ("runs" local, "reference" committed): the index
    and what `without_copies` keeps of it for `this_run` (a folder under runs/)."""
    from fp4lab.chapters import ch06_history

    for root, run_id in runs:
        RunDir.create(tmp_path / root, run_id=run_id).append_rows("gemm", [])
    index = history.index_runs(tmp_path / "runs", reference_root=tmp_path / "reference")
    return index, ch06_history.without_copies(index, tmp_path / "runs" / this_run)


def test_a_committed_copy_of_this_run_is_listed_once(tmp_path):
    """The reference run resumed on the H200 found itself twice, in its run folder and committed."""
    run = "20261201T2000Z-h200-full"
    index, kept = listed_once(tmp_path, [("runs", run), ("reference", run),
                                         ("reference", "20261201T1215Z-h200-full")], run)
    assert sorted(kept["run_id"]) == ["20261201T1215Z-h200-full", run] and len(index) == 3
    assert list(kept.loc[kept["run_id"] == run, "kind"]) == ["local"]


def test_a_local_copy_of_another_reference_run_is_listed_once_as_the_reference(tmp_path):
    """The partial folder a reference run was resumed from, left in runs/ after it was committed."""
    copy, here = "20261201T2315Z-h200-full", "20261202T0000Z-cpu"
    index, kept = listed_once(tmp_path, [("runs", copy), ("reference", copy), ("runs", here)], here)
    assert len(index) == 3 and sorted(zip(kept["run_id"], kept["kind"])) == [
        (copy, "reference"), (here, "local")]
    # nor is it this run's previous local run: it is compared as the reference it is
    assert history.previous_run(tmp_path / "runs" / here, tmp_path / "runs",
                                reference_root=tmp_path / "reference") is None


def ratios_frame(per_backend: dict[str, tuple[float, ...]]) -> pd.DataFrame:
    return pd.DataFrame([{"backend": backend, "time_ratio": ratio}
                         for backend, values in per_backend.items() for ratio in values])


def test_a_busier_cpu_slowing_every_backend_is_not_a_regression():
    """Seen here: a smoke report run while CI's tests shared the 2 cores came out 1.51x
    (emulated), 1.13x and 1.22x slower: the machine, not one backend, changed."""
    busy = ratios_frame({"emulated": (1.6, 1.5, 1.45, 1.5), "tinygemm-int4": (1.1, 1.15, 1.1, 1.15),
                         "torch-bf16": (1.2, 1.25, 1.2, 1.25)})
    assert history.backend_regressions(busy).empty
    everything_twice = ratios_frame({name: (2.0, 2.0, 2.1, 1.9) for name in ("a", "b", "c")})
    assert history.backend_regressions(everything_twice).empty


def test_one_worker_process_slower_by_the_cpus_own_swing_is_not_a_regression():
    """Seen here (two smoke reports 20 minutes apart, nothing changed): emulated, whose calls
    allocate and fault pages, came out 1.57x slower at the median of its 28 points and up to 2.6x,
    while the other backends did not; on the CI box 1.95x. One worker process's speed, not the
    code: under the rule's 2x."""
    swing = ratios_frame({"emulated": (1.33, 1.57, 1.78, 2.59, 1.45, 1.6), "tinygemm-int4": (1.0, 1.2, 1.2, 1.0),
                          "torch-bf16": (0.68, 0.84, 1.01, 0.9)})
    assert history.backend_regressions(swing).empty


def test_one_backend_twice_slower_among_steady_ones_is_flagged_against_them():
    steady_and_slow = ratios_frame({"emulated": (1.0, 1.05, 0.95, 1.0), "torch-bf16": (1.3, 1.25, 1.3, 1.2),
                                    "fake-slow": (2.6, 2.5, 2.7, 2.6)})
    flagged = history.backend_regressions(steady_and_slow)
    assert list(flagged["backend"]) == ["fake-slow"]
    row = flagged.iloc[0]
    assert row["machine_ratio"] == pytest.approx(np.exp(np.log([1.3, 1.25, 1.3, 1.2]).mean()) / 2
                                                 + np.exp(np.log([1.0, 1.05, 0.95, 1.0]).mean()) / 2)
    assert row["beyond_machine"] > history.CPU_BACKEND_THRESHOLD and row["share_slower"] == 1.0


def test_the_runs_table_lists_every_reference_and_the_newest_local_runs():
    """A nightly box keeps months of runs: this box's history page had grown to 45 rows."""
    from fp4lab.chapters import ch06_history

    kinds = ["reference", *["local"] * 14, "reference", *["local"] * 5]
    index = pd.DataFrame({"run_id": [f"run{i:02d}" for i in range(len(kinds))], "kind": kinds})
    listed = ch06_history.recent(index)
    local = listed[listed["kind"] == "local"]
    assert list(listed[listed["kind"] == "reference"]["run_id"]) == ["run00", "run15"]
    assert len(local) == ch06_history.LOCAL_RUNS_LISTED and local["run_id"].iloc[-1] == "run20"
    assert list(listed["run_id"]) == sorted(listed["run_id"])          # still oldest first


def test_runs_are_listed_by_when_they_were_made_not_by_name(tmp_path):
    runs = tmp_path / "runs"
    for run_id, created in (("smoke5", "2026-12-01T09:35:00+00:00"), ("20261201T2155Z-cpu", "2026-12-01T21:55:00+00:00"),
                            ("20261201T1000Z-cpu", "2026-12-01T11:00:00+01:00"), ("no-time", None)):
        run = RunDir.create(runs, run_id=run_id)
        run.update_run_json(None, {"created": created})
    index = history.index_runs(runs, reference_root=tmp_path / "no-references")
    assert list(index["run_id"]) == ["no-time", "smoke5", "20261201T1000Z-cpu", "20261201T2155Z-cpu"]


def test_a_committed_copy_of_this_run_is_not_compared_with_it(tmp_path, monkeypatch):
    """The history chapter of a reference run resumed on the GPU compared it with its own
    committed copy: like `reference_run`, the references skip this run by name."""
    from types import SimpleNamespace

    from fp4lab.chapters import ch06_history

    for run_id in ("20261201T1215Z-h200-full", "20261201T2000Z-h200-full"):
        RunDir.create(tmp_path / "reference", run_id=run_id).append_rows("gemm", [])
    monkeypatch.setattr(ch06_history, "REFERENCE_ROOT", tmp_path / "reference")
    here = RunDir.create(tmp_path / "runs", run_id="20261201T2000Z-h200-full")
    context = SimpleNamespace(run=SimpleNamespace(path=here.path), reference=None)
    assert [p.name for p in ch06_history.compared_references(context, "")] == ["20261201T1215Z-h200-full"]


def test_what_changed_names_the_commits_that_added_rows_later():
    # a reference run re-measured in part at later commits (provenance.later_commits): the page's
    # "what changed" table says so beside the run's own commit, each shortened as git prints it
    later = [{"fp4lab_git_sha": sha, "tables": ["gemm"], "rows": 2, "at": "2026-12-03T17:20:00+00:00"}
             for sha in ("d30e50598fb629af604139074d92eea2e4bab465", "0aa1117", "d30e50598fb629af604139074d92eea2e4bab465")]
    now = {"provenance": {"fp4lab_git_sha": "13f155f0", "later_commits": later}}
    then = {"provenance": {"fp4lab_git_sha": "71b47620"}}
    changes = history.version_changes(now, then).set_index("field")
    assert changes.loc["rows added later at", "now"] == "d30e505, 0aa1117"
    assert pd.isna(changes.loc["rows added later at", "before"])      # none then: the table shows a dash
    assert "rows added later at" not in set(history.version_changes(then, then)["field"])


def test_two_gpu_runs_state_their_diagnosed_paths_then_and_now():
    """Chapter 06 compared 249 GEMM points of the two reference runs but never said that the
    diagnosed layer moved from humming's kernel to fp4lab's: the comparison carries chapter 04's
    path and layer time of each run."""
    import dataclasses

    from fp4lab.analysis import decode
    from fp4lab.chapters import ch06_history
    from fp4lab.results import REFERENCE_ROOT

    config = decode.DiagnosisConfig.from_profile("full")
    now_dir, then_dir = REFERENCE_ROOT / "20261203T1155Z-h200-full", REFERENCE_ROOT / "20261202T1849Z-h200-full"
    diagnosed_now = history.diagnosed_path(RunDir.open(now_dir), config)
    c = dataclasses.replace(history.compare(now_dir, then_dir, "reference"),
                            diagnosed=history.diagnosis_change(diagnosed_now, then_dir, config))
    now = decode.diagnose(now_dir, config).chosen
    assert {k: c.diagnosed["now"][k] for k in ("path", "fmt", "layer_us")} == \
        {"path": now["path"], "fmt": now["fmt"], "layer_us": now["layer_us"]}
    assert c.diagnosed["then"]["path"] == "humming-moe-indexed" and c.diagnosed["then"]["fmt"] == "mxfp4"
    assert c.diagnosed["then"]["layer_us"] > now["layer_us"]
    said = " ".join(ch06_history.summary(c)).replace("\\", "")
    assert "The diagnosed layer (GLM-5 at B=512, chapter 04): humming-moe-indexed (mxfp4) then, " in said
    # a change of path is not the old path made faster: what the old one takes now is said too
    old_now = c.diagnosed["then_path_now_us"]
    assert old_now > now["layer_us"] and f"; humming-moe-indexed (mxfp4) itself takes {old_now / 1000:.2f} ms now)." in said
    assert history.compare(now_dir, then_dir, "reference").diagnosed is None   # asked for only
    assert history.diagnosis_change(None, then_dir, config) is None            # a run without a verdict


@pytest.mark.parametrize("backend", ["torch-fp8", "tinygemm-int4"])
def test_a_point_not_on_fp4_weights_carries_no_format_and_counts_once(backend):
    """The sweep runs torch-fp8 and tinygemm (int4) once per swept format, on that format's weights
    converted to their own dtype: compared, the two rows are one point with no format (chapter 06
    once said "torch-fp8 mxfp4", and gave tinygemm's points a format chapter 01 does not)."""
    ratios = history.point_ratios(RunDir.open(REFERENCE_ROOT / "20261203T1155Z-h200-full"),
                                  RunDir.open(REFERENCE_ROOT / "20261202T1849Z-h200-full"))
    other = ratios[ratios["backend"] == backend]
    assert len(other) and other["fmt"].isna().all()
    assert not other.duplicated(["m", "n", "k"]).any()
    fp4 = ratios[ratios["backend"] == "triton-w4a16"]
    assert set(fp4["fmt"]) == {"nvfp4", "mxfp4"}
