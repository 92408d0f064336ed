"""The notebooks: stored clean, thin (every knob in one parameters cell that matches its chapter
module, every code cell hidden in the book), and runnable top to bottom in order with their
defaults, without papermill, chaining through one default run folder (as in JupyterLab)."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys

import nbformat
import pytest

from fp4lab.chapters import CHAPTERS
from fp4lab.report import CHAPTER_PATTERN, NOTEBOOKS_DIR
from fp4lab.results import REPO_ROOT

COMMON = ("run_dir", "reference_dir", "profile", "device")
NOTEBOOKS = sorted(p for p in NOTEBOOKS_DIR.iterdir() if CHAPTER_PATTERN.match(p.name))


def read(path):
    return nbformat.read(str(path), as_version=4)


def parameters_cell(book):
    return next(c for c in book.cells if "parameters" in c.metadata.get("tags", []))


def assigned_names(source: str) -> list[str]:
    return [node.targets[0].id for node in ast.parse(source).body if isinstance(node, ast.Assign)]


def test_every_chapter_has_a_notebook_and_a_module():
    assert [p.stem for p in NOTEBOOKS] == list(CHAPTERS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_clean_and_thin(path):
    book = read(path)
    dirty = [i for i, c in enumerate(book.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: strip them before committing"
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# "), \
        "the first cell says what the chapter investigates"
    for cell in book.cells:
        if cell.cell_type == "code":
            tags = cell.metadata.get("tags", [])
            assert "remove-input" in tags or "remove-cell" in tags, f"a code cell shows its code: {cell.source[:60]}"
            if "parameters" not in tags:
                assert len(cell.source.splitlines()) <= 6, "notebooks are thin: logic lives in fp4lab.chapters"
    assert "findings" in book.cells[-1].source, "each notebook ends with what it found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_match_the_chapter_module(path):
    cell = parameters_cell(read(path))
    names = assigned_names(cell.source)
    assert names[:4] == list(COMMON)
    build = inspect.signature(CHAPTERS[path.stem].build).parameters
    assert set(names) == set(build), f"notebook parameters {names} != build() arguments {list(build)}"
    for line in cell.source.splitlines():       # papermill cannot parse `name = value  # a = b`
        comment = line.partition("#")[2]
        assert "=" not in comment, f"'=' inside a parameter comment breaks papermill: {line}"


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.timeout(900)
def test_notebooks_run_in_order_with_their_defaults(tmp_path):
    """As a user in JupyterLab: each notebook top to bottom, defaults only (no papermill
    injection); 01 and 03 measure into the default run folder, 04 and 05 read it."""
    script = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "for path in sys.argv[1:]:\n"
        "    book = nbformat.read(path, as_version=4)\n"
        "    NotebookClient(book, kernel_name='fp4lab', timeout=600, resources={'metadata': {'path': '" +
        str(NOTEBOOKS_DIR) + "'}}).execute()\n"
        "    print('ran', path, flush=True)\n")
    # `auto` (the notebooks' default) stands for smoke here: on a GPU box it would be the full
    # profile, the ~15 minutes of `make report`, not a test's minutes. And the GPU is hidden: the
    # smoke grid measured on the H200 (gemlite's autotuning, humming's JIT, every anatomy stage)
    # ran past 8 minutes under 15 xdist workers (benchmarks/NOTES.md, call 22). The defaults'
    # GPU path is what `make report` runs there, through these same notebooks (calls 13-14).
    env = {**os.environ, "FP4LAB_RUNS_DIR": str(tmp_path / "runs"), "FP4LAB_PROFILE": "smoke",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script, *map(str, NOTEBOOKS)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lab = tmp_path / "runs" / "lab"
    assert (lab / "gemm.parquet").exists() and (lab / "moe.parquet").exists()
    assert done.stdout.count("ran ") == len(NOTEBOOKS)
