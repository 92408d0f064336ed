"""The backends and MoE methods a sweep can name: the registries, plus test fakes.

`FP4LAB_EXTRA_BACKENDS` (a comma list of modules) is how the tests' fake backends and methods
(wrong results, crashes, hangs) reach worker processes: each module's `register()` is called
once per process before a name is looked up.
"""

from __future__ import annotations

import functools
import importlib
import os


@functools.lru_cache(maxsize=None)
def _load_extra(spec: str) -> None:
    for name in filter(None, (part.strip() for part in spec.split(","))):
        module = importlib.import_module(name)
        if hasattr(module, "register"):
            module.register()


def load_extra_backends() -> None:
    _load_extra(os.environ.get("FP4LAB_EXTRA_BACKENDS", ""))


def backend_names() -> list[str]:
    from fp4lab import backends

    load_extra_backends()
    return backends.names()


def backend(name: str):
    from fp4lab import backends

    load_extra_backends()
    return backends.get(name)


def moe_method_names() -> list[str]:
    from fp4lab.backends import moe

    load_extra_backends()
    return moe.names()


def moe_method(name: str):
    from fp4lab.backends import moe

    load_extra_backends()
    return moe.get(name)
