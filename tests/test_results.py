"""Run folders (fp4lab.results.RunDir) under damage: malformed run.json named, a partial last
line repaired, bad lines skipped and named, temporary files unique, one writer at a time (the
holder named, its children let in through FP4LAB_RUN_LOCK), drop_rows keeping what it cannot read,
and an index that skips a corrupt folder instead of failing."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from fp4lab import schema
from fp4lab.errors import ParameterError
from fp4lab.results import (LOCK_ENV, RunDir, RunFolderError, RunLocked, atomic_write, find_run_dirs,
                            list_runs)

SRC = str(__import__("fp4lab").__file__).rsplit("/fp4lab/", 1)[0]


def gemm_row(m: int, status: str = "ok", **values) -> dict:
    return schema.blank_row("gemm", run_id="r", backend="fake-ok", fmt="nvfp4", n=32, k=64, m=m,
                            status=status, median_us=1.5 * m, **values)


@pytest.fixture
def run(tmp_path):
    return RunDir.create(tmp_path, run_id="r")


def log_file(run):
    return run.path / "gemm.jsonl"


# -- run.json ---------------------------------------------------------------------------------------

CORRUPT_RUN_JSON = {
    "truncated": b'{"run_id": "r", "created": "2026',
    "empty": b"",
    "a list": b'["run_id", "r"]',
    "a string": b'"r"',
    "not utf-8": b'{"run_id": "\xff\xfe"}',
    "NaN": b'{"run_id": "r", "provenance": {"device": {"power_limit_w": NaN}}}',
    "section a list": b'{"run_id": "r", "sweep": ["config"]}',
    "created a number": b'{"run_id": "r", "created": 20261130}',
    "device a list": b'{"run_id": "r", "provenance": {"device": ["NVIDIA H200"]}}',
    "device name an object": b'{"run_id": "r", "provenance": {"device": {"name": {"x": 1}}}}',
    "power limit a string": b'{"run_id": "r", "provenance": {"device": {"power_limit_w": "700 W"}}}',
    "power limit true": b'{"run_id": "r", "provenance": {"device": {"power_limit_w": true}}}',
    "chapters an object": b'{"run_id": "r", "report": {"chapters": {"00": "ok"}}}',
    "report status a number": b'{"run_id": "r", "report": {"status": 130}}',
    "comm failure a list": b'{"run_id": "r", "comm": {"failure": ["rank 1"]}}',
    "per-GPU record a list": b'{"run_id": "r", "sweep_gpus": ["0"]}',
    "sweep config a list": b'{"run_id": "r", "sweep": {"config": [1, 2]}}',
    "versions a list": b'{"run_id": "r", "provenance": {"versions": ["torch"]}}',
    "a version a number": b'{"run_id": "r", "provenance": {"versions": {"torch": 2.13}}}',
    "nested too deeply": b'{"run_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("content", CORRUPT_RUN_JSON.values(), ids=CORRUPT_RUN_JSON.keys())
def test_a_malformed_run_json_is_one_error_naming_the_file(tmp_path, content):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "run.json").write_bytes(content)
    with pytest.raises(RunFolderError) as caught:
        RunDir.open(folder)
    message = str(caught.value)
    assert str(folder / "run.json") in message and "\n" not in message
    assert isinstance(caught.value, ParameterError)          # the CLI's one line, exit 2
    with pytest.raises(RunFolderError):                       # and a sweep into it is refused too
        RunDir.create(tmp_path, run_id="bad")


def test_an_absurdly_large_run_json_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from fp4lab import results

    run = RunDir.create(tmp_path, run_id="big")
    monkeypatch.setattr(results, "RUN_JSON_LIMIT", 100)
    (run.path / "run.json").write_text(json.dumps({"run_id": "big", "note": "x" * 200}))
    with pytest.raises(RunFolderError, match=r"big/run.json: \d+ bytes, more than a run.json holds"):
        RunDir.open(run.path)


@pytest.mark.parametrize("name", ["run.json", "gemm.jsonl"])
def test_a_fifo_or_device_in_a_run_folder_is_refused_not_read_forever(run, name):
    (run.path / name).unlink(missing_ok=True)
    os.mkfifo(run.path / name)
    with pytest.raises(RunFolderError, match=f"{name}: not a regular file"):
        run.run_json() if name == "run.json" else run.read_rows("gemm")
    (run.path / name).unlink()
    (run.path / name).symlink_to("/dev/zero")
    with pytest.raises(RunFolderError, match=f"{name}: not a regular file"):
        run.run_json() if name == "run.json" else run.read_table("gemm")


def test_a_run_json_that_is_a_folder_is_not_a_run(tmp_path):
    (tmp_path / "odd" / "run.json").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="not a run folder"):
        RunDir.open(tmp_path / "odd")


def test_a_well_formed_run_json_round_trips_without_nan(run):
    run.update_run_json("sweep", {"status": "running", "median": float("nan")})
    text = (run.path / "run.json").read_text()
    assert "NaN" not in text and run.run_json()["sweep"] == {"status": "running", "median": None}


# -- the append-only log ----------------------------------------------------------------------------

def test_a_partial_last_line_is_cut_before_the_next_append(run, caplog):
    run.append_rows("gemm", [gemm_row(1), gemm_row(2)])
    whole = log_file(run).read_bytes()
    partial = json.dumps(gemm_row(3)).encode()[:40]          # a crash mid-write: no newline
    log_file(run).write_bytes(whole + partial)
    assert [r["m"] for r in run.read_rows("gemm")] == [1, 2]   # readers skip it (and say so)
    with caplog.at_level(logging.WARNING, logger="fp4lab"):
        run.append_rows("gemm", [gemm_row(3)])
    assert "cut a partial last line (40 bytes" in caplog.text
    assert log_file(run).read_bytes() == whole + (json.dumps(gemm_row(3)) + "\n").encode()
    assert [r["m"] for r in RunDir(run.path).read_rows("gemm")] == [1, 2, 3]
    assert list(run.read_table("gemm")["m"]) == [1, 2, 3]     # the parquet export agrees
    import pandas as pd
    assert list(pd.read_parquet(run.path / "gemm.parquet")["m"]) == [1, 2, 3]


def test_a_whole_last_row_that_lost_only_its_newline_is_kept(run):
    """Readers count such a row as measured, so cutting it would lose its point for good (a
    resume would not measure it again)."""
    run.append_rows("gemm", [gemm_row(1)])
    log_file(run).write_bytes(log_file(run).read_bytes() + json.dumps(gemm_row(2)).encode())
    assert {r["m"] for r in run.read_rows("gemm")} == {1, 2}
    run.append_rows("gemm", [gemm_row(4)])
    fresh = RunDir(run.path)
    assert [r["m"] for r in fresh.read_rows("gemm")] == [1, 2, 4] and not fresh.skipped


BAD_LINES = {
    "not json": b"{oops\n",
    "a list": b"[1, 2]\n",
    "Infinity": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1, "median_us": Infinity}\n',
    "backend a list": b'{"backend": ["x"], "fmt": "nvfp4", "n": 1, "k": 16, "m": 1}\n',
    "m an object": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": {"a": 1}}\n',
    "m not whole": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1.5}\n',
    "graph a string": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1, "graph": "yes"}\n',
    "median a string": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1, "median_us": "9"}\n',
    "binary": b"\xff\xfe\x00\x01\n",
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "status not a status": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1, "status": "<b>ok</b>"}\n',
    "weights not a dtype": b'{"backend": "x", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1, "weight_dtype": "fp3"}\n',
}


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_line_is_skipped_with_a_warning_naming_file_and_line(run, caplog, line):
    run.append_rows("gemm", [gemm_row(1)])
    log_file(run).write_bytes(log_file(run).read_bytes() + line)
    run.append_rows("gemm", [gemm_row(2)])
    fresh = RunDir(run.path)
    with caplog.at_level(logging.WARNING, logger="fp4lab"):
        rows = fresh.read_rows("gemm")
        keys = fresh.row_keys("gemm")                    # hashable: no TypeError from a list key
    assert [r["m"] for r in rows] == [1, 2] and len(keys) == 2
    assert fresh.skipped and f"{log_file(run)} line 2:" in fresh.skipped[0]
    assert f"{log_file(run)} line 2:" in caplog.text
    assert list(fresh.read_table("gemm")["m"]) == [1, 2]


def test_the_last_line_is_found_reading_back_in_blocks(run):
    """A long log is mended from its tail: the partial line is found across block boundaries."""
    from fp4lab.results import _last_line_start

    rows = [gemm_row(m) for m in range(1, 200)]
    run.append_rows("gemm", rows)
    whole = log_file(run).read_bytes()
    partial = json.dumps(gemm_row(500)).encode()[:-7]
    log_file(run).write_bytes(whole + partial)
    with open(log_file(run), "rb") as file:
        for block in (1, 7, 64, 1 << 16):
            assert _last_line_start(file, len(whole) + len(partial), block) == (len(whole), partial)
    run.append_rows("gemm", [gemm_row(500)])
    assert [r["m"] for r in RunDir(run.path).read_rows("gemm")] == list(range(1, 200)) + [500]


@pytest.mark.parametrize("name", ["gemm.jsonl", ".lock", ".run.json.lock"])
@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_run_folders_file_linked_elsewhere_is_never_written_through(run, tmp_path, name, link):
    """A run folder somebody sent you could point `.lock` (truncated when the lock is taken) or
    the log (appended to) at a file of yours."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (os.symlink if link == "symbolic" else os.link)(victim, run.path / name)
    with pytest.raises(RunFolderError, match=f"{name}: (is a symbolic link|has other hard links)"):
        with run.lock("sweep"):
            run.update_run_json("sweep", {"status": "running"})
            run.append_rows("gemm", [gemm_row(1), gemm_row(2)])
            log_file(run).write_bytes(log_file(run).read_bytes() + b'{"m"')
            run.append_rows("gemm", [gemm_row(3)])
    assert victim.read_text() == "precious\n"


