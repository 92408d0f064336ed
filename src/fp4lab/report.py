"""`make report`: run every chapter with papermill into a run folder, then build the book from it.

The nightly contract: one chapter failing never stops the others or the book. A failed chapter is
recorded in run.json["report"] (chapter, status, error, seconds), its partially executed notebook
(papermill saves it with the error) still goes into the book, the front page lists it, and the
command exits non-zero at the end so the nightly job notices. Exit codes:
  0 everything ran; 1 a chapter or the book build failed; 2 bad arguments; 3 a regression
  against the previous run on the same device (chapter 05's judgement); 4 (from make) setup failed;
  130 stopped by Ctrl-C (or SIGTERM / SIGHUP, which the CLI turns into one): run.json["report"]
  records status "interrupted" with the chapter that was running and when, what was written is
  kept, and the same --run-id continues (chapters measure only what the run lacks).

Progress is drawn in this terminal (a bar over chapters, and the points each chapter measures,
which its kernel reports through FP4LAB_PROGRESS_FILE), never in the pages. The report holds the
run folder's lock for its whole duration; the chapter kernels it starts inherit the right to write.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fp4lab import profiles
from fp4lab.book import BookResult
from fp4lab.progress import PROGRESS_ENV
from fp4lab.results import (REFERENCE_ROOT, REPO_ROOT, RUNS_ROOT, RunDir, git_sha, latest_gpu_run, new_run_id,
                            reference_run, utc_now)

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNEL_NAME = "fp4lab"
CHAPTER_PATTERN = re.compile(r"^\d\d_[A-Za-z0-9_]+\.ipynb$")
EXIT_FAILED, EXIT_USAGE, EXIT_REGRESSION, EXIT_INTERRUPTED = 1, 2, 3, 130
# the kernel's own log stays quiet: its "running over TCP" notice is about a local socket, and
# jupyter_client interrupts a kernel before shutting it down, which it logs at ERROR ("KeyboardInterrupt
# caught in kernel") when the interrupt lands while it is still busy. A cell's error reaches the
# report through papermill, not through this log.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


@dataclass
class ChapterResult:
    chapter: str
    status: str          # "ok" | "failed"
    error: str | None
    seconds: float
    notebook: str        # the executed (or partially executed) notebook
    title: str = ""


@dataclass
class ReportResult:
    run_dir: Path
    profile: str
    chapters: list[ChapterResult]
    book: BookResult
    stages: dict[str, float]
    regressions: int = 0
    interrupted: str | None = None   # the chapter (or "book") a Ctrl-C or SIGTERM stopped

    @property
    def failed(self) -> list[ChapterResult]:
        return [c for c in self.chapters if c.status != "ok"]

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.failed or self.book.status == "failed":
            return EXIT_FAILED
        return EXIT_REGRESSION if self.regressions else 0


def discover_notebooks(folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The chapters, `NN_name.ipynb`, in order."""
    if not folder.is_dir():
        raise FileNotFoundError(f"notebooks folder {folder} does not exist")
    return sorted(p for p in folder.iterdir() if CHAPTER_PATTERN.match(p.name))


