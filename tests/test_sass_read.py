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
    assert "ptxas serializes them" in sentence and "Triton 3.6.0, the version this run used," in sentence


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
