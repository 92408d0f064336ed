"""Notebooks in git carry no outputs, take the four common parameters, and match the params files."""

from __future__ import annotations

import subprocess

import nbformat
import pytest
import yaml

from fp4lab.report import CHAPTER_PATTERN, NOTEBOOKS_DIR, PROFILES
from fp4lab.results import REPO_ROOT

COMMON_PARAMETERS = ("run_dir", "reference_dir", "profile", "device")


def tracked_notebooks() -> list[str]:
    """Chapter notebooks git knows about (committed or staged); on a tree without git, those on
    disk. Executed notebooks of committed runs (results/reference/*/notebooks) keep their outputs."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "notebooks/*.ipynb"], cwd=REPO_ROOT,
                                capture_output=True, text=True, check=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.rglob("notebooks/*.ipynb")]
    return sorted(p for p in listed if (REPO_ROOT / p).exists())


def parameters_cell(nb) -> nbformat.NotebookNode | None:
    return next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)


def defined_names(source: str) -> set[str]:
    return {line.split("=", 1)[0].strip() for line in source.splitlines()
            if "=" in line and not line.lstrip().startswith("#")}


@pytest.mark.parametrize("path", tracked_notebooks())
def test_notebook_is_stored_clean_with_parameters(path):
    nb = nbformat.read(str(REPO_ROOT / path), as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path}: cells {dirty} carry outputs or execution counts; strip them before committing"
    assert nb.cells and nb.cells[0].cell_type == "markdown", f"{path}: the first cell must say what the chapter investigates"
    params = parameters_cell(nb)
    assert params is not None, f"{path}: no code cell tagged 'parameters' (papermill needs one)"
    missing = set(COMMON_PARAMETERS) - defined_names(params.source)
    assert not missing, f"{path}: the parameters cell lacks {sorted(missing)}"


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_params_name_real_notebooks_and_parameters(profile):
    file = NOTEBOOKS_DIR / "params" / f"{profile}.yaml"
    values = yaml.safe_load(file.read_text()) or {}
    chapters = {p.stem: p for p in NOTEBOOKS_DIR.iterdir() if CHAPTER_PATTERN.match(p.name)}
    for stem, params in values.items():
        assert stem in chapters, f"{file.name}: {stem!r} is not a notebook in notebooks/"
        names = defined_names(parameters_cell(nbformat.read(str(chapters[stem]), as_version=4)).source)
        unknown = set(params) - names
        assert not unknown, f"{file.name}: {stem} has no parameter(s) {sorted(unknown)}"
