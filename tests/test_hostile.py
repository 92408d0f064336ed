"""A run folder is data, never markup (issue 11, defect 1: backend names went into Markdown
unescaped and `<svg onload=...>` ran when the page opened).

A real GPU run (the committed H200 reference) is copied with hostile strings (tests/fakes/hostile)
in every text field of its rows, telemetry and run.json, and in its folder name. Every chapter
page is built from it and shown section by section as a notebook shows it, Markdown rendered as
myst-nb renders it (CommonMark with raw HTML passed through: stricter than html disabled); the
front page, the share file and (slow) the built book are checked the same way. Nothing may be
live: no tag fp4lab does not emit, no `on...` handler, no `javascript:` URL, no MyST role or
directive from data. And the data is still shown, as text."""

from __future__ import annotations

import html as html_lib
import re

import pytest

from fakes.hostile import (HOSTILE, hostile_run, live_markup, markdown_html, notebook_of, output_problems,
                           payload_markup, raw_html_blocks, shown, unescaped_myst)
from fp4lab import text
from fp4lab.chapters import CHAPTERS
from fp4lab.errors import ParameterError
from fp4lab.results import REFERENCE_ROOT, RunDir, find_run_dirs

# the newest reference run that holds every table (20261203T1155Z measured no comm: NOTES, call 62)
SOURCE = [path for path in find_run_dirs(REFERENCE_ROOT) if RunDir(path).has_table("comm")][-1]
# chapter knobs that keep the routing model small (seconds, not tens of seconds)
SMALL = {"01_fp4_gemm_sweep": {"measure": False},
         "03_moe_expert_scatter": {"measure": False, "batch_sizes": [64, 512], "ep_degrees": [1, 8],
                                   "steps": 8},
         "04_diagnosis": {"steps": 8}}


# -- the escaping functions themselves ----------------------------------------------------------------

@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_md_code_and_html_leave_text_as_text(value):
    for markdown in (text.md(value), text.code(value), f"- a finding about {text.md(value)}, ok"):
        rendered = markdown_html(markdown)
        assert not live_markup(rendered) and not unescaped_myst(markdown), markdown
    one_line = " ".join(value.split())
    shown_text = re.sub(r"<[^>]+>", "", markdown_html(text.md(value)))
    assert html_lib.unescape(shown_text).strip() == one_line         # the reader sees the value
    assert not live_markup(f"<p title='{text.html(value)}'>{text.html(value)}</p>")
    assert not live_markup(text.markdown_to_html(text.md(value)))


# -- every chapter page ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return {"names": hostile_run(SOURCE, root / "names"),
            "everything": hostile_run(SOURCE, root / "everything", everything=True)}


@pytest.fixture(scope="module")
def pages(hostile_runs):
    """Each chapter built from each hostile run (reference: none; measured on a GPU, rendered on
    this CPU, so nothing is measured)."""
    return {(variant, name): module.build(str(path), "none", "full", "cpu", **SMALL.get(name, {}))
            for variant, path in hostile_runs.items() for name, module in CHAPTERS.items()}


