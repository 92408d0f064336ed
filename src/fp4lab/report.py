"""`make report`: run every chapter with papermill into a run folder, then build the book from it.

The nightly contract: one chapter failing never stops the others or the book. A failed chapter is
recorded in run.json["report"] (chapter, status, error, seconds), its partially executed notebook
(papermill saves it with the traceback) still goes into the book, the front page lists it, and
the command exits non-zero at the end so the nightly job notices.

Stages and where the time goes are recorded in run.json["report"]["stages"] and printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fp4lab.results import REFERENCE_ROOT, REPO_ROOT, RunDir, new_run_id, reference_run, utc_now

PROFILES = ("smoke", "full")
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
BOOK_DIR = REPO_ROOT / "book"
SHARE_DIR = REPO_ROOT / "share"
KERNEL_NAME = "fp4lab"
CHAPTER_PATTERN = re.compile(r"^\d\d_[A-Za-z0-9_]+\.ipynb$")
DIAGNOSIS_STEM = "04_diagnosis"
NO_GPU_MESSAGE = "no GPU found: running the CPU smoke profile"


# -- profile, device, reference ----------------------------------------------------------------
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_profile(profile: str, has_cuda: bool | None = None) -> tuple[str, str]:
    """(profile, why): `auto` -> `full` on a CUDA machine, else `smoke` with a message saying so."""
    if profile not in PROFILES + ("auto",):
        raise ValueError(f"profile {profile!r}: choose one of auto, {', '.join(PROFILES)}")
    if profile != "auto":
        return profile, "asked for"
    if has_cuda is None:
        has_cuda = cuda_available()
    if has_cuda:
        return "full", "a CUDA GPU is present: running the full profile"
    return "smoke", NO_GPU_MESSAGE


def device_label(has_cuda: bool) -> str:
    """The GPU name for the run id (`...-nvidia-h200`), or `cpu`."""
    if not has_cuda:
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def latest_reference_dir(reference_root: str | os.PathLike = REFERENCE_ROOT) -> str:
    """The newest committed reference run with a GEMM sweep, or "" when there is none."""
    run = reference_run("", "gemm", reference_root)
    return str(run.resolve()) if run else ""


# -- notebooks and their parameters -------------------------------------------------------------
def discover_notebooks(notebooks_dir: str | os.PathLike = NOTEBOOKS_DIR) -> list[Path]:
    """The chapters, `NN_name.ipynb`, in order."""
    folder = Path(notebooks_dir)
    if not folder.is_dir():
        raise ValueError(f"notebooks folder {folder} does not exist")
    return sorted(p for p in folder.iterdir() if CHAPTER_PATTERN.match(p.name))


def load_profile_params(profile: str, params_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """`notebooks/params/<profile>.yaml`: notebook stem -> {parameter: value}."""
    import yaml

    file = Path(params_dir) / f"{profile}.yaml"
    if not file.exists():
        return {}
    data = yaml.safe_load(file.read_text()) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{file}: expected a mapping notebook stem -> {{parameter: value}}")
    return data


def chapter_parameters(stem: str, profile_params: dict[str, dict[str, Any]], run_dir: str,
                       reference_dir: str, profile: str, device: str) -> dict[str, Any]:
    """The chapter's yaml values plus the four every chapter takes (those win)."""
    return {**profile_params.get(stem, {}), "run_dir": run_dir, "reference_dir": reference_dir,
            "profile": profile, "device": device}


# -- one chapter -------------------------------------------------------------------------------
@dataclass
class ChapterResult:
    chapter: str
    status: str          # "ok" | "failed"
    error: str | None
    seconds: float
    notebook: str        # the executed (or partially executed) notebook


