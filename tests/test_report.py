"""make report orchestration on tiny fake notebooks: failures are recorded, the book still builds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from fp4lab import report
from fp4lab.results import REPO_ROOT, RunDir


def fake_notebook(path: Path, title: str, body: str, extra_params: str = "") -> Path:
    """A chapter shaped like the real ones: title, parameters cell, validation, body."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        f'run_dir = ""\nreference_dir = ""\nprofile = "smoke"\ndevice = "auto"\n{extra_params}')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {title}\n\nA fake chapter for the tests."),
                params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "fp4lab", "display_name": "Python (fp4lab)", "language": "python"}
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def book_dir(tmp_path) -> Path:
    book = tmp_path / "book"
    book.mkdir()
    for name in ("_config.yml", "intro.md"):
        shutil.copy(REPO_ROOT / "book" / name, book / name)
    return book


@pytest.fixture
def chapters(tmp_path) -> list[Path]:
    folder = tmp_path / "notebooks"
    (folder / "params").mkdir(parents=True)
    (folder / "params" / "smoke.yaml").write_text("00_first:\n  size: 3\n02_third:\n  size: 4\n")
    validate = ("if not isinstance(size, int) or size <= 0:\n"
                "    raise ValueError(f'size={size!r}: must be a positive integer')\n")
    return [
        fake_notebook(folder / "00_first.ipynb", "First", validate + "print('size', size)", "size = 1"),
        fake_notebook(folder / "01_broken.ipynb", "Broken", "raise RuntimeError('backend exploded')"),
        fake_notebook(folder / "02_third.ipynb", "Third", validate + "print('third ran', size)", "size = 1"),
    ]


def test_resolve_profile():
    assert report.resolve_profile("auto", has_cuda=False) == ("smoke", report.NO_GPU_MESSAGE)
    assert report.resolve_profile("auto", has_cuda=True)[0] == "full"
    assert report.resolve_profile("smoke", has_cuda=True)[0] == "smoke"
    with pytest.raises(ValueError, match="profile 'huge'"):
        report.resolve_profile("huge")


def test_chapter_parameters_merge_yaml_and_the_four():
    params = report.chapter_parameters("01_x", {"01_x": {"m_values": [1, 2], "run_dir": "wrong"}},
                                       "/r", "", "smoke", "cpu")
    assert params == {"m_values": [1, 2], "run_dir": "/r", "reference_dir": "", "profile": "smoke",
                      "device": "cpu"}


def test_latest_reference_dir(tmp_path):
    assert report.latest_reference_dir(tmp_path / "none") == ""
    for run_id in ("20261101T000000Z-h200", "20261130T000000Z-h200"):
        RunDir.create(tmp_path, run_id).append_rows("gemm", [{"backend": "torch-bf16", "m": 1}])
    # newer, but one measurement only (a second MoE preset): not a reference for the book
    RunDir.create(tmp_path, "20261201T000000Z-h200-moe").append_rows("moe", [{"preset": "glm-5"}])
    assert report.latest_reference_dir(tmp_path).endswith("20261130T000000Z-h200")


def test_profile_params_must_be_a_mapping_per_notebook(tmp_path):
    (tmp_path / "smoke.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="smoke.yaml"):
        report.load_profile_params("smoke", tmp_path)


@pytest.mark.slow
def test_failing_chapter_does_not_stop_the_others_or_the_book(tmp_path, book_dir, chapters, capsys):
    pytest.importorskip("jupyter_book", reason="builds the book (jupyter-book is in the venv)")
    result = report.run_report("smoke", "testrun", tmp_path / "runs", chapters, book_dir=book_dir,
                               reference_dir="", device="cpu")
    out = capsys.readouterr().out
    assert [c.status for c in result.chapters] == ["ok", "failed", "ok"]
    assert "RuntimeError: backend exploded" in result.chapters[1].error
    assert result.exit_code == 1
    assert "01_broken" in out and "failed" in out and "where the time goes" in out
    # every notebook, the failed one too, is saved in the run folder and copied into the book
    for nb in chapters:
        assert (tmp_path / "runs" / "testrun" / "notebooks" / nb.name).exists()
        assert (book_dir / "chapters" / nb.name).exists()
    executed = nbformat.read(str(tmp_path / "runs/testrun/notebooks/00_first.ipynb"), as_version=4)
    assert "size 3" in json.dumps(executed.cells[-1].outputs)  # the yaml value reached the chapter
    run = json.loads((tmp_path / "runs" / "testrun" / "run.json").read_text())
    assert [c["status"] for c in run["report"]["chapters"]] == ["ok", "failed", "ok"]
    assert run["report"]["profile"] == "smoke" and "book" in run["report"]["stages"]
    # the front page lists the failure with its error
    assert result.book.status == "ok", (result.book.error, result.book.warnings)
    index = (book_dir / "_build" / "html" / "intro.html").read_text()
    assert "01_broken" in index and "backend exploded" in index
    assert 'href="chapters/01_broken.html"' in index
    for nb in chapters:
        assert (book_dir / "_build" / "html" / "chapters" / f"{nb.stem}.html").exists()


@pytest.mark.slow
def test_bad_parameter_gives_a_clear_error_in_that_chapter(tmp_path, chapters):
    result = report.execute_chapter(chapters[0], tmp_path / "out.ipynb", {"size": -2})
    assert result.status == "failed"
    assert result.error == "ValueError: size=-2: must be a positive integer"
    saved = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    assert any(o.get("ename") == "ValueError" for c in saved.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