def notebook_title(path: Path) -> str:
    """The first Markdown heading of a notebook."""
    import nbformat

    try:
        book = nbformat.read(str(path), as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable notebook still gets a row, by its name
        return path.stem
    for cell in book.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return re.sub(r"[`<>]", "", line.lstrip("#").strip())
    return path.stem


def one_line(value: str, limit: int = 400) -> str:
    value = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", value or "").split())
    return value if len(value) <= limit else value[:limit - 3] + "..."


def execute_chapter(notebook: Path, output: Path, parameters: dict[str, Any],
                    kernel_name: str = KERNEL_NAME) -> ChapterResult:
    """One notebook through papermill; a failure becomes a result, never an exception."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    started = time.perf_counter()
    try:
        papermill.execute_notebook(str(notebook), str(output), parameters=parameters, kernel_name=kernel_name,
                                   cwd=str(notebook.parent), progress_bar=False, log_output=False,
                                   extra_arguments=KERNEL_ARGUMENTS)
        status, error = "ok", None
    except PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {one_line(exc.evalue)}"
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the report
        status, error = "failed", f"{type(exc).__name__}: {one_line(str(exc))}"
    return ChapterResult(notebook.stem, status, error, round(time.perf_counter() - started, 2), str(output),
                         notebook_title(output if output.exists() else notebook))


class TerminalProgress:
    """A bar over chapters with the current chapter's measured points (read from the progress
    file its kernel appends to) as its postfix; in a log (no terminal), a line per chapter and a
    points line every LOG_EVERY_S seconds."""

    LOG_EVERY_S = 30.0

    def __init__(self, total: int, enabled: bool):
        self.bar, self.enabled, self.index, self.total = None, enabled, 0, total
        self.file = Path(tempfile.mkstemp(prefix="fp4lab-progress-", suffix=".jsonl")[1])
        self._stop = threading.Event()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="report", unit="chapter", file=sys.stderr, dynamic_ncols=True)
        if enabled:
            self._thread = threading.Thread(target=self._tail, daemon=True)
            self._thread.start()

    def _tail(self) -> None:
        import json

        position, last_logged = 0, time.monotonic()
        while not self._stop.wait(0.5):
            try:
                with open(self.file) as handle:
                    handle.seek(position)
                    lines = handle.readlines()
                    position = handle.tell()
            except OSError:
                continue
            events = []
            for line in lines:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            if not events:
                continue
            status = f"{events[-1]['desc']} {events[-1]['done']}/{events[-1]['total']} points"
            if self.bar is not None:
                self.bar.set_postfix_str(status, refresh=True)
            elif time.monotonic() - last_logged > self.LOG_EVERY_S:
                print(f"  ... {status}", file=sys.stderr, flush=True)
                last_logged = time.monotonic()

    def chapter(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_description(f"report {name}")

    def done(self, line: str) -> None:
        self.index += 1
        line = f"[{self.index}/{self.total}] {line}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
            self.bar.update(1)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.close()
        self.file.unlink(missing_ok=True)


def leading_run(run: RunDir, cuda: bool, runs_dir) -> RunDir | None:
    """The run the front page's diagnosis reads: this run on a GPU; on a CPU the newest GPU run
    (local or reference), since a smoke run diagnoses no GPU."""
    if cuda:
        return run
    newest = latest_gpu_run(runs_dir, REFERENCE_ROOT)
    return RunDir(newest) if newest else None


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_report(profile: str = "auto", run_id: str | None = None, runs_dir: str | os.PathLike = RUNS_ROOT,
               notebooks: list[Path] | None = None, build: bool = True, *, reference_dir: str | None = None,
               device: str = "auto", kernel_name: str = KERNEL_NAME, progress: bool = True) -> ReportResult:
    """Execute the chapters into `runs_dir/<run-id>/notebooks/`, then build the book from them."""
    from fp4lab import book

    t0 = time.perf_counter()
    cuda = has_cuda()
    profile = profiles.resolve(profile, cuda)
    paths = notebooks if notebooks is not None else discover_notebooks()
    run_id = run_id or new_run_id("gpu" if cuda else "cpu")
    reference = reference_run(reference_dir or "", "gemm", exclude=run_id)    # checked before a folder is made
    run = RunDir.create(runs_dir, run_id=run_id)
    with run.lock("make report"):
        out_dir = run.path / "notebooks"
        out_dir.mkdir(exist_ok=True)
        kept = kept_chapters(run, paths)
        report: dict[str, Any] = {"profile": profile, "device": device, "gpu": _gpu_name() if cuda else None,
                                  "reference_dir": str(reference) if reference else "", "started": utc_now(),
                                  # the commit that executed these chapters: a resumed run's measurements
                                  # may be older (provenance.fp4lab_git_sha is the first commit's)
                                  "fp4lab_git_sha": git_sha(),
                                  "status": "running", "interrupted": None, "chapters": list(kept)}
        run.update_run_json("report", report)
        print(f"fp4lab report: profile {profile} ({'a CUDA GPU is here' if cuda else 'no GPU: the CPU smoke profile'}); "
              f"run {run.path}; reference {reference.name if reference else 'none'}", flush=True)
        stages = {"setup": round(time.perf_counter() - t0, 2)}
        bar = TerminalProgress(len(paths), progress)
        os.environ[PROGRESS_ENV] = str(bar.file)
        results, running = [], "setup"
        try:
            try:
                for notebook in paths:
                    running = notebook.stem
                    bar.chapter(running)
                    parameters = {"run_dir": str(run.path.resolve()), "reference_dir": str(reference or "none"),
                                  "profile": profile, "device": device}
                    result = execute_chapter(notebook, out_dir / notebook.name, parameters, kernel_name)
                    results.append(result)
                    bar.done(f"{result.chapter:<24} {result.status:<7} {result.seconds:7.1f} s"
                             + (f"  {result.error}" if result.error else ""))
                    report["chapters"] = sorted(
                        [*report["chapters"], {**asdict(result), "fp4lab_git_sha": report["fp4lab_git_sha"]}],
                        key=lambda chapter: chapter["chapter"])
                    run.update_run_json("report", {"chapters": report["chapters"]})
                    stages[f"chapter {result.chapter}"] = result.seconds
            finally:
                os.environ.pop(PROGRESS_ENV, None)
                bar.close()
            running = "book"
            regressions = count_regressions(run)
            book_result = BookResult("skipped", 0.0, None)
            if build:
                with book.book_lock():
                    staged = book.stage(run, report["chapters"], RunDir(reference) if reference else None,
                                        book.front_page(run, report, leading_run(run, cuda, runs_dir)))
                    try:
                        book_result = book.build(staged)
                    except FileNotFoundError as exc:
                        book_result = BookResult("failed", 0.0, None, error=str(exc))
                stages["book"] = book_result.seconds
        except KeyboardInterrupt:    # Ctrl-C; SIGTERM / SIGHUP too, as sweep.runner.Interrupted
            run.update_run_json("report", {"status": "interrupted", "stages": stages,
                                           "interrupted": {"chapter": running, "at": utc_now()}})
            stopped = ReportResult(run.path, profile, results, BookResult("skipped", 0.0, None), stages,
                                   interrupted=running)
            print_ending(stopped)
            return stopped
        stages["total"] = round(time.perf_counter() - t0, 2)
        failed = (any(r.status != "ok" for r in results) or book_result.status == "failed"
                  or any(chapter.get("status") != "ok" for chapter in kept))
        run.update_run_json("report", {"book": asdict(book_result), "stages": stages, "finished": utc_now(),
                                       "regressions": regressions,
                                       "status": "failed" if failed else "complete"})
    result = ReportResult(run.path, profile, results, book_result, stages, regressions)
    print_ending(result)
    return result


def kept_chapters(run: RunDir, paths: list[Path]) -> list[dict[str, Any]]:
    """The chapters an earlier report of this run rendered that this one does not re-render (a
    report of some chapters keeps the others' records and notebooks; each record names the commit
    that rendered it where it was written with one)."""
    rendering = {path.stem for path in paths}
    earlier = (run.run_json().get("report") or {}).get("chapters") or []
    return [chapter for chapter in earlier if isinstance(chapter, dict)
            and isinstance(chapter.get("chapter"), str) and chapter["chapter"] not in rendering]


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def count_regressions(run: RunDir) -> int:
    """Regressions against the previous local run on the same device (chapter 05's judgement)."""
    from fp4lab.analysis import history

    if not run.has_table("gemm"):
        return 0
    previous = history.previous_run(run.path, run.path.parent)
    if previous is None:
        return 0
    comparison = history.compare(run.path, previous, "previous", profiles.section(
        (run.run_json().get("report") or {}).get("profile") or "smoke", "history")["regression_threshold"])
    return len(comparison.regressions) if comparison.same_device else 0


def print_ending(result: ReportResult) -> None:
    if result.interrupted:
        print(f"fp4lab report: interrupted during {result.interrupted}; what was written is kept in "
              f"{result.run_dir}; continue with the same --run-id {result.run_dir.name} (chapters "
              "measure only what the run lacks)", file=sys.stderr, flush=True)
        return
    print("where the time goes: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items()), flush=True)
    for warning in result.book.warnings:
        print(f"book warning: {warning}")
    if result.book.status == "failed":
        print(f"book build FAILED: {result.book.error}")
    elif result.book.html:
        print(f"book: {result.book.html}")
    for chapter in result.failed:
        print(f"FAILED chapter {chapter.chapter}: {chapter.error}")
    if result.failed:
        print(f"{len(result.failed)} of {len(result.chapters)} chapters failed: exit status {EXIT_FAILED}")
    elif result.regressions:
        print(f"{result.regressions} regression(s) against the previous run on this device: exit status "
              f"{EXIT_REGRESSION}")