def execute_chapter(notebook: Path, output: Path, parameters: dict[str, Any],
                    kernel_name: str = KERNEL_NAME, progress_bar: bool = True) -> ChapterResult:
    """Run one notebook with papermill; a failure becomes a result, never an exception."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    started = time.perf_counter()
    try:
        papermill.execute_notebook(str(notebook), str(output), parameters=parameters,
                                   kernel_name=kernel_name, cwd=str(notebook.parent),
                                   progress_bar=progress_bar)
        status, error = "ok", None
    except PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {_one_line(exc.evalue)}"
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the report
        status, error = "failed", f"{type(exc).__name__}: {_one_line(str(exc))}"
    return ChapterResult(notebook.stem, status, error, round(time.perf_counter() - started, 2),
                         str(output))


def _one_line(text: str, limit: int = 400) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text or "")  # ANSI colours from tracebacks
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the book ----------------------------------------------------------------------------------
@dataclass
class BookResult:
    status: str          # "ok" | "warnings" | "failed" | "skipped"
    seconds: float
    html: str | None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def notebook_title(path: Path) -> str:
    """The first markdown heading of a notebook, for the summary table."""
    import nbformat

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable notebook still gets a row, by its name
        return path.stem
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return path.stem


def write_toc(book_dir: Path, chapter_files: list[str], reference_files: list[str] = (),
              run_caption: str = "This run", reference_caption: str = "Reference run") -> Path:
    """A toc of the chapters actually executed (a missing or renamed notebook cannot break it);
    with the reference run's executed chapters as a second part when there are any."""
    lines = ["format: jb-book", "root: intro"]
    if reference_files:
        # json strings are valid YAML scalars, whatever the caption holds
        lines += ["parts:", f"  - caption: {json.dumps(run_caption)}", "    chapters:"]
        lines += [f"      - file: chapters/{stem}" for stem in chapter_files]
        lines += [f"  - caption: {json.dumps(reference_caption)}", "    chapters:"]
        lines += [f"      - file: chapters/reference/{stem}" for stem in reference_files]
    else:
        lines += ["chapters:"] + [f"  - file: chapters/{stem}" for stem in chapter_files]
    toc = (book_dir / "chapters" / "_toc.yml").resolve()
    toc.write_text("\n".join(lines) + "\n")
    return toc


def copy_reference_chapters(reference_dir: str, chapters_dir: Path) -> list[str]:
    """The reference run's executed chapters, as it rendered them on its own GPU, for the book's
    second part: a CPU machine's book then still shows what the reference GPU measured."""
    executed = sorted((Path(reference_dir) / "notebooks").glob("*.ipynb")) if reference_dir else []
    if executed:
        (chapters_dir / "reference").mkdir(parents=True, exist_ok=True)
    for notebook in executed:
        shutil.copy2(notebook, chapters_dir / "reference" / notebook.name)
    return [notebook.stem for notebook in executed]


def reference_caption(reference_dir: str) -> str:
    device = RunDir(Path(reference_dir)).run_json().get("provenance", {}).get("device", {})
    return f"Reference run {Path(reference_dir).name} ({device.get('name') or 'unknown device'})"


def write_run_summary(book_dir: Path, run: RunDir, report: dict[str, Any]) -> Path:
    """`chapters/run_summary.md`, included by the front page: run, profile, GPU, timings, failures."""
    chapters = report.get("chapters", [])
    failed = [c for c in chapters if c["status"] != "ok"]
    gpu = report.get("gpu") or "none (CPU)"
    lines = ["## This run", ""]
    if failed:
        lines += [":::{danger}", f"{len(failed)} of {len(chapters)} chapters failed in this run:", ""]
        lines += [f"- **{c['chapter']}**: {_md_escape(c['error'] or 'unknown error')}" for c in failed]
        lines += ["", "Their pages below show how far they got and the traceback.", ":::", ""]
    lines += [
        "| | this run |", "|---|---|",
        f"| run id | `{run.run_id}` |",
        f"| profile | {report.get('profile')} ({report.get('profile_reason')}) |",
        f"| GPU | {gpu} |",
        f"| reference run | `{Path(report['reference_dir']).name if report.get('reference_dir') else 'none'}` |",
        f"| started | {report.get('started')} |",
        "",
        "| chapter | status | seconds |", "|---|---|---:|",
    ]
    for c in chapters:
        mark = "ok" if c["status"] == "ok" else "**FAILED**"
        lines.append(f"| {{doc}}`{_md_escape(c['title'])} </chapters/{c['chapter']}>` | {mark} | {c['seconds']:.1f} |")
    lines.append("")
    summary = book_dir / "chapters" / "run_summary.md"
    summary.write_text("\n".join(lines))
    return summary


