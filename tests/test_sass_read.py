"""fp4lab.analysis.sass: a committed SASS read of the Triton kernel's builds, joined with the builds
a run timed by their labels, and the sentence chapter 01 states from it."""

import json

import pandas as pd
import pytest

from fp4lab.analysis import sass

TMA_64 = "dot m64n128k128 s4 w4 st3 swap ptx tma"
TMA_256 = "dot m128n64k128 s1 w4 st3 swap ptx tma"


def write_read(folder, rows, read=sass.READ_KIND, triton="3.6.0"):
    folder.mkdir(parents=True)
    (folder / "sass.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "read": read, "provenance": {
        "triton": triton, "machine": "NVIDIA H100 80GB HBM3"}}))
    return folder


def row(m, build, hgmma, waited, n=8192, k=8192, fmt="nvfp4"):
    return {"fmt": fmt, "n": n, "k": k, "m": m, "build": build, "hgmma": hgmma, "waited": waited}


def own(m, build, kernel="triton-w4a16", n=8192, k=8192, fmt="nvfp4"):
    return {"fmt": fmt, "n": n, "k": k, "m": m, "own": kernel, "own_build": build}


def test_the_newest_read_is_found_and_other_folders_are_not(tmp_path):
    write_read(tmp_path / "20261207T0810Z-h100-triton-sass", [row(64, TMA_64, 16, 16)])
    newest = write_read(tmp_path / "20261208T0100Z-h200-triton-sass", [row(64, TMA_64, 16, 0)])
    (tmp_path / "20261209T0000Z-h200-probe").mkdir()                   # a probe folder: no sass.jsonl
    write_read(tmp_path / "20261209T0100Z-h100-humming-sass", [row(64, "humming", 56, 28)],
               read="humming-sass")                                     # another kernel's read
    assert sass.find_sass_read(tmp_path) == newest
    assert sass.find_sass_read(tmp_path / "absent") is None


@pytest.mark.parametrize("read, rows, says", [
    ("ncu", [row(64, TMA_64, 16, 16)], 'does not say "read": "triton-sass"'),
    (sass.READ_KIND, [{"fmt": "nvfp4", "m": 64}], "lacks n, k, build, hgmma, waited"),
])
def test_a_folder_that_is_not_a_sass_read_says_why(tmp_path, read, rows, says):
    folder = write_read(tmp_path / "x", rows, read=read)
    with pytest.raises(sass.SassReadError, match=says):
        sass.read_sass(folder)


def test_a_read_is_said_only_of_the_build_the_run_timed(tmp_path):
    """A read of another build at the same point (a preset since changed) says nothing of it."""
    read = sass.read_sass(write_read(tmp_path / "r", [row(64, TMA_64, 16, 16), row(256, TMA_256, 8, 8)]))
    timed = pd.DataFrame([own(64, TMA_64), own(64, TMA_64, n=4096, k=6144), own(256, "dot m128n64k128 s2 w4")])
    per_m = sass.serialized_per_m(timed, read)
    assert per_m.to_dict("records") == [{"m": 64, "timed": 2, "points": 1, "serialized": 1,
                                         "hgmma_min": 16, "hgmma_max": 16}]
    sentence = sass.serialized_sentence(per_m, read, run_triton="3.6.0")
    assert "(1 of the 1 read, of 2 at M = 64)" in sentence and "16 wgmma instructions" in sentence
    assert "take turns instead of overlapping" in sentence
    assert "recompiled by Triton 3.6.0 (the version this run used)" in sentence


def test_the_sentence_says_all_where_every_timed_build_was_read_and_names_another_triton(tmp_path):
    read = sass.read_sass(write_read(tmp_path / "r", [row(64, TMA_64, 16, 16), row(256, TMA_256, 8, 8)]))
    per_m = sass.serialized_per_m(pd.DataFrame([own(64, TMA_64), own(256, TMA_256)]), read)
    sentence = sass.serialized_sentence(per_m, read, run_triton="3.5.0")
    assert "(all 1 at M = 64 and all 1 at M = 256)" in sentence and "8-16 wgmma" in sentence
    assert "this run used 3.5.0" in sentence


def test_builds_that_keep_their_wgmma_in_flight_are_said_to(tmp_path):
    read = sass.read_sass(write_read(tmp_path / "r", [row(16, "dot m16n64k256 s2 w4 st3 swap ptx", 16, 2)]))
    per_m = sass.serialized_per_m(pd.DataFrame([own(16, "dot m16n64k256 s2 w4 st3 swap ptx"),
                                                own(16, "cuda g8", kernel="cuda-w4a16", n=4096)]), read)
    assert per_m["timed"].tolist() == [1]
    assert sass.serialized_sentence(per_m, read).startswith("`triton-w4a16` keeps its wgmma (Hopper")
    assert sass.serialized_sentence(per_m.iloc[0:0], read) is None


def test_the_chapter_sentence_comes_from_the_newest_read_and_names_the_runs_triton(tmp_path):
    class View:   # what compiled_finding reads of a RunView
        def versions(self):
            return {"triton": "3.5.0"}

    timed = pd.DataFrame([own(64, TMA_64)])
    assert sass.compiled_finding(timed, View(), root=tmp_path) is None            # no read yet
    write_read(tmp_path / "20261207T0820Z-h100-triton-sass", [row(64, TMA_64, 16, 16)])
    sentence = sass.compiled_finding(timed, View(), root=tmp_path)
    assert "(all 1 at M = 64)" in sentence and "this run used 3.5.0" in sentence


