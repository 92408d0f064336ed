"""Nothing lost, nothing duplicated, nothing hung (issue 11, defects 2, 3 and 4).

Real `python -m fp4lab sweep` processes (cwd elsewhere, the runs folder from FP4LAB_RUNS_DIR, the
fake backends of tests/fakes/backends.py): a second sweep on a run id being written is refused
with one line naming the holder; `kill -9` mid-sweep leaves no worker behind and, after a
half-written last line, `--resume` ends with exactly the rows of an uninterrupted run; a hung
point is a `timeout` row; SIGTERM stops the workers and records `interrupted`. A full disk
(ENOSPC mid-line, or while exporting the parquet) stops a sweep with one line and `--resume`
completes it. Two reports with different ids at once each build a whole book (slow).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import TESTS_DIR
from fp4lab import schema
from fp4lab.results import RunDir

SRC = TESTS_DIR.parent / "src"
GRID = ["--profile", "smoke", "--device", "cpu", "--format", "nvfp4", "--shapes", "32x64", "--quiet",
        "--repeats", "3"]
M_VALUES = "1,2,4,8,16,32"
SECRET = "s3cr3t-7f1e9a"  # in the environment of a sweep; never in its run folder
SLOW = "1.0"           # fake-slow waits a second before each point: time to act mid-sweep, on any CPU
# the sweeps that are killed or stopped wait longer: between its first and second row a second
# sweep starts and is refused, which took ~5 s on the H200 box under 15 xdist workers, long enough
# for 6 points of 1 s to finish before the kill looked for a worker; and on a loaded 2-core box
# (2026-12-05) fake-slow's last 4 points of 1 s finished before the SIGTERM after its first row
KILLED_SLOW = "3.0"


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "FP4LAB_RUN_LOCK"}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(SRC)]), FP4LAB_EXTRA_BACKENDS="fakes.backends",
               FP4LAB_RUNS_DIR=str(tmp_path / "runs"), **extra)
    return env


def start_sweep(tmp_path: Path, *args: str, **extra_env: str) -> subprocess.Popen:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "fp4lab", "sweep", *args], cwd=elsewhere,
                            env=environment(tmp_path, **extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_for(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def rows_in(run_path: Path) -> int:
    path = run_path / "gemm.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def workers_of(pid: int) -> list[int]:
    """The sweep worker processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"fp4lab.sweep.worker" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                    # a zombie is dead: it only waits to be reaped
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def grid_points(run_path: Path) -> int:
    """How many rows an uninterrupted run of the run's stored grid writes: one per point
    (backends x formats x shapes x M; the backends are named, so no registry is needed)."""
    config = RunDir.open(run_path).run_json()["sweep"]["config"]
    assert config["backends"]
    return len(config["backends"]) * len(config["fmts"]) * len(config["shapes"]) * len(config["m_values"])


def assert_whole(run_path: Path) -> None:
    """One row per point of the grid, each key once, no line a reader must skip."""
    run = RunDir.open(run_path)
    rows = run.read_rows("gemm")
    keys = [schema.GEMM.row_key(row) for row in rows]
    assert not run.skipped, run.skipped
    assert len(keys) == len(set(keys)) == grid_points(run_path)
    assert run.run_json()["sweep"]["status"] == "complete"


# -- two writers, kill -9, a half-written line, --resume ---------------------------------------------

@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """Sweep A (slowed points) on run id `shared`; sweep B on the same id while A writes; A killed
    with SIGKILL after two rows; its last row cut in half (a kill mid-write); then --resume."""
    tmp_path = tmp_path_factory.mktemp("kill")
    run_path = tmp_path / "runs" / "shared"
    record: dict = {}
    a = start_sweep(tmp_path, *GRID, "--backends", "fake-slow", "--m", M_VALUES, "--run-id", "shared",
                    FAKE_POINT_DELAY_S=KILLED_SLOW)
    wait_for(lambda: rows_in(run_path) >= 1, what="sweep A's first row")
    record["holder"] = json.loads((run_path / ".lock").read_text())
    b = start_sweep(tmp_path, *GRID, "--backends", "fake-slow", "--m", M_VALUES, "--run-id", "shared")
    record["second"] = finish(b)
    wait_for(lambda: rows_in(run_path) >= 2, what="sweep A's second row")
    record["workers"] = workers_of(a.pid)
    a.send_signal(signal.SIGKILL)
    a.wait()
    a.stdout.close()
    a.stderr.close()
    wait_for(lambda: not any(alive(pid) for pid in record["workers"]), timeout=10, what="the workers to die")
    record["rows_at_kill"] = rows_in(run_path)
    log = run_path / "gemm.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])     # killed mid-write
    record["status_at_kill"] = RunDir.open(run_path).run_json()["sweep"]["status"]
    resume = start_sweep(tmp_path, "--resume", str(run_path), "--quiet")
    record["resume"] = finish(resume)
    record["run_path"] = run_path
    return record


