"""Shared fixtures: a fake GPU, a fake NVML, the fake backends for worker processes, and the
`cuda` marker's skip on machines without a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR))

from fakes.gpu import FakeGpu  # noqa: E402
from fakes.nvml import FakeNvml  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist, each worker (and every process it starts: sweeps, torchrun ranks,
    notebook kernels) gets its share of the cores. Left alone, torch gives each of them every
    core: 15 workers on a 16-core GPU box ran ~240 busy threads and the timing-based tests
    (a point's time limit, a launcher's, a 2x slowdown) measured the contention instead."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.cuda` tests need a CUDA GPU: skipped, with that reason, everywhere else.
    `@pytest.mark.longest` tests run first: under xdist the longest test then starts at once
    on its worker (whose other tests the idle workers take) instead of ending the run alone
    (on the H200, the notebooks with their defaults measure the smoke grid for minutes)."""
    items.sort(key=lambda item: "longest" not in item.keywords)    # stable: the rest keep order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend torch sees a GPU: `fake_gpu((10, 0))` installs a B200-like one and returns it."""
    def install(capability=(9, 0), **fields) -> FakeGpu:
        return FakeGpu(capability=tuple(capability), **fields).install(monkeypatch)
    return install


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a FakeNvml as `pynvml`: `fake_nvml(power_w=..., unsupported=...)` returns it."""
    def install(**knobs) -> FakeNvml:
        fake = FakeNvml(**knobs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake
    return install


@pytest.fixture(autouse=True)
def registries_as_they_were():
    """A test that loads the fake backends in this process (an in-process `cli.main` under
    FP4LAB_EXTRA_BACKENDS) leaves the registries as it found them, so later tests see the real
    names only."""
    from fp4lab import backends
    from fp4lab.backends import moe
    from fp4lab.sweep import registry

    saved = dict(backends.REGISTRY), dict(moe.REGISTRY)
    yield
    for live, before in zip((backends.REGISTRY, moe.REGISTRY), saved):
        live.clear()
        live.update(before)
    registry._load_extra.cache_clear()


@pytest.fixture
def fake_backends_env(monkeypatch):
    """Worker processes load the fake backends of tests/fakes/backends.py."""
    monkeypatch.setenv("FP4LAB_EXTRA_BACKENDS", "fakes.backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