def test_a_worker_log_stays_in_the_run_folder_whatever_the_group_is_called(run):
    from fp4lab.sweep.runner import log_path

    for name in ("../../escape", "/etc/passwd", "..", "", "a/b\nc", "fake-ok"):
        path = log_path(run, name)
        assert path.parent == run.path / "logs" and path.name.endswith(".log") and "/" not in path.name
    assert log_path(run, "fake-ok").name == "fake-ok.log"


def test_drop_rows_removes_those_keys_and_keeps_every_other_line(run):
    run.append_rows("gemm", [gemm_row(1), gemm_row(2, "error"), gemm_row(4, "timeout")])
    log_file(run).write_bytes(log_file(run).read_bytes() + BAD_LINES["backend a list"]
                              + b'{"backend": "x", "m"')   # and a partial last line
    failed = run.row_keys("gemm", ("error", "timeout"))
    assert run.drop_rows("gemm", failed) == 2
    lines = log_file(run).read_bytes().splitlines(keepends=True)
    assert lines == [(json.dumps(gemm_row(1)) + "\n").encode(), BAD_LINES["backend a list"]]
    assert run.drop_rows("gemm", failed) == 0
    assert list(run.read_table("gemm")["m"]) == [1]


# -- whole files ------------------------------------------------------------------------------------

