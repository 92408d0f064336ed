"""Imports point down: base -> model -> measure -> results -> sweep -> analysis -> plots ->
chapters -> report/CLI. A module may import its own layer or lower ones, never a higher one
(read from the source with ast, so an import inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fp4lab"

LAYERS = {   # module (or package) -> layer; a deeper name inherits its package's layer
    "errors": 0, "dtypes": 0, "params": 0, "text": 0, "formats": 0, "hardware": 0, "nvml": 0,
    "correctness": 0, "profiles": 0, "references": 0, "roofline": 0, "progress": 0, "tiles": 0,
    "torchrun": 0,
    "moe": 1,
    "bench": 2, "ceilings": 2, "telemetry": 2, "backends": 2, "where": 2,
    "schema": 3, "results": 3,
    "sweep": 4, "comm": 4,
    "analysis": 5,
    "plots": 6,
    "chapters": 7,
    "book": 8, "report": 8, "share": 8, "cli": 8, "gpus_cli": 8, "__main__": 8, "__init__": 8,
}
# Edges forbidden even downward: the analysis reads tables, never backends, timers or the sweep;
# plots draw frames, no I/O and no analysis of their own.
FORBIDDEN = {"analysis": {"backends", "sweep", "bench", "ceilings", "telemetry", "comm.runner",
                          "comm.launch", "comm.collectives"},
             "plots": {"results", "sweep", "backends", "bench", "analysis"}}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts)


def layer_of(name: str) -> int:
    parts = name.split(".")
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in LAYERS:
            return LAYERS[".".join(parts[:depth])]
    raise KeyError(f"fp4lab.{name} has no layer in tests/test_layers.py: add it")


def fp4lab_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fp4lab"):
            base = node.module.removeprefix("fp4lab").lstrip(".")
            names += [f"{base}.{alias.name}".strip(".") if not base else base for alias in node.names] \
                if base else [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name.removeprefix("fp4lab.") for alias in node.names if alias.name.startswith("fp4lab.")]
    return names


MODULES = sorted(p for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_point_down(path):
    mine = module_name(path)
    if mine.endswith("__init__") and mine != "__init__":
        mine = mine.removesuffix(".__init__")
    here = layer_of(mine)
    upward = [name for name in fp4lab_imports(path) if layer_of(name) > here]
    assert not upward, f"fp4lab.{mine} (layer {here}) imports upward: {upward}"
    top = mine.split(".")[0]
    forbidden = [name for name in fp4lab_imports(path)
                 for bad in FORBIDDEN.get(top, ()) if name == bad or name.startswith(bad + ".")]
    assert not forbidden, f"fp4lab.{mine} must not import {forbidden}"


def test_the_detector_catches_an_upward_import(tmp_path):
    sneaky = tmp_path / "x.py"
    sneaky.write_text("def f():\n    from fp4lab.chapters import ch01_gemm\n")
    assert "chapters" in fp4lab_imports(sneaky) and layer_of("chapters") > layer_of("plots")
