"""`share`: one self-contained HTML file of the diagnosis, readable with no network."""

from __future__ import annotations

import base64
import io
import re

import matplotlib
import nbformat
import pytest

pytest.importorskip("nbconvert", reason="share renders through nbconvert (in the venv; not on bare GPU boxes)")

from fp4lab import report
from fp4lab.results import RunDir

matplotlib.use("Agg")


def tiny_png() -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def executed_diagnosis(run: RunDir) -> None:
    """A stand-in for an executed chapter 04: a markdown verdict and a figure output."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("figure()", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": tiny_png(), "text/plain": "fig"}),
                    nbformat.v4.new_output("display_data", data={"text/markdown": "**Verdict: memory-bound**"})]
    nb.cells = [nbformat.v4.new_markdown_cell("# Diagnosis\n\nMath-free prose."), cell]
    (run.path / "notebooks").mkdir()
    nbformat.write(nb, str(run.path / "notebooks" / "04_diagnosis.ipynb"))


def test_share_writes_one_self_contained_file(tmp_path):
    run = RunDir.create(tmp_path / "runs", "20261130T000000Z-cpu")
    executed_diagnosis(run)
    target = report.share(None, tmp_path / "runs", tmp_path / "share")
    assert target == tmp_path / "share" / "20261130T000000Z-cpu-diagnosis.html"
    html = target.read_text()
    assert "data:image/png;base64," in html
    assert "Verdict: memory-bound" in html
    assert report.remote_references(html) == []
    assert not re.search(r"<script[^>]*>(?:(?!</script>).)*https?://", html, re.DOTALL)
    assert "<style" in html  # the styling travels inside the file


def test_share_without_a_run_or_diagnosis_says_why(tmp_path):
    with pytest.raises(ValueError, match="no run folders under"):
        report.share(None, tmp_path / "none", tmp_path / "share")
    RunDir.create(tmp_path / "runs", "r1")
    with pytest.raises(ValueError, match="no executed diagnosis chapter"):
        report.share("r1", tmp_path / "runs", tmp_path / "share")


def test_remote_script_tags_are_removed():
    page = ('<head><script src="https://cdnjs.cloudflare.com/require.min.js"></script>'
            '<script type="module">const m = await import("https://cdnjs.cloudflare.com/mermaid.mjs");</script>'
            '<script src="local.js"></script><link rel="stylesheet" href="https://fonts.example/x.css">'
            '</head>')
    cleaned = report.self_contained(page)
    assert "cdnjs" not in cleaned and "local.js" in cleaned and "mermaid" not in cleaned
    assert report.remote_references(cleaned) == ["https://fonts.example/x.css"]  # links are reported, not hidden
