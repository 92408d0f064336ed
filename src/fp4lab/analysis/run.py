"""One run folder as the analysis reads it: its id, the device it measured, whether it is a GPU
run or a CPU smoke run, and the caption every figure and table built from it carries."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4lab import text
from fp4lab.results import RunDir, device_label, device_of, is_gpu_run, later_commits, measured_span


@dataclass(frozen=True)
class RunView:
    run: RunDir
    info: dict[str, Any]                # run.json

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def device(self) -> str:
        """The device the run measured (from its provenance, not the reader's machine)."""
        return device_label(self.info)

    @property
    def device_key(self) -> str | None:
        """The spec sheet key of the device ("h200"), None for a CPU or an unknown GPU."""
        return device_of(self.info).get("spec")

    @property
    def is_gpu(self) -> bool:
        return is_gpu_run(self.info)

    @property
    def profile(self) -> str | None:
        return (self.info.get("report") or {}).get("profile") or \
            ((self.info.get("sweep") or {}).get("config") or {}).get("profile")

    @property
    def is_smoke(self) -> bool:
        """A run on a CPU checks the pipeline; it measures no GPU."""
        return not self.is_gpu

    @property
    def power_limit_w(self) -> float | None:
        return device_of(self.info).get("power_limit_w")

    @property
    def max_sm_clock_mhz(self) -> float | None:
        return device_of(self.info).get("max_sm_clock_mhz")

    @property
    def created(self) -> str:
        return str(self.info.get("created") or "")

    @property
    def measured_span(self) -> str:
        """The days its rows were measured ("2026-12-03 to 2026-12-06"; "" unknown)."""
        return measured_span(self.info)

    def versions(self) -> dict[str, str | None]:
        return dict((self.info.get("provenance") or {}).get("versions") or {})

    def caption(self, what: str = "") -> str:
        """Provenance in one line: run, device, fp4lab commit, torch; `what` first."""
        prov = self.info.get("provenance") or {}
        versions = prov.get("versions") or {}
        parts = [what] if what else []
        parts += [f"run {self.run_id} on {self.device}"]
        if versions.get("torch"):
            parts.append(f"torch {versions['torch']}")
        if prov.get("fp4lab_git_sha"):
            parts.append(f"fp4lab {text.short_sha(str(prov['fp4lab_git_sha']))}" + later_words(later_commits(self.info)))
        return "; ".join(parts)


def later_words(later: list[str]) -> str:
    """The commits that added rows after the run's own, short enough for every caption: two are
    named, more are counted with the last named (run.json and chapter 06 list them all), each as
    git prints it short."""
    shas = [text.short_sha(sha) for sha in later]
    if not shas:
        return ""
    if len(shas) <= 2:
        return f" (rows added later at {', '.join(shas)})"
    return f" (rows added later at {len(shas)} commits, the last {shas[-1]})"


def view(run_dir: str | os.PathLike | RunDir) -> RunView:
    run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(Path(run_dir))
    return RunView(run, run.run_json())