def test_temporary_files_are_unique_and_never_left_behind(tmp_path):
    target = tmp_path / "table.parquet"
    target.write_bytes(b"old")
    names = []

    def outer(file):
        names.append(file.name)
        atomic_write(target, lambda inner: (names.append(inner.name), inner.write(b"inner")))
        file.write(b"outer")

    atomic_write(target, outer)                               # two writers of one file at once
    assert target.read_bytes() == b"outer" and len(set(names)) == 2

    def fails(file):
        file.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, fails)
    assert target.read_bytes() == b"outer"                    # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.parquet"]


def test_whole_files_are_readable_like_the_files_they_replace(run):
    """mkstemp makes owner-only files: a run.json or parquet shared with a team must not become one."""
    assert (run.path / "run.json").stat().st_mode & 0o777 == 0o644
    os.chmod(run.path / "run.json", 0o640)
    run.update_run_json("sweep", {"status": "running"})
    assert (run.path / "run.json").stat().st_mode & 0o777 == 0o640
    run.append_rows("gemm", [gemm_row(1)])
    assert (run.path / "gemm.parquet").stat().st_mode & 0o777 == 0o644


def test_concurrent_run_json_updates_lose_no_section(run):
    def writer(section):
        for i in range(20):
            run.update_run_json(section, {f"k{i}": i})

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("sweep", "moe", "report")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    data = run.run_json()
    assert all(len(data[name]) == 20 for name in ("sweep", "moe", "report"))
    assert not [p for p in run.path.iterdir() if p.name.endswith(".tmp")]


# -- one writer at a time ---------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from fp4lab.results import RunDir
    with RunDir(sys.argv[1]).lock("holder-under-test"):
        print("held", flush=True)
        time.sleep(60)
