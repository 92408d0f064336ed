"""The profiles: one YAML file per profile, one section per chapter, read by every default.

`smoke` checks the pipeline on a CPU in about a minute; `full` is the reference grid for a GPU.
The sweep, the MoE sweep, the diagnosis and `make report` all take their defaults from here, so a
profile is edited in one place. `auto` means full where torch sees a CUDA GPU, smoke elsewhere,
unless FP4LAB_PROFILE names the profile `auto` stands for (a GPU box that wants the quick book).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

PROFILES = ("smoke", "full")
SECTIONS = ("gemm", "power", "moe", "comm", "diagnosis", "history")
FOLDER = Path(__file__).resolve().parent
AUTO_ENV = "FP4LAB_PROFILE"      # the profile `auto` stands for, where set (smoke or full)


@functools.lru_cache(maxsize=None)
def _load(profile: str) -> dict[str, dict[str, Any]]:
    import yaml

    data = yaml.safe_load((FOLDER / f"{profile}.yaml").read_text()) or {}
    if not isinstance(data, dict) or set(data) - set(SECTIONS):
        raise ValueError(f"profile file {profile}.yaml: expected sections {SECTIONS}, got {sorted(data)}")
    return data


def check(profile: str) -> str:
    from fp4lab.errors import ParameterError
    from fp4lab.params import shown

    if not isinstance(profile, str) or profile not in PROFILES:
        raise ParameterError(f"profile={shown(profile)}: use one of {', '.join(PROFILES)} (or auto)")
    return profile


def resolve(profile: str, has_cuda: bool | None = None) -> str:
    """`auto` -> FP4LAB_PROFILE where set, else full where torch sees a CUDA GPU, else smoke;
    others are checked."""
    if profile == "auto" and os.environ.get(AUTO_ENV):
        from fp4lab.errors import ParameterError

        try:
            return check(os.environ[AUTO_ENV])
        except ParameterError as exc:
            raise ParameterError(f"{AUTO_ENV}: {exc}") from None
    if profile == "auto":
        if has_cuda is None:
            import torch

            has_cuda = torch.cuda.is_available()
        return "full" if has_cuda else "smoke"
    return check(profile)


def section(profile: str, name: str) -> dict[str, Any]:
    """A copy of one section of a profile (e.g. section("full", "gemm"))."""
    if name not in SECTIONS:
        raise ValueError(f"profile section {name!r}: use one of {', '.join(SECTIONS)}")
    values = _load(check(profile)).get(name, {})
    return {key: (dict(value) if isinstance(value, dict) else value) for key, value in values.items()}