def test_a_second_sweep_on_a_run_being_written_is_refused_naming_the_holder(killed_and_resumed):
    code, out, err = killed_and_resumed["second"]
    holder = killed_and_resumed["holder"]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"run shared is being written by pid {holder['pid']}" in lines[0]
    assert "fp4lab" in lines[0] and "use another run id" in lines[0]


def test_kill_9_leaves_no_worker_and_loses_no_finished_row(killed_and_resumed):
    assert killed_and_resumed["workers"], "a worker was measuring when the sweep was killed"
    assert killed_and_resumed["status_at_kill"] == "running"      # what a kill -9 leaves
    assert killed_and_resumed["rows_at_kill"] >= 2


def test_resume_after_a_half_written_line_has_an_uninterrupted_runs_rows(killed_and_resumed):
    """Defect 2: the resumed point was glued onto the partial line and lost, and the run said
    complete. Now the partial line is cut, its point measured again, every point once."""
    code, out, err = killed_and_resumed["resume"]
    assert code == 0, err
    assert "cut a partial last line" in err
    assert_whole(killed_and_resumed["run_path"])
    assert out.strip() == str(killed_and_resumed["run_path"])


def test_moe_sweep_twice_on_one_id_measures_each_point_once(tmp_path):
    """Defect 3: `moe-sweep` twice with one id appended every row again. (And what holds: no
    secret from the environment reaches the run folder, its logs included.)"""
    args = ["--profile", "smoke", "--device", "cpu", "--methods", "loop-bf16", "--batch", "8", "--ep", "1",
            "--steps", "4", "--repeats", "2", "--run-id", "moe-twice", "--quiet"]
    runs = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-m", "fp4lab", "moe-sweep", *args], cwd=tmp_path,
                                env=environment(tmp_path, HF_TOKEN=SECRET, AWS_SECRET_ACCESS_KEY=SECRET),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs.append(finish(proc))
    assert [code for code, _, _ in runs] == [0, 0], runs[-1][2]
    assert runs[1][2].startswith("0 points measured")
    run = RunDir.open(tmp_path / "runs" / "moe-twice")
    keys = [schema.MOE.row_key(row) for row in run.read_rows("moe")]
    assert len(keys) == len(set(keys)) == 2 + 2 * 10          # 2 expert GEMMs + the dense curve
    assert run.run_json()["moe"]["status"] == "complete"
    files = [path for path in run.path.rglob("*") if path.is_file()]
    assert any(path.suffix == ".log" for path in files)
    assert not [path for path in files if SECRET.encode() in path.read_bytes()]


# -- a hang, then SIGTERM --------------------------------------------------------------------------

def test_a_hung_point_times_out_and_sigterm_stops_the_workers(tmp_path):
    """Defect 4: a hung backend hung the sweep forever; SIGTERM orphaned the worker (PPID 1,
    GPU kept) and run.json still said `running`."""
    from fakes.backends import CRASH_AT_M

    run_path = tmp_path / "runs" / "term"
    proc = start_sweep(tmp_path, *GRID, "--backends", "fake-hang,fake-slow", "--m", "1,4,8,16,32",
                       "--point-timeout", "4", "--run-id", "term", FAKE_POINT_DELAY_S=KILLED_SLOW)
    wait_for(lambda: rows_in(run_path) >= 6, timeout=90, what="fake-hang's points and fake-slow's first")
    workers = workers_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=30)
    run = RunDir.open(run_path)
    frame = run.read_table("gemm")
    seen = frame[["backend", "m", "status", "error"]].to_string() + "\n" + err
    assert workers, seen
    assert code == 130 and f"continue with --resume {run_path}" in err and "Traceback" not in err, seen
    assert not any(alive(pid) for pid in workers), seen
    assert run.run_json()["sweep"]["status"] == "interrupted"
    hung = frame[(frame["backend"] == "fake-hang") & (frame["m"] == CRASH_AT_M)]
    assert hung["status"].tolist() == ["timeout"], seen
    assert (frame[frame["backend"] == "fake-hang"]["status"] == "ok").sum() == 4, seen
    assert len(frame) >= 6 and len(frame) == rows_in(run_path), seen


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_are_an_interrupt_while_a_sweep_runs(signum):
    from fp4lab.sweep.runner import Interrupted, signals_as_interrupt

    with pytest.raises(Interrupted, match=signal.Signals(signum).name):
        with signals_as_interrupt():
            os.kill(os.getpid(), signum)
            time.sleep(5)
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler, signal.SIG_IGN)