""")


@pytest.fixture
def held(run):
    """A second process holding the run's lock."""
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop(LOCK_ENV, None)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run.path)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused_with_one_line_naming_the_holder(run, held):
    with pytest.raises(RunLocked) as caught:
        with run.lock("second"):
            pytest.fail("the lock was given twice")
    message = str(caught.value)
    assert f"pid {held.pid}" in message and "holder-under-test" in message and "\n" not in message
    assert "run r is being written" in message


def test_a_forged_or_stale_token_is_not_inherited(run, held, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, f"{run.path.resolve()}=not-the-token")
    with pytest.raises(RunLocked):
        with run.lock():
            pass


def test_the_lock_is_free_again_when_its_holder_is_killed(run, held):
    held.send_signal(signal.SIGKILL)
    held.wait()
    with run.lock("after kill -9") as token:
        assert json.loads((run.path / ".lock").read_text())["token"] == token


CHILD = textwrap.dedent("""
    import sys
    from fp4lab.results import RunDir, RunLocked
    run = RunDir(sys.argv[1])
    try:
        with run.lock("child"):
            run.append_rows("gemm", [{"backend": "child", "fmt": "nvfp4", "n": 1, "k": 16, "m": 1}])
    except RunLocked as exc:
        print("refused:", exc)
        sys.exit(3)
""")


def test_children_of_the_holder_inherit_the_right_to_write(run):
    env = {**os.environ, "PYTHONPATH": SRC}
    with run.lock("parent") as token:
        assert os.environ[LOCK_ENV] == f"{run.path.resolve()}={token}"
        with run.lock("nested, same process"):               # re-entrant: no self-deadlock
            pass
        inheriting = subprocess.run([sys.executable, "-c", CHILD, str(run.path)], capture_output=True,
                                    text=True, env={**env, LOCK_ENV: os.environ[LOCK_ENV]})
        stranger_env = {k: v for k, v in env.items() if k != LOCK_ENV}
        stranger = subprocess.run([sys.executable, "-c", CHILD, str(run.path)], capture_output=True,
                                  text=True, env=stranger_env)
    assert inheriting.returncode == 0, inheriting.stdout + inheriting.stderr
    assert stranger.returncode == 3 and "being written by pid" in stranger.stdout
    assert LOCK_ENV not in os.environ
    assert [r["backend"] for r in run.read_rows("gemm")] == ["child"]


# -- finding runs -----------------------------------------------------------------------------------

