"""The book: executed chapters of one run (and of the reference run, as a part of its own) plus a
front page that is the diagnosis, built by Jupyter Book 1 into static HTML.

The front page answers the book's question above the fold: the device and run, the verdict in one
sentence with its numbers, under it tokens per expert, power against the limit and the levers on
the diagnosed path, then the seed-style table of the diagnosed backend. When the local run is a
CPU smoke run, the front page leads with the newest GPU run on record and labels the smoke run as
a check of the pipeline.

Each build stages its own copy of the sources (`book/_stage/<run-id>/`) and publishes to
`book/_build/html` under a lock, so two reports never mix runs in one book: the second waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from fp4lab import text
from fp4lab.references import SEED_POWER
from fp4lab.results import REPO_ROOT, RunDir

BOOK_DIR = REPO_ROOT / "book"
PUBLISHED = BOOK_DIR / "_build" / "html"
HIDE_TAGS = {"parameters": ["parameters", "remove-cell"], "injected-parameters": ["injected-parameters", "remove-cell"]}


@dataclass
class BookResult:
    status: str            # "ok" | "warnings" | "failed" | "skipped"
    seconds: float
    html: str | None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


@contextlib.contextmanager
def book_lock() -> Iterator[None]:
    """One build of the book at a time (a second report waits here, then builds its own)."""
    (BOOK_DIR / "_build").mkdir(parents=True, exist_ok=True)
    with open(BOOK_DIR / "_build" / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Outputs a chapter shows: its Markdown, HTML and figures, and text. Anything else in a notebook
# (scripts, SVG, widgets) or markup that could run is not fp4lab's: a reference run somebody sent
# you is data, and its notebooks must not put live markup into the book.
SHOWN_MIME_TYPES = ("text/plain", "text/markdown", "text/html", "image/png")
LIVE_MARKUP = re.compile(r"<\s*/?\s*(script|iframe|object|embed|svg|math|base|form|link|meta|frame)\b"
                         r"|<[^>]*\son[a-z]+\s*=|javascript:|vbscript:|\{(raw|eval-rst|include|literalinclude)\}",
                         re.IGNORECASE)
REMOVED = "output removed by fp4lab: it held {what}, which the book does not show"


def hide_code(notebook_path: Path, target: Path) -> None:
    """Copy an executed notebook for the book: code cells hidden (the parameters and papermill's
    injected parameters removed), so pages show prose, tables and figures, not code; outputs and
    Markdown cells that could carry live markup are replaced by a line saying so."""
    import nbformat

    book = nbformat.read(str(notebook_path), as_version=4)
    for cell in book.cells:
        if cell.cell_type == "markdown" and LIVE_MARKUP.search(cell.source):
            cell.source = REMOVED.format(what="live markup")
        if cell.cell_type != "code":
            continue
        cell.outputs = [_shown_output(output) for output in cell.get("outputs", [])]
        tags = list(cell.metadata.get("tags", []))
        for marker, wanted in HIDE_TAGS.items():
            if marker in tags:
                tags = list(dict.fromkeys(tags + wanted))
        if "remove-cell" not in tags and "remove-input" not in tags:
            tags.append("remove-input")
        cell.metadata["tags"] = tags
    nbformat.write(book, str(target))


def _shown_output(output):
    """The output as the book may show it, or a stream line saying why it is not shown."""
    import nbformat

    data = output.get("data")
    if data is None:
        return output                                   # stream and error outputs: shown as text
    other = sorted(set(data) - set(SHOWN_MIME_TYPES))
    live = [mime for mime in ("text/html", "text/markdown") if LIVE_MARKUP.search(str(data.get(mime, "")))]
    if not other and not live:
        return output
    what = f"live markup in its {live[0]}" if live else f"a {other[0]} output"
    return nbformat.v4.new_output("stream", name="stdout", text=REMOVED.format(what=what) + "\n")


def stage(run: RunDir, chapters: list[dict[str, Any]], reference: RunDir | None, front_md: str) -> Path:
    """A fresh copy of the book sources with this run's chapters, the reference's, the front page."""
    staged = BOOK_DIR / "_stage" / run.run_id
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    for name in ("_config.yml", "intro.md", "_static"):
        source = BOOK_DIR / name
        if source.is_dir():
            shutil.copytree(source, staged / name)
        elif source.exists():
            shutil.copy2(source, staged / name)
    (staged / "chapters").mkdir()
    local = []
    for chapter in chapters:
        executed = Path(chapter["notebook"])
        if executed.exists():
            hide_code(executed, staged / "chapters" / executed.name)
            local.append(executed.stem)
    references = []
    if reference is not None:
        (staged / "chapters" / "reference").mkdir()
        for executed in _chapter_notebooks(reference):
            if not executed.is_file():
                continue
            hide_code(executed, staged / "chapters" / "reference" / executed.name)
            references.append(executed.stem)
    (staged / "chapters" / "front.md").write_text(front_md)
    write_toc(staged, local, references, run, reference)
    return staged


def write_toc(staged: Path, local: list[str], references: list[str], run: RunDir,
              reference: RunDir | None) -> None:
    """The toc of the chapters actually executed, in two parts numbered the same way (the notebooks
    carry their numbers in their titles): this run's and the reference run's. When this run is a
    CPU smoke run the reference part comes first: it holds the GPU measurements the front page
    diagnoses, and the smoke part is the pipeline check."""
    from fp4lab.results import device_label, is_gpu_run

    this = (f"This run: {run.run_id} ({device_label(run.run_json())})",
            [f"chapters/{stem}" for stem in local])
    parts = [this]
    if references:
        caption = f"Reference run: {reference.run_id} ({device_label(reference.run_json())})"
        parts.append((caption, [f"chapters/reference/{stem}" for stem in references]))
        if not is_gpu_run(run.run_json()):
            parts.reverse()
    lines = ["format: jb-book", "root: intro", "parts:"]
    for caption, files in parts:
        lines += [f"  - caption: {json.dumps(caption)}", "    chapters:"]
        lines += [f"      - file: {json.dumps(path)}" for path in files]
    (staged / "_toc.yml").write_text("\n".join(lines) + "\n")


def build(staged: Path) -> BookResult:
    """`jupyter-book build` of the staged sources (no execution), then publish to book/_build/html.
    Warnings are collected and fail the build (the book is the product)."""
    command = [_jupyter_book(), "build", str(staged), "--keep-going", "--warningiserror"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = round(time.perf_counter() - started, 2)
    log = done.stdout + done.stderr
    warnings = [_one_line(line, 300) for line in log.splitlines() if "WARNING" in line]
    built = staged / "_build" / "html"
    if done.returncode != 0 or not (built / "index.html").exists():
        return BookResult("failed", seconds, None, warnings, f"jupyter-book exit {done.returncode}: {_cause(log)}")
    if PUBLISHED.exists():
        shutil.rmtree(PUBLISHED)
    shutil.copytree(built, PUBLISHED)
    shutil.rmtree(staged)
    return BookResult("warnings" if warnings else "ok", seconds, str(PUBLISHED / "index.html"), warnings)


def _jupyter_book() -> str:
    beside = Path(sys.executable).parent / "jupyter-book"
    found = str(beside) if beside.exists() else shutil.which("jupyter-book")
    if not found:
        raise FileNotFoundError("jupyter-book is not installed: run `make setup` (it needs jupyter-book<2)")
    return found


def _one_line(line: str, limit: int = 400) -> str:
    line = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", line).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _cause(log: str) -> str:
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in log.splitlines()]
    causes = [line for line in lines if re.search(r"error|exception", line, re.IGNORECASE)
              and not line.startswith(("Traceback", "The above", "File "))]
    return " | ".join(dict.fromkeys(causes[-3:])) or "jupyter-book printed nothing"


# -- the front page -------------------------------------------------------------------------------

def front_page(run: RunDir, report: dict[str, Any], leading: RunDir | None) -> str:
    """Markdown of the front page (included by intro.md): the diagnosis first, then the runs."""
    from fp4lab.analysis import decode, gemm as gemm_analysis
    from fp4lab.chapters import ch04_diagnosis as words
    from fp4lab.chapters.ch01_gemm import seed_columns, seed_note
    from fp4lab.plots.tables import html_table

    lines = []
    local_is_gpu = bool(report.get("gpu"))
    if leading is not None:
        config = decode.DiagnosisConfig.from_profile(report.get("profile") or "full")
        d = decode.diagnose(leading, config)
        if not local_is_gpu:
            # one line: the seed's table below the verdict stays above the fold
            lines += [f"**Newest GPU run: {text.code(leading.run_id)}** ({text.md(d.view.device)}); this machine "
                      "ran a CPU smoke run.", ""]
        lines += ["```{raw} html", words.verdict_box(d), "```", ""]
        if not d.smoke:
            lines += ["```{raw} html", words.glance_html(d), "```", ""]
        if len(d.seed):
            dtype = gemm_analysis.seed_math_dtype(d.gemm, d.seed_backend)
            # why this backend's, with its modelled loop: chapters 01 and 04 (above the fold here)
            seed = html_table(d.seed, seed_columns(dtype), caption=d.gemm.caption(
                f"The seed's table on this GPU, {d.seed_backend}'s dense GEMMs: {seed_note(dtype)}"))
            lines += ["```{raw} html", f'<div class="fp4lab-seed">{seed}</div>', "```", ""]
        pages, headings = diagnosed_pages(run, report, leading), page_headings(run, report, leading)

        def on_page(*sections):
            return tuple(s for s in sections if s[1] in headings.get(s[0], ()))

        facts = [link_chapters(line, pages, sections) for line, sections in (
            (words.kernel_time_sentence(d), on_page(FUSED_ANATOMY_SECTION, GEMM_ANATOMY_SECTION)),
            (words.fp4_sentence(d), ()), (counters_sentence(d), on_page(COUNTERS_SECTION))) if line]
        evidence = pages.get("04")
        if evidence:
            facts.append(f"The evidence, every path, floor and lever: {{doc}}`chapter 04, the diagnosis <{evidence}>`.")
        lines += [f"- {line}" for line in facts] + [""]
        lines += ["```{raw} html", f"<details><summary>Terms used here</summary>{glossary_html()}</details>",
                  "```", ""]
    else:
        lines += ["No GPU run is on record yet: run `make report` on a GPU box for a diagnosis.", ""]
    lines += run_summary(run, report)
    return "\n".join(lines) + "\n"


def counters_sentence(d) -> str | None:
    """Why the kernels are where they are, from the committed Nsight Compute profiles of the
    diagnosed run's GPU (fp4lab.analysis.counters), naming them; None when there are none."""
    from fp4lab.analysis import counters

    if d.smoke:
        return None
    profiles = [counters.read_counters(folder) for folder in counters.find_profiles("")]
    profiles = [p for p in profiles if p.device == d.view.device]
    bound = counters.instruction_bound(profiles, d.gemm.bandwidth_tbps,
                                       f"the diagnosed run {text.code(d.view.run_id)}")
    if not bound:
        return None
    named = text.join(text.code(p.run_id) for p in profiles)
    lead = f"Why, counted by Nsight Compute (profiles {named}, in chapter 01): "
    if d.chosen is None:
        return lead + bound
    # the diagnosed kernel's own counters first, then every profiled GEMM's; without a profile of
    # it, the others' counters say so after them
    subject = f"The diagnosed path's kernel, {text.md(d.chosen['path'])}"
    own = counters.kernel_sentence(profiles, d.chosen["path"], d.chosen.get("fmt"), subject)
    if own is not None:
        # under the line yet held back by its issue rate: say why fewer instructions still help
        rate = counters.issue_rate_sentence(profiles, d.chosen["path"], d.chosen.get("fmt"),
                                            d.gemm.bandwidth_tbps, "The diagnosed kernel")
        return f"{lead}{own} {bound}" + (f" {rate}" if rate else "")
    return (f"{lead}{bound} {subject}, is not among them: no Nsight Compute profile of it on "
            f"{text.md(d.view.device)} is committed"
            + (", so what bounds it comes from its own dissection above, not from these counters."
               if d.chosen_anatomy is not None else "."))


