"""The two install routes agree: pyproject.toml (pip, the Makefile) and environment.yml (conda)."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAMED_IN_THE_BRIEF = {"torch", "flashinfer-python", "sgl-kernel", "jupyterlab", "matplotlib",
                      "seaborn", "papermill"}
CONDA_ONLY = {"python", "pip"}


def split_requirement(text: str) -> tuple[str, str]:
    """'jupyter-book>=1.0,<2' -> ('jupyter-book', '>=1.0,<2'), names normalized as pip does."""
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", text)
    assert match, f"unparseable requirement {text!r}"
    return re.sub(r"[-_.]+", "-", match.group(1)).lower(), match.group(2).replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return dict(split_requirement(r) for r in requirements)


def environment_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "fp4lab" and env["channels"], "environment.yml needs a name and channels"
    found = {}
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            found.update(split_requirement(r) for r in entry["pip"] if not r.startswith("-e"))
        else:
            name, spec = split_requirement(entry)
            if name not in CONDA_ONLY:
                found[name] = spec
    return found


def test_environment_yml_parses_and_installs_the_project_itself():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_entries = [e for e in env["dependencies"] if isinstance(e, dict)]
    assert len(pip_entries) == 1 and "-e ." in pip_entries[0]["pip"]


def test_environment_yml_and_pyproject_list_the_same_packages_and_versions():
    from_pyproject, from_environment = pyproject_requirements(), environment_requirements()
    assert set(from_pyproject) == set(from_environment), (
        f"only in pyproject: {sorted(set(from_pyproject) - set(from_environment))}; "
        f"only in environment.yml: {sorted(set(from_environment) - set(from_pyproject))}")
    differing = {name: (from_pyproject[name], from_environment[name]) for name in from_pyproject
                 if from_pyproject[name] != from_environment[name]}
    assert not differing, f"version specs differ (pyproject, environment.yml): {differing}"


def test_the_named_packages_are_there_and_the_gpu_libraries_are_optional():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert NAMED_IN_THE_BRIEF <= set(pyproject_requirements())
    core = {split_requirement(r)[0] for r in project["dependencies"]}
    gpu = {split_requirement(r)[0] for r in project["optional-dependencies"]["gpu"]}
    assert {"flashinfer-python", "sgl-kernel"} <= gpu and not {"flashinfer-python", "sgl-kernel"} & core
    assert "jupyter-book" in core and pyproject_requirements()["jupyter-book"].endswith("<2")


def test_ci_runs_make_test_and_the_readme_gives_the_two_commands():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make report" in readme and "make test" in readme