def test_the_index_skips_a_corrupt_folder_with_a_warning_naming_it(tmp_path, caplog):
    for name in ("20261201T000000Z-a", "20261202T000000Z-b"):
        RunDir.create(tmp_path, run_id=name)
    for name, content in (("20261201T120000Z-broken", b'{"run_id": '),
                          ("20261201T130000Z-typed", b'{"created": ["yesterday"]}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_bytes(content)
    (tmp_path / "not-a-run").mkdir()
    with caplog.at_level(logging.WARNING, logger="fp4lab"):
        found = [p.name for p in find_run_dirs(tmp_path)]
        frame = list_runs(tmp_path, tmp_path / "missing")
    assert found == ["20261201T000000Z-a", "20261202T000000Z-b"]
    assert list(frame["run_id"]) == found
    assert str(tmp_path / "20261201T120000Z-broken" / "run.json") in caplog.text
    assert str(tmp_path / "20261201T130000Z-typed" / "run.json") in caplog.text


def gpu_run(root, run_id: str, created: str) -> RunDir:
    run = RunDir.create(root, run_id=run_id)
    run.update_run_json(None, {"created": created,
                               "provenance": {"device": {"kind": "cuda", "name": "NVIDIA H200"}}})
    run.append_rows("gemm", [gemm_row(1)])
    return run


def test_share_takes_the_newest_gpu_run_by_time_from_its_runs_folder(tmp_path):
    """"Latest" is the newest by creation time (not by name), under --runs-dir first; the
    committed reference runs only when --runs-dir holds no GPU run."""
    from fp4lab import share
    from fp4lab.results import REFERENCE_ROOT

    gpu_run(tmp_path, "zzz-named-last-made-first", "2026-11-01T00:00:00+00:00")
    newest = gpu_run(tmp_path, "aaa-named-first-made-last", "2026-12-01T00:00:00+00:00")
    RunDir.create(tmp_path, run_id="zzzz-cpu-run")
    assert share.pick_run(None, tmp_path).path == newest.path
    assert share.pick_run("zzz-named-last-made-first", tmp_path).run_id == "zzz-named-last-made-first"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert share.pick_run(None, empty).path.parent == REFERENCE_ROOT


def test_rows_a_resumed_run_adds_at_another_commit_are_recorded_and_captioned(tmp_path, monkeypatch):
    from fakes.runs import gemm_row, make_run

    from fp4lab.analysis.run import view

    run = make_run(tmp_path)                                   # provenance: fp4lab abc123
    run.append_rows("gemm", [gemm_row("torch-bf16", 1, 64, 64, 5.0)])
    monkeypatch.setenv("FP4LAB_GIT_SHA", "abc123")
    before = run.row_count(("gemm", "anatomy"))
    run.append_rows("gemm", [gemm_row("torch-bf16", 2, 64, 64, 5.0)])
    run.note_later_commit(("gemm", "anatomy"), before)         # the same commit: nothing to say
    assert "later_commits" not in run.run_json()["provenance"]
    monkeypatch.setenv("FP4LAB_GIT_SHA", "def456")
    run.note_later_commit(("gemm",), run.row_count(("gemm",)))  # nothing added: nothing to say
    assert "later_commits" not in run.run_json()["provenance"]
    before = run.row_count(("gemm", "anatomy"))
    run.append_rows("gemm", [gemm_row("cuda-w4a16", 1, 64, 64, 3.0), gemm_row("cuda-w4a16", 4, 64, 64, 3.0)])
    run.note_later_commit(("gemm", "anatomy"), before)
    [entry] = run.run_json()["provenance"]["later_commits"]
    assert entry["fp4lab_git_sha"] == "def456" and entry["rows"] == 2 and entry["tables"] == ["gemm", "anatomy"]
    assert view(run).caption("x").endswith("fp4lab abc123 (rows added later at def456)")
    # a later commit that sorts first still comes after the ones before it, each named once
    for sha, m in (("0aa111", 8), ("def456", 16)):
        monkeypatch.setenv("FP4LAB_GIT_SHA", sha)
        before = run.row_count(("gemm",))
        run.append_rows("gemm", [gemm_row("cuda-w4a16", m, 64, 64, 3.0)])
        run.note_later_commit(("gemm",), before)
    assert view(run).caption("x").endswith("fp4lab abc123 (rows added later at def456, 0aa111)")
    monkeypatch.setenv("FP4LAB_GIT_SHA", "0bb222")                 # a third: counted, the last named
    before = run.row_count(("gemm",))
    run.append_rows("gemm", [gemm_row("cuda-w4a16", 32, 64, 64, 3.0)])
    run.note_later_commit(("gemm",), before)
    assert view(run).caption("x").endswith("fp4lab abc123 (rows added later at 3 commits, the last 0bb222)")
    monkeypatch.setenv("FP4LAB_GIT_SHA", "b7c6572bc4bab11752056b52ac1511991bf41a2f")   # a full hash: git's short
    before = run.row_count(("gemm",))
    run.append_rows("gemm", [gemm_row("cuda-w4a16", 64, 64, 64, 3.0)])
    run.note_later_commit(("gemm",), before)
    assert view(run).caption("x").endswith("(rows added later at 4 commits, the last b7c6572)")
    assert RunDir.open(run.path).run_json()["provenance"]["later_commits"][0]["at"]   # run.json still valid


def test_measured_span_names_the_days_a_runs_rows_were_measured():
    from fp4lab.results import measured_span
    assert measured_span({}) == ""
    assert measured_span({"created": "2026-12-03T11:56:25+00:00"}) == "2026-12-03"
    later = {"created": "2026-12-03T11:56:25+00:00",
             "provenance": {"later_commits": [{"fp4lab_git_sha": "a", "at": "2026-12-06T22:30:31+00:00"},
                                              {"fp4lab_git_sha": "b", "at": "2026-12-04T04:10:00+00:00"},
                                              {"fp4lab_git_sha": "c"}, "not an entry"]}}
    assert measured_span(later) == "2026-12-03 to 2026-12-06"
    assert measured_span({"created": 7, "provenance": {"later_commits": [{"at": "2026-12-05T00:00Z"}]}}) \
        == "2026-12-05"