def diagnosed_part(run: RunDir, report: dict[str, Any], leading: RunDir) -> str | None:
    """Which part of the book shows the diagnosed run: "run" (this run's chapters), "reference"
    (the reference part), or None (a GPU run on record that this book does not show)."""
    if leading.path.resolve() == run.path.resolve():
        return "run"
    reference = report.get("reference_dir")
    if reference and Path(reference).resolve() == leading.path.resolve():
        return "reference"
    return None


def _chapter_notebooks(run: RunDir) -> list[Path]:
    """A run folder's executed chapter notebooks ("04_diagnosis.ipynb", ...), in chapter order."""
    return sorted((run.path / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def diagnosed_pages(run: RunDir, report: dict[str, Any], leading: RunDir) -> dict[str, str]:
    """The book's pages of the diagnosed run's chapters by number ("04":
    "chapters/reference/04_diagnosis"), in the part `diagnosed_part` names; none without one."""
    part = diagnosed_part(run, report, leading)
    if part == "run":
        stems = [c["chapter"] for c in report.get("chapters", []) if c.get("chapter")]
        return {stem[:2]: f"chapters/{stem}" for stem in stems}
    if part == "reference":
        return {nb.stem[:2]: f"chapters/reference/{nb.stem}" for nb in _chapter_notebooks(leading) if nb.is_file()}
    return {}


def page_headings(run: RunDir, report: dict[str, Any], leading: RunDir) -> dict[str, set[str]]:
    """The "## " headings of the pages `diagnosed_pages` names, by chapter number: a front-page
    link lands on a section only where its page has it (a chapter that failed early has not)."""
    part = diagnosed_part(run, report, leading)
    if part == "run":
        notebooks = [Path(c["notebook"]) for c in report.get("chapters", []) if c.get("notebook")]
    elif part == "reference":
        notebooks = _chapter_notebooks(leading)
    else:
        return {}
    found = {}
    for notebook in notebooks:
        try:
            cells = json.loads(notebook.read_text()).get("cells", [])
        except (OSError, ValueError):
            continue
        found[notebook.stem[:2]] = {line[3:].strip() for cell in cells if cell.get("cell_type") == "markdown"
                                    for line in "".join(cell.get("source", "")).splitlines()
                                    if line.startswith("## ")}
    return found


CHAPTER_MENTION = re.compile(r"\bchapter (\d\d)\b")

# The section a front-page fact cites a chapter for: (chapter, its heading as the notebook writes
# it); the link lands there, not at the top of a long page (tests check each heading exists)
FUSED_ANATOMY_SECTION = ("03", "Where fp4lab's fused kernel's time goes")
GEMM_ANATOMY_SECTION = ("01", "Where an FP4 weight-only GEMM's time goes")
COUNTERS_SECTION = ("01", "Where the kernel's cycles go: hardware counters")


def heading_anchor(heading: str) -> str:
    """The anchor MyST gives a heading (`myst_heading_anchors` in _config.yml; GitHub's rule:
    lower case, spaces to hyphens, other punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def link_chapters(line: str, pages: dict[str, str], sections: tuple[tuple[str, str], ...] = ()) -> str:
    """Each "chapter NN" of a front-page line as a link to that page of the diagnosed run's part,
    to the section `sections` names for that chapter where it names one; plain text where the book
    has no such page."""
    anchors = {chapter: heading_anchor(heading) for chapter, heading in sections}

    def link(mention: re.Match) -> str:
        number = mention.group(1)
        if number not in pages:
            return mention.group(0)
        if number in anchors:
            return f"[chapter {number}]({pages[number]}.ipynb#{anchors[number]})"
        return f"{{doc}}`chapter {number} <{pages[number]}>`"

    return CHAPTER_MENTION.sub(link, line)


GLOSSARY = (
    ("B, decode batch", "requests decoding one token each in one step; each MoE layer routes their tokens to experts"),
    ("path", "one way to run the layer: a fused MoE kernel (humming-moe-indexed, triton-w4a16-moe, ...), a "
             "grouped GEMM, or a loop of one GEMM per expert (\"... loop\")"),
    ("weight-read floor", "the bytes of the active experts' weights read once at the copy bandwidth this run "
                          "measured: no kernel that reads them is much faster (a read-only stream can beat a "
                          "copy by a few percent, so a path at ~100% of it is at the floor)"),
    ("launch floor / compute floor", "the path's expert-GEMM launches at the measured launch time (routing "
                                     "and glue kernels not counted: a lower bound); its FLOPs at the measured "
                                     "peak of its math dtype"),
    ("memory-bound / kernel-limited", "memory-bound: the weight-read floor is the largest of the three "
                                      "floors and most of the time; kernel-limited above its memory floor: that "
                                      "floor is the largest but under {kernel_gap} of the time, the rest is the "
                                      "kernel's own"),
    ("power-capped", "replayed back to back (the run's energy window), the path drew at least "
                     "{power_bound} of the board's power limit, or the driver reported a power clock event: "
                     "the SM clock drops and each call takes longer than in the timer's short bursts"),
    ("MMA, instructions per weight", "MMA: a tensor-core matrix multiply-accumulate instruction; "
                                     "instructions per weight: the instructions the kernel's threads execute "
                                     "(loads, decode, MMAs, addressing; a warp instruction counts 32) over the "
                                     "weights it reads, from Nsight Compute's counts"),
    ("NVFP4 / MXFP4", "4-bit e2m1 weights with a scale per 16 (e4m3, NVIDIA) or per 32 (e8m0, OCP MX) weights; "
                      "on Hopper, weight-only kernels decode them to bf16 in registers"),
    ("EP", "expert parallelism: P GPUs each hold E/P experts and exchange tokens by all-to-all"),
    ("humming, cuda-w4a16-moe, triton-w4a16-moe", "humming (humming-kernels) is vLLM's quantized-GEMM "
                                                  "backend, its FP4 GEMM and MoE kernels the ones vLLM "
                                                  "deploys; cuda-w4a16-moe and triton-w4a16-moe are "
                                                  "fp4lab's own fused FP4 MoE kernels (CUDA and Triton)"),
    ("the seed", f"the investigation this book began from: FP4 MoE decode on {SEED_POWER['gpus']} "
                 f"{SEED_POWER['gpu']} GPUs drawing {SEED_POWER['watts']} W of {SEED_POWER['tdp_w']} W each"),
)


def glossary_html() -> str:
    from fp4lab.analysis.decode import KERNEL_GAP, DiagnosisConfig

    values = {"kernel_gap": text.pct(100 * KERNEL_GAP, 0),
              "power_bound": text.pct(100 * DiagnosisConfig.power_bound_fraction, 0)}
    items = "".join(f"<li><b>{text.html(term)}</b>: {text.html(meaning.format(**values))}</li>"
                    for term, meaning in GLOSSARY)
    return f"<ul>{items}</ul>"


def run_summary(run: RunDir, report: dict[str, Any]) -> list[str]:
    chapters = report.get("chapters", [])
    failed = [c for c in chapters if c["status"] != "ok"]
    lines = ["## This run", ""]
    if failed:
        items = "".join(f"<li><b>{text.html(c['chapter'])}</b>: {text.html(c['error'] or 'unknown error')}</li>"
                        for c in failed)
        lines += ["```{raw} html", f'<div class="fp4lab-danger" style="background:#fdeded;border-left:5px solid #c00;'
                  f'padding:0.5em 1em"><p><b>{len(failed)} of {len(chapters)} chapters failed</b>; their pages show how '
                  f"far they got and the error.</p><ul>{items}</ul></div>", "```", ""]
    kind = "GPU run" if report.get("gpu") else "CPU smoke run (a check of the pipeline)"
    lines += [f"Run {text.code(run.run_id)}: {kind}, profile {text.md(report.get('profile'))}, started "
              f"{text.md(report.get('started'))}; reference run "
              f"{text.code(Path(report['reference_dir']).name) if report.get('reference_dir') else 'none'}.", ""]
    if not report.get("gpu") and report.get("reference_dir"):
        # the table below is the only chapter list in the page's body: say whose its pages are
        lines += ["Its chapters below check the pipeline on this machine and measure no GPU: the diagnosis above "
                  "reads the reference run, whose chapters are the sidebar's first part.", ""]
    lines += ["| chapter | status | seconds |", "|---|---|---:|"]
    for c in chapters:
        mark = "ok" if c["status"] == "ok" else "**failed**"
        lines.append(f"| {{doc}}`{text.md(c['title'])} <chapters/{c['chapter']}>` | {mark} | {c['seconds']:.1f} |")
    return lines + [""]