def _md_escape(text: str) -> str:
    """Plain text inside markdown: no table breaks, no accidental emphasis, code or html."""
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", text)


def build_book(book_dir: Path, toc: Path) -> BookResult:
    """`jupyter-book build` (Sphinx, no execution); warnings are collected and shown, not hidden."""
    command = [_jupyter_book(), "build", str(book_dir.resolve()), "--toc", str(toc.resolve()), "--keep-going"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 2)
    log = done.stdout + done.stderr
    warnings = [_one_line(line, 300) for line in log.splitlines() if "WARNING" in line]
    html = book_dir / "_build" / "html" / "index.html"
    if done.returncode != 0 or not html.exists():
        return BookResult("failed", seconds, None, warnings,
                          f"jupyter-book exit {done.returncode}: {_build_error(log)}")
    return BookResult("warnings" if warnings else "ok", seconds, str(html), warnings)


def _build_error(log: str) -> str:
    """The lines that name the cause, without the traceback frames and the config dumps."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in log.splitlines()]
    causes = []
    for index, line in enumerate(lines):
        if re.search(r"error|exception", line, re.IGNORECASE) and "=====" not in line \
                and not line.startswith((" ", "myst", "Traceback", "The above exception")):
            # "Extension error:" puts its message on the next line
            causes.append(line + (" " + lines[index + 1] if line.endswith(":") and index + 1 < len(lines) else ""))
    last = [line.strip() for line in lines if line.strip() and not line.startswith(" ") and "=====" not in line]
    # jupyter-book's own messages (e.g. no toc) come last, inside a box
    return " | ".join(dict.fromkeys(causes[-3:] + last[-2:])) or "jupyter-book printed nothing"


def _jupyter_book() -> str:
    beside = Path(sys.executable).parent / "jupyter-book"
    found = str(beside) if beside.exists() else shutil.which("jupyter-book")
    if not found:
        raise ValueError("jupyter-book is not installed: run `make setup` (it needs jupyter-book<2)")
    return found


# -- the whole report --------------------------------------------------------------------------
@dataclass
class ReportResult:
    run_dir: Path
    profile: str
    chapters: list[ChapterResult]
    book: BookResult
    stages: dict[str, float]

    @property
    def failed(self) -> list[ChapterResult]:
        return [c for c in self.chapters if c.status != "ok"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.book.status == "failed" else 0


def run_report(profile: str = "auto", run_id: str | None = None, runs_dir: str | os.PathLike = "runs",
               notebooks: list[str | os.PathLike] | None = None, build: bool = True, *,
               book_dir: str | os.PathLike = BOOK_DIR, params_dir: str | os.PathLike | None = None,
               reference_dir: str | None = None, device: str = "auto",
               kernel_name: str = KERNEL_NAME, echo=None) -> ReportResult:
    """Execute the chapters into `runs_dir/<run-id>/notebooks/`, then build the book from them."""
    echo = echo or _echo
    t0 = time.perf_counter()
    has_cuda = cuda_available()
    profile, why = resolve_profile(profile, has_cuda)
    echo(f"fp4lab report: profile {profile} ({why})")
    paths = [Path(p) for p in notebooks] if notebooks is not None else discover_notebooks()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"notebooks not found: {', '.join(missing)}")
    params_dir = Path(params_dir) if params_dir else (paths[0].parent / "params" if paths else NOTEBOOKS_DIR / "params")
    profile_params = load_profile_params(profile, params_dir)
    if reference_dir is None:
        reference_dir = latest_reference_dir()
    run = RunDir.create(runs_dir, run_id=run_id or new_run_id(device_label(has_cuda)))
    run_path = str(run.path.resolve())
    out_dir = run.path / "notebooks"
    out_dir.mkdir(exist_ok=True)
    report: dict[str, Any] = {
        "profile": profile, "profile_reason": why, "device": device,
        "gpu": device_label(has_cuda) if has_cuda else None,
        "reference_dir": reference_dir, "started": utc_now(), "chapters": [],
    }
    run.update_run_json("report", report)
    _record_provenance(run)
    echo(f"run folder: {run.path}  ({len(paths)} chapters, reference: {reference_dir or 'none'})")
    stages = {"setup": round(time.perf_counter() - t0, 2)}

    results = []
    for index, notebook in enumerate(paths, 1):
        echo(f"[{index}/{len(paths)}] {notebook.stem} ...")
        parameters = chapter_parameters(notebook.stem, profile_params, run_path, reference_dir,
                                        profile, device)
        result = execute_chapter(notebook, out_dir / notebook.name, parameters, kernel_name)
        results.append(result)
        line = f"[{index}/{len(paths)}] {result.chapter:<24} {result.status:<7} {result.seconds:7.1f} s"
        echo(line + (f"  {result.error}" if result.error else ""))
        report["chapters"].append({**asdict(result), "title": notebook_title(Path(result.notebook))})
        run.update_run_json("report", {"chapters": report["chapters"]})
        stages[f"chapter {result.chapter}"] = result.seconds

    book = BookResult("skipped", 0.0, None)
    if build:
        book = _build_from_run(Path(book_dir), run, report, results)
        stages["book"] = book.seconds
    stages["total"] = round(time.perf_counter() - t0, 2)
    run.update_run_json("report", {"book": asdict(book), "stages": stages, "finished": utc_now()})
    result = ReportResult(run.path, profile, results, book, stages)
    _print_ending(result, echo)
    return result


def _record_provenance(run: RunDir) -> None:
    """Provenance for history comparisons, unless a chapter has already written it."""
    if "provenance" in run.run_json():
        return
    from fp4lab.results import provenance

    try:
        run.update_run_json(None, {"provenance": provenance()})
    except ImportError as exc:  # fp4lab.hardware not importable: say so rather than guess
        run.update_run_json(None, {"provenance": {"error": f"provenance unavailable: {exc}"}})


def _build_from_run(book_dir: Path, run: RunDir, report: dict[str, Any],
                    results: list[ChapterResult]) -> BookResult:
    chapters_dir = book_dir / "chapters"
    if chapters_dir.exists():
        shutil.rmtree(chapters_dir)  # generated: a chapter from an older run must not linger
    chapters_dir.mkdir(parents=True)
    copied = []
    for result in results:
        if Path(result.notebook).exists():
            shutil.copy2(result.notebook, chapters_dir / Path(result.notebook).name)
            copied.append(result.chapter)
    reference_dir = report.get("reference_dir") or ""
    reference = copy_reference_chapters(reference_dir, chapters_dir)
    write_run_summary(book_dir, run, report)
    toc = write_toc(book_dir, copied, reference, run_caption=f"This run {run.run_id}",
                    reference_caption=reference_caption(reference_dir) if reference else "")
    try:
        return build_book(book_dir, toc)
    except ValueError as exc:
        return BookResult("failed", 0.0, None, error=str(exc))


def _echo(line: str) -> None:
    print(line, flush=True)


def _print_ending(result: ReportResult, echo) -> None:
    echo("where the time goes: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.stages.items()))
    for warning in result.book.warnings:
        echo(f"book warning: {warning}")
    if result.book.status == "failed":
        echo(f"book build FAILED: {result.book.error}")
    elif result.book.html:
        echo(f"book: {result.book.html}")
    for chapter in result.failed:
        echo(f"FAILED chapter {chapter.chapter}: {chapter.error}")
    if result.failed:
        echo(f"{len(result.failed)} of {len(result.chapters)} chapters failed: exit status 1")


# -- share: one self-contained HTML file of the diagnosis ------------------------------------
# a script that loads or imports anything remote (require.js, MathJax, the lazy mermaid import)
REMOTE_SCRIPT = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://(?:(?!</script>).)*?</script>\s*|"
                           r"<script\b[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>\s*", re.IGNORECASE | re.DOTALL)
MATHJAX_CONFIG = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->\s*",
                            re.DOTALL | re.IGNORECASE)


def latest_run(runs_dir: str | os.PathLike) -> RunDir:
    root = Path(runs_dir)
    runs = sorted(p.parent for p in root.glob("*/run.json")) if root.is_dir() else []
    if not runs:
        raise ValueError(f"no run folders under {root}: run `make report` first")
    return RunDir(runs[-1])


def share(run_id: str | None = None, runs_dir: str | os.PathLike = "runs",
          out_dir: str | os.PathLike = SHARE_DIR) -> Path:
    """`share/<run-id>-diagnosis.html`: the executed diagnosis chapter, images embedded, no CDN."""
    from nbconvert import HTMLExporter

    run = RunDir.open(Path(runs_dir) / run_id) if run_id else latest_run(runs_dir)
    notebook = run.path / "notebooks" / f"{DIAGNOSIS_STEM}.ipynb"
    if not notebook.exists():
        raise ValueError(f"{notebook} does not exist: the run has no executed diagnosis chapter")
    exporter = HTMLExporter(template_name="lab", embed_images=True, exclude_input=True)
    body, _ = exporter.from_filename(str(notebook))
    body = self_contained(body)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{run.run_id}-diagnosis.html"
    target.write_text(body)
    return target


def self_contained(html: str) -> str:
    """Drop the remote scripts nbconvert adds (require.js, MathJax, mermaid): the content reads without them."""
    html = MATHJAX_CONFIG.sub("", html)
    return REMOTE_SCRIPT.sub("", html)


def remote_references(html: str) -> list[str]:
    """Remote resources the page would load by itself (scripts, styles, images): none is the goal."""
    return re.findall(r"<(?:script|img|iframe)[^>]*\bsrc=[\"'](https?://[^\"']+)", html, re.IGNORECASE) + \
        re.findall(r"<link[^>]*\bhref=[\"'](https?://[^\"']+)", html, re.IGNORECASE)


# -- cli ---------------------------------------------------------------------------------------
def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("report", help="run every chapter into a run folder, build the book")
    parser.add_argument("--profile", default=os.environ.get("REPORT_PROFILE", "auto"),
                        choices=("auto",) + PROFILES)
    parser.add_argument("--run-id", default=os.environ.get("RUN_ID") or None)
    parser.add_argument("--runs-dir", default=os.environ.get("RUNS_DIR", "runs"))
    parser.add_argument("--notebooks", nargs="*", help="only these notebooks (default: notebooks/NN_*.ipynb)")
    parser.add_argument("--no-build", action="store_true", help="run the chapters, skip the book")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.set_defaults(func=_cli_report)

    share_parser = subparsers.add_parser("share", help="one self-contained HTML file of the diagnosis")
    share_parser.add_argument("--run-id", default=os.environ.get("RUN_ID") or None)
    share_parser.add_argument("--runs-dir", default=os.environ.get("RUNS_DIR", "runs"))
    share_parser.add_argument("--out-dir", default=str(SHARE_DIR))
    share_parser.set_defaults(func=_cli_share)


def _cli_report(args) -> int:
    try:
        result = run_report(args.profile, args.run_id, args.runs_dir, args.notebooks,
                            build=not args.no_build, device=args.device)
    except ValueError as exc:
        print(f"fp4lab report: error: {exc}", file=sys.stderr)
        return 2
    return result.exit_code


def _cli_share(args) -> int:
    try:
        target = share(args.run_id, args.runs_dir, args.out_dir)
    except ValueError as exc:
        print(f"fp4lab share: error: {exc}", file=sys.stderr)
        return 2
    print(f"shared diagnosis: {target}")
    return 0