def test_a_second_signal_does_not_cut_the_cleanup_short():
    """systemd and shells resend SIGTERM: the `finally` that records `interrupted` still runs."""
    from fp4lab.sweep.runner import Interrupted, signals_as_interrupt

    cleaned = []
    with pytest.raises(Interrupted):
        with signals_as_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                cleaned.append(True)
    assert cleaned == [True]


# -- a full disk -----------------------------------------------------------------------------------

class FullDisk:
    """`open_own` for fp4lab.results whose appends to gemm.jsonl start failing with ENOSPC after
    `after` rows: the failing write puts half its bytes on disk first, as a full disk does."""

    def __init__(self, open_own, after: int):
        self.open_own, self.after, self.full = open_own, after, False

    def __call__(self, path, mode):
        handle = self.open_own(path, mode)
        if Path(path).name != "gemm.jsonl" or "a" not in mode:
            return handle
        disk = self

        class Filling:
            def __getattr__(self, name):
                return getattr(handle, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def write(self, data):
                if disk.after > 0 and not disk.full:
                    disk.after -= 1
                    return handle.write(data)
                disk.full = True
                handle.write(data[: len(data) // 2])
                handle.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return Filling()


def export_fails(after: int):
    """atomic_write for fp4lab.results whose gemm.parquet exports fail with ENOSPC after `after`."""
    from fp4lab import results

    real, left = results.atomic_write, [after]

    def atomic_write(path, write):
        if Path(path).name == "gemm.parquet":
            if left[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            left[0] -= 1
        return real(path, write)
    return atomic_write


@pytest.mark.parametrize("where", ["mid-line in gemm.jsonl", "exporting gemm.parquet"])
def test_a_full_disk_stops_the_sweep_in_one_line_and_resume_completes_it(tmp_path, monkeypatch,
                                                                         fake_backends_env, capsys, where):
    from fp4lab import cli, results

    monkeypatch.setattr(results, "RUNS_ROOT", tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    if where.startswith("mid-line"):
        monkeypatch.setattr(results, "open_own", FullDisk(results.open_own, after=2))
    else:
        monkeypatch.setattr(results, "atomic_write", export_fails(after=5))   # the last point's export
    args = ["sweep", *GRID, "--backends", "fake-ok", "--m", M_VALUES, "--run-id", "full", "--out",
            str(tmp_path / "runs")]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    run_path = tmp_path / "runs" / "full"
    lines = [line for line in err.splitlines() if line.startswith("fp4lab:")]
    assert lines == [f"fp4lab: stopped: {run_path / ('gemm.jsonl' if 'jsonl' in where else 'gemm.parquet')}: "
                     f"No space left on device; measured points are kept; continue with --resume {run_path}"]
    assert RunDir.open(run_path).run_json()["sweep"]["status"] == "interrupted"
    monkeypatch.undo()                                            # space is free again
    monkeypatch.setenv("FP4LAB_EXTRA_BACKENDS", "fakes.backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), str(SRC)]))
    assert cli.main(["sweep", "--resume", str(run_path), "--quiet"]) == 0
    assert_whole(run_path)
    import pandas as pd
    assert len(pd.read_parquet(run_path / "gemm.parquet")) == grid_points(run_path)


# -- two reports at once (slow) --------------------------------------------------------------------

REPORT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from fp4lab import book, report
    book_dir = Path(sys.argv[1])
    book.BOOK_DIR, book.PUBLISHED = book_dir, book_dir / "_build" / "html"
    report.REFERENCE_ROOT = Path(sys.argv[4])             # no GPU run on record: a short front page
    result = report.run_report("smoke", sys.argv[2], sys.argv[3], [Path(sys.argv[5])], reference_dir="none",
                               device="cpu", progress=False)
    print("BOOK", result.book.status, result.book.error)
    sys.exit(result.exit_code)
""")


def tiny_chapter(path: Path) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook(metadata={
        "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"},
        "language_info": {"name": "python"}})
    notebook.cells = [nbformat.v4.new_markdown_cell("# 00 · A tiny chapter"),
                      nbformat.v4.new_code_cell('run_dir = ""', metadata={"tags": ["parameters"]}),
                      nbformat.v4.new_code_cell("from pathlib import Path\nprint('chapter of run', Path(run_dir).name)")]
    nbformat.write(notebook, str(path))


@pytest.mark.slow
def test_two_reports_with_different_ids_at_once_each_build_a_whole_book(tmp_path):
    pytest.importorskip("papermill")
    from fp4lab import book

    book_dir = tmp_path / "book"
    book_dir.mkdir()
    for name in ("_config.yml", "intro.md"):
        (book_dir / name).write_text((book.BOOK_DIR / name).read_text())
    (tmp_path / "no-references").mkdir()
    notebook = tmp_path / "chapters" / "00_tiny.ipynb"
    notebook.parent.mkdir()
    tiny_chapter(notebook)
    env = {**environment(tmp_path), "PYTHONPATH": str(SRC)}
    procs = {run_id: subprocess.Popen([sys.executable, "-c", REPORT, str(book_dir), run_id, str(tmp_path / "runs"),
                                       str(tmp_path / "no-references"), str(notebook)], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for run_id in ("report-a", "report-b")}
    results = {run_id: proc.communicate(timeout=300)[0] for run_id, proc in procs.items()}
    for run_id, proc in procs.items():
        assert proc.returncode == 0 and "BOOK ok" in results[run_id], results[run_id][-3000:]
        built = RunDir.open(tmp_path / "runs" / run_id).run_json()["report"]
        assert built["book"]["status"] == "ok" and [c["status"] for c in built["chapters"]] == ["ok"]
    pages = {page: page.read_text() for page in (book_dir / "_build" / "html").rglob("*.html")}
    chapter = next(text for page, text in pages.items() if page.name == "00_tiny.html")
    published = "report-a" if "chapter of run report-a" in chapter else "report-b"
    other = "report-b" if published == "report-a" else "report-a"
    assert f"chapter of run {published}" in chapter
    assert not [page for page, text in pages.items() if other in text]          # never mixed
    assert any(published in text for page, text in pages.items() if page.name == "intro.html")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.slow
def test_sigterm_to_a_report_shuts_its_kernel_down(tmp_path):
    """SIGTERM (and SIGHUP) stop `report` like Ctrl-C: the chapter's kernel does not outlive it."""
    pytest.importorskip("papermill")
    import nbformat

    notebook = tmp_path / "00_sleeps.ipynb"
    book = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                             "display_name": "Python 3"}})
    book.cells = [nbformat.v4.new_markdown_cell("# 00 · Sleeps"),
                  nbformat.v4.new_code_cell('run_dir = ""', metadata={"tags": ["parameters"]}),
                  nbformat.v4.new_code_cell("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")]
    nbformat.write(book, str(notebook))
    proc = subprocess.Popen([sys.executable, "-m", "fp4lab", "report", "--profile", "smoke", "--device", "cpu",
                             "--run-id", "term", "--reference-dir", "none", "--no-build", "--quiet",
                             "--notebooks", str(notebook)], cwd=tmp_path, env=environment(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kernels: list[int] = []

    def kernel_started():
        kernels[:] = [pid for pid in descendants(proc.pid)
                      if b"ipykernel" in Path(f"/proc/{pid}/cmdline").read_bytes()] if proc.poll() is None else []
        return bool(kernels)

    wait_for(kernel_started, timeout=60, what="the chapter's kernel")
    time.sleep(1.0)                                   # into the cell's sleep
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    # the kernel may log its own socket closing under it; fp4lab itself ends in one line
    assert code == 130 and err.strip().splitlines()[-1].startswith("fp4lab report: interrupted during 00_sleeps"), err
    assert "continue with the same --run-id term" in err and "/fp4lab/" not in err, err
    wait_for(lambda: not any(alive(pid) for pid in kernels), timeout=15, what="the kernel to stop")
    run = RunDir.open(tmp_path / "runs" / "term")
    assert not run.path.joinpath(".lock").read_text()
    recorded = run.run_json()["report"]
    assert recorded["status"] == "interrupted" and recorded["interrupted"]["chapter"] == "00_sleeps"


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "Interrupted"])
def test_a_stopped_report_records_where_it_stopped_and_says_how_to_go_on(tmp_path, monkeypatch, capsys, stop):
    """Ctrl-C (KeyboardInterrupt) or SIGTERM / SIGHUP (Interrupted) in the second chapter: the
    first chapter's record is kept, run.json["report"] says interrupted, in which chapter and
    when, and the exit status is 130 with one line naming the --run-id that continues."""
    from fp4lab import report
    from fp4lab.sweep.runner import Interrupted

    def execute_chapter(notebook, output, parameters, kernel_name):
        if notebook.stem == "01_second":
            raise {"KeyboardInterrupt": KeyboardInterrupt, "Interrupted": Interrupted}[stop]()
        return report.ChapterResult(notebook.stem, "ok", None, 0.1, str(output), notebook.stem)

    monkeypatch.setattr(report, "execute_chapter", execute_chapter)
    notebooks = [tmp_path / "00_first.ipynb", tmp_path / "01_second.ipynb", tmp_path / "02_third.ipynb"]
    result = report.run_report("smoke", "stopped", tmp_path / "runs", notebooks, build=False,
                               reference_dir="none", device="cpu", progress=False)
    assert result.exit_code == 130 and result.interrupted == "01_second"
    recorded = RunDir.open(tmp_path / "runs" / "stopped").run_json()["report"]
    assert recorded["status"] == "interrupted" and recorded["interrupted"]["chapter"] == "01_second"
    assert recorded["interrupted"]["at"] >= recorded["started"]
    assert [chapter["chapter"] for chapter in recorded["chapters"]] == ["00_first"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "continue with the same --run-id stopped" in err[0], err


def test_a_report_of_some_chapters_keeps_the_other_chapters_records(tmp_path, monkeypatch):
    """Re-rendering one chapter of a run replaces that chapter's record only: the others keep
    theirs (their notebooks are still in the run and go into the book), in chapter order; a kept
    chapter that had failed still marks the run's report failed, while the exit status is this
    command's own (its one chapter passed)."""
    from fp4lab import report

    outcome = {"00_first": "ok", "01_second": "ok", "02_third": "failed"}

    def execute_chapter(notebook, output, parameters, kernel_name):
        status = outcome[notebook.stem]
        return report.ChapterResult(notebook.stem, status, None if status == "ok" else "ValueError: x",
                                    0.1, str(output), notebook.stem)

    monkeypatch.setattr(report, "execute_chapter", execute_chapter)
    monkeypatch.setattr(report, "git_sha", lambda: "first")
    notebooks = [tmp_path / "00_first.ipynb", tmp_path / "01_second.ipynb", tmp_path / "02_third.ipynb"]
    report.run_report("smoke", "again", tmp_path / "runs", notebooks, build=False, reference_dir="none",
                      device="cpu", progress=False)
    monkeypatch.setattr(report, "git_sha", lambda: "second")
    result = report.run_report("smoke", "again", tmp_path / "runs", [notebooks[1]], build=False,
                               reference_dir="none", device="cpu", progress=False)
    recorded = RunDir.open(tmp_path / "runs" / "again").run_json()["report"]
    assert [(c["chapter"], c["fp4lab_git_sha"]) for c in recorded["chapters"]] == [
        ("00_first", "first"), ("01_second", "second"), ("02_third", "first")]
    assert recorded["fp4lab_git_sha"] == "second"
    assert recorded["status"] == "failed" and result.exit_code == 0


def test_a_report_whose_chapter_fails_records_failed_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    """One chapter raising: the others still run, run.json["report"]["status"] says failed (not
    complete), the failed chapter's error is recorded and printed, and the exit status says so."""
    from fp4lab import report

    def execute_chapter(notebook, output, parameters, kernel_name):
        if notebook.stem == "01_second":
            return report.ChapterResult(notebook.stem, "failed", "ValueError: bad row", 0.1, str(output),
                                        notebook.stem)
        return report.ChapterResult(notebook.stem, "ok", None, 0.1, str(output), notebook.stem)

    monkeypatch.setattr(report, "execute_chapter", execute_chapter)
    notebooks = [tmp_path / "00_first.ipynb", tmp_path / "01_second.ipynb", tmp_path / "02_third.ipynb"]
    result = report.run_report("smoke", "failing", tmp_path / "runs", notebooks, build=False,
                               reference_dir="none", device="cpu", progress=False)
    assert result.exit_code == report.EXIT_FAILED != 0
    recorded = RunDir.open(tmp_path / "runs" / "failing").run_json()["report"]
    assert recorded["status"] == "failed"
    assert [(c["chapter"], c["status"]) for c in recorded["chapters"]] == [
        ("00_first", "ok"), ("01_second", "failed"), ("02_third", "ok")]
    out = capsys.readouterr().out
    assert "FAILED chapter 01_second: ValueError: bad row" in out and "1 of 3 chapters failed" in out