@pytest.fixture(scope="module")
def outputs(pages):
    """What the notebook of each page shows (figures rendered to PNG once)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {key: shown(page, monkeypatch) for key, page in pages.items()}


@pytest.mark.parametrize("variant", ["names", "everything"])
@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_no_live_markup_on_any_page(outputs, chapter, variant):
    assert outputs[variant, chapter] and not output_problems(outputs[variant, chapter])


def test_the_hostile_strings_are_shown_as_text(outputs):
    """Not vacuous: the names reached the pages (escaped), and the figures rendered."""
    seen = ""
    for chapter in CHAPTERS:
        shown_here = outputs["names", chapter]
        seen += " ".join(content for _, mime, content in shown_here if mime != "image/png")
        assert any(mime == "image/png" for _, mime, _ in shown_here) or chapter in ("06_history",)
    plain = html_lib.unescape(seen).replace("\\", "")
    assert "<svg onload=alert(1)>" in plain and "javascript:alert(1)" in plain
    assert "<img src=x onerror=alert(1)>" in plain


def test_rows_with_hostile_vocabulary_are_skipped_and_named(pages, hostile_runs):
    notes = " ".join(pages["everything", "01_fp4_gemm_sweep"].notes)
    assert re.search(re.escape(f"{hostile_runs['everything'] / 'gemm.jsonl'} line 1: column '") + r"\w+' holds", notes)
    assert "more bad lines" in notes


def test_hostile_chapter_parameters_are_refused_or_escaped(hostile_runs, monkeypatch):
    run_dir = str(hostile_runs["names"])
    for value in HOSTILE[:4]:
        with pytest.raises(ParameterError) as caught:
            CHAPTERS["01_fp4_gemm_sweep"].build(run_dir, "none", "full", "cpu", backends=[value], measure=False)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 600
        with pytest.raises(ParameterError):
            CHAPTERS["03_moe_expert_scatter"].build(run_dir, "none", "full", "cpu", preset=value, measure=False)
        with pytest.raises(ParameterError):
            CHAPTERS["04_diagnosis"].build(run_dir, "none", "full", "cpu", routing=value)
        with pytest.raises(ParameterError, match="no measured path of that name"):
            CHAPTERS["04_diagnosis"].build(run_dir, "none", "full", "cpu", backend=value, steps=8)
        with pytest.raises(ParameterError):
            CHAPTERS["00_environment"].build(run_dir, value, "full", "cpu")
    page = CHAPTERS["06_history"].build(run_dir, "none", "full", "cpu", runs_dir=str(hostile_runs["names"].parent))
    assert not output_problems(shown(page, monkeypatch))


# -- the front page and the share file -------------------------------------------------------------

@pytest.fixture
def small_diagnosis(monkeypatch):
    """The profiles' diagnosis section with few routing steps (the front page and the share file
    take it from the profile)."""
    from fp4lab import profiles

    section = profiles.section

    def small(profile, name):
        values = section(profile, name)
        return {**values, "steps": 8} if name == "diagnosis" else values

    monkeypatch.setattr(profiles, "section", small)


def test_front_page_has_no_live_markup(hostile_runs, tmp_path, small_diagnosis):
    from fp4lab import book

    local = RunDir.create(tmp_path, run_id="local-smoke")
    report = {"profile": "full", "started": HOSTILE[2], "reference_dir": str(hostile_runs["names"]),
              "gpu": None, "chapters": [{"chapter": "04_diagnosis", "title": HOSTILE[0], "status": "failed",
                                         "error": HOSTILE[2], "seconds": 1.0, "notebook": "x"}]}
    for variant in ("names", "everything"):
        markdown = book.front_page(local, report, RunDir.open(hostile_runs[variant]))
        rest, blocks = raw_html_blocks(markdown)
        assert blocks, "the verdict box and the failures are raw HTML blocks"
        problems = [p for block in blocks for p in live_markup(block)] + live_markup(markdown_html(rest))
        assert not problems
        roles = unescaped_myst(rest)
        assert set(roles) <= {"{doc}"}, roles          # the chapter links are the only roles


def test_share_file_has_no_live_markup(hostile_runs, tmp_path, small_diagnosis):
    """`share` picks the newest run (the hostile one, by its folder, whatever its name) and writes
    one file: nothing in it is live, and the names are there as text."""
    from fp4lab import share

    target = share.share(None, hostile_runs["names"].parent, tmp_path / "share")
    assert target.parent == tmp_path / "share" and target.name.endswith("-diagnosis.html")
    page = target.read_text()
    assert not live_markup(page)
    assert "&lt;svg onload=alert(1)&gt;" in page and "<img alt=" in page
    assert not live_markup(share.share_html(RunDir.open(hostile_runs["everything"]), "full"))


# -- the reference part of the book: notebooks from a run folder -----------------------------------

def test_live_outputs_in_a_reference_runs_notebooks_are_removed(tmp_path, monkeypatch):
    import nbformat

    from fp4lab import book

    outputs = [("x", "text/html", "<p>kept</p>"), ("x", "text/html", HOSTILE[2]),
               ("x", "text/markdown", "```{raw} html\n<script>alert(1)</script>\n```"),
               ("x", "text/markdown", "fine *text*"), ("x", "image/svg+xml", "<svg onload=alert(1)></svg>")]
    notebook = notebook_of(outputs, "01 · hostile")
    notebook.cells.append(nbformat.v4.new_markdown_cell("<img src=x onerror=alert(1)>"))
    source = tmp_path / "in.ipynb"
    nbformat.write(notebook, str(source))
    book.hide_code(source, tmp_path / "out.ipynb")
    staged = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    data = [o.get("data", {}) for cell in staged.cells for o in cell.get("outputs", [])]
    assert {"text/html": "<p>kept</p>", "text/plain": "<output>"} in data
    assert {"text/markdown": "fine *text*", "text/plain": "<output>"} in data
    flat = str(staged)
    assert "alert(1)" not in flat and flat.count("removed by fp4lab") == 4


# -- the book, built (slow) ------------------------------------------------------------------------

@pytest.mark.slow
def test_the_built_book_of_a_hostile_run_has_no_live_markup(hostile_runs, outputs, tmp_path, monkeypatch):
    """book.stage + book.build (Jupyter Book 1, Sphinx, myst-nb) of notebooks holding exactly what
    the chapters show, the hostile run as this run and as the reference run."""
    import nbformat

    from fp4lab import book

    pytest.importorskip("jupyter_book")
    book_dir = tmp_path / "book"
    for name in ("_config.yml", "intro.md"):
        (book_dir).mkdir(exist_ok=True)
        (book_dir / name).write_text((book.BOOK_DIR / name).read_text())
    monkeypatch.setattr(book, "BOOK_DIR", book_dir)
    monkeypatch.setattr(book, "PUBLISHED", book_dir / "_build" / "html")
    run = RunDir.open(hostile_runs["names"])
    (run.path / "notebooks").mkdir()
    chapters = []
    for chapter in CHAPTERS:
        path = run.path / "notebooks" / f"{chapter}.ipynb"
        nbformat.write(notebook_of(outputs["names", chapter], chapter), str(path))
        chapters.append({"chapter": chapter, "title": chapter, "status": "ok", "error": None,
                         "seconds": 1.0, "notebook": str(path)})
    report = {"profile": "full", "gpu": "x", "started": "today", "reference_dir": str(run.path),
              "chapters": chapters}
    with book.book_lock():
        staged = book.stage(run, chapters, run, book.front_page(run, report, run))
        result = book.build(staged)
    assert result.status in ("ok", "warnings"), (result.error, result.warnings[-5:])
    built = sorted((book_dir / "_build" / "html").rglob("*.html"))
    assert len(built) >= 1 + 2 * len(CHAPTERS)
    problems = {str(page.relative_to(book_dir)): payload_markup(page.read_text()) for page in built}
    assert not {page: found for page, found in problems.items() if found}
    front = (book_dir / "_build" / "html" / "intro.html").read_text()
    assert "&lt;svg onload=alert(1)&gt;" in front