# -- the in-flight trial --------------------------------------------------------------------------

SYNC, WGMMA = "cuda w8 r2 m64 c4 d2 smem b2 pdl-all", "cuda w8 wg2 m64 c4 d2 smem pdl-all"


def trial_row(variant, us, backend="cuda-moe-as-dense", m=64, n=8192, k=8192, fmt="nvfp4", status="ok"):
    return {"fmt": fmt, "n": n, "k": k, "m": m, "variant": variant, "backend": backend,
            "status": status, "median_us": us if status == "ok" else None}


def write_trial(folder, rows, builds=((WGMMA, 128, 8), (SYNC, 0, 0))):
    (folder / "call1").mkdir(parents=True)
    (folder / "call1" / "measurements.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "builds_sass.jsonl").write_text("".join(
        json.dumps({"fmt": "nvfp4", "build": b, "hgmma": h, "waited": w}) + "\n" for b, h, w in builds))
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "read": sass.TRIAL_KIND,
                                                 "provenance": {"machine": "NVIDIA H100 80GB HBM3 (700 W)"}}))
    return folder


TRIAL = [trial_row(f"{WGMMA} s1", 90.0), trial_row(f"{WGMMA} s4 +sum", 50.0),
         trial_row(f"{WGMMA} s4 kernel", 37.7), trial_row(f"{SYNC} s4 kernel", 33.6),
         trial_row(f"{SYNC} s8 kernel", 20.0, status="wrong_result"),
         trial_row("humming-w4a16", 28.6, backend="humming-w4a16"),
         trial_row("triton-w4a16", 10.0, backend="triton-w4a16"),        # fp4lab's own: not a peer
         trial_row("torch-bf16", 47.0, backend="torch-bf16"),
         trial_row(f"{WGMMA} s1", 10.0, m=256)]


def test_the_trial_takes_each_kinds_fastest_unreduced_gated_time_and_the_fastest_peer(tmp_path):
    trial = sass.read_in_flight_trial(write_trial(tmp_path / "t", TRIAL))
    at = trial.per_point.set_index("m").loc[64]
    assert (at["wgmma_us"], at["sync_us"], at["peer"], at["peer_us"]) == (37.7, 33.6, "humming-w4a16", 28.6)
    assert 256 not in trial.per_point["m"].tolist()           # no sync build or peer timed there
    assert (trial.waited, trial.issued, trial.machine) == ((8, 8), (128, 128), "NVIDIA H100 80GB HBM3")
    sentence = sass.in_flight_sentence(trial)
    assert sentence.startswith("Keeping them in flight did not help in fp4lab's own trial")
    assert "dense GEMM at M = 64 on NVIDIA H100 80GB HBM3 (1 point, before" in sentence
    assert f"took {37.7 / 33.6:.2f}x the time of its mma.sync build when it kept its wgmma in flight" in sentence
    assert "(8 of its 128 waited for" in sentence and f"and {37.7 / 28.6:.2f}x the fastest peer's" in sentence
    assert sass.in_flight_sentence(trial, m=16) is None


def test_a_trial_faster_than_the_peer_says_by_how_much(tmp_path):
    trial = sass.read_in_flight_trial(write_trial(tmp_path / "t", TRIAL[:4] + [
        trial_row("humming-w4a16", 40.0, backend="humming-w4a16")]))
    assert f"{37.7 / 40.0:.3f}x the fastest peer's" in sass.in_flight_sentence(trial)


def test_a_trial_without_its_sass_read_says_why(tmp_path):
    folder = write_trial(tmp_path / "t", TRIAL)
    (folder / "builds_sass.jsonl").unlink()
    with pytest.raises(sass.SassReadError, match="builds_sass.jsonl"):
        sass.read_in_flight_trial(folder)


def test_the_chapter_follows_a_serialized_read_with_the_trial_and_a_kept_one_without(tmp_path):
    class View:
        def versions(self):
            return {"triton": "3.6.0"}

    write_read(tmp_path / "20261207T0820Z-h100-triton-sass",
               [row(64, TMA_64, 16, 16), row(16, "dot m16n64k256 s2 w4 st3 swap ptx", 16, 2)])
    write_trial(tmp_path / "20261207T0937Z-h100-moe-kernel-as-dense", TRIAL)
    serialized = sass.compiled_finding(pd.DataFrame([own(64, TMA_64)]), View(), root=tmp_path)
    assert "take turns" in serialized and "Keeping them in flight did not help" in serialized
    kept = sass.compiled_finding(pd.DataFrame([own(16, "dot m16n64k256 s2 w4 st3 swap ptx")]), View(), root=tmp_path)
    assert "keeps its wgmma" in kept and "Keeping them" not in kept


def test_a_trial_where_the_wgmma_build_wins_says_at_how_many_points(tmp_path):
    rows = [trial_row(f"{WGMMA} s4 kernel", 30.0), trial_row(f"{SYNC} s4 kernel", 33.6),
            trial_row("humming-w4a16", 28.6, backend="humming-w4a16")]
    sentence = sass.in_flight_sentence(sass.read_in_flight_trial(write_trial(tmp_path / "t", rows)))
    assert sentence.startswith("Keeping them in flight helped at 1 of 1 points of fp4lab's own trial")
    assert f"took {30.0 / 33.6:.3f}x the time" in sentence
