"""What every chapter takes and checks once: the run folder, the reference run shown beside it,
the profile and the device; and the page it fills.

`run_dir` "" is the default run folder `runs/lab` (under the repository, wherever the notebook
runs), so chapters explored by hand in JupyterLab chain: 01 measures into it, 04 diagnoses it.
`reference_dir` "" is the newest committed reference run, "none" none, else a run folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4lab import params, profiles
from fp4lab.analysis.run import RunView, view
from fp4lab.chapters.page import Page, collect_warnings
from fp4lab.errors import ParameterError
from fp4lab.results import NO_REFERENCE, REPO_ROOT, RUNS_ROOT, RunDir, open_or_create, reference_run

LAB_RUN = RUNS_ROOT / "lab"


@dataclass
class Context:
    run_path: Path
    reference: RunView | None
    profile: str
    device: str                      # resolved: "cpu", "cuda" or "cuda:N"
    page: Page
    parameters: list[tuple[str, Any]] = field(default_factory=list)
    opened: RunDir | None = None     # the run folder, once opened or created

    @property
    def run(self) -> RunDir:
        """The run folder, created when the chapter first uses it: after it has checked its own
        parameters, so a bad one leaves no empty folder behind."""
        if self.opened is None:
            self.opened = open_or_create(self.run_path)
        return self.opened

    @property
    def view(self) -> RunView:
        return view(self.run)

    @property
    def measures_here(self) -> bool:
        """Whether this machine may add measurements to the run: a new run, or one measured on
        the same kind of device. A GPU run rendered on a CPU (or the reverse) is shown as it was
        measured and never added to."""
        if "provenance" not in self.run.run_json():
            return True
        return self.view.is_gpu == (self.device != "cpu")

    def shown_path(self, path) -> str:
        """A path as a page may show it: relative to the repository, never absolute."""
        path = Path(path).resolve()
        try:
            return str(path.relative_to(REPO_ROOT))
        except ValueError:
            return path.name


def open_context(title: str, run_dir: str = "", reference_dir: str = "", profile: str = "auto",
                 device: str = "auto", **knobs: Any) -> Context:
    """Check the four parameters every chapter takes, open the run folder (a new one is created
    on first use, `Context.run`), find the reference run, and start the page. `knobs` are the
    chapter's own parameters, listed on it."""
    from fp4lab import hardware

    params.check_text("run_dir", run_dir)
    params.check_text("reference_dir", reference_dir)
    params.check_text("device", device)
    if profile != "auto":
        profiles.check(params.check_text("profile", profile))
    try:
        device = hardware.resolve_device(device)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    profile = profiles.resolve(profile, device != "cpu")
    run_path = Path(run_dir or LAB_RUN)
    existing = RunDir.open(run_path) if (run_path / "run.json").exists() else None   # a bad run.json named now
    reference_path = reference_run(reference_dir, table=None if reference_dir else "gemm", exclude=run_path.name)
    if reference_path is not None and Path(reference_path).resolve() == run_path.resolve():
        reference_path = None                # a reference run's own pages show no other reference
    reference = view(reference_path) if reference_path is not None else None
    recorded = view(existing) if existing is not None and "provenance" in existing.run_json() else None
    page = Page(title, smoke=not recorded.is_gpu if recorded else device == "cpu")
    collect_warnings(page)
    context = Context(run_path, reference, profile, device, page, opened=existing)
    measured_on = recorded.device if recorded and recorded.is_gpu and device == "cpu" else None
    shown_device = f"{device} (rendering only: the run was measured on {measured_on})" if measured_on else device
    context.parameters = [("run", run_path.name), ("run shown beside", reference.run_id if reference else NO_REFERENCE),
                          ("profile", profile), ("device", shown_device),
                          *((name, value) for name, value in knobs.items())]
    return context


def parameters_block(context: Context) -> None:
    """The page's parameters, once, as a small name/value table a reader may expand."""
    from fp4lab.plots.tables import key_values

    table = key_values([(name, _shown(value)) for name, value in context.parameters])
    context.page.html("parameters", f"<details><summary>Parameters of this page</summary>{table}</details>")


def resolve_parameters(context: Context, **resolved: Any) -> None:
    """Knobs left at None (the profile's) are listed with the value the profile gave them, so the
    page says what ran, not '(profile default)'."""
    context.parameters = [(name, f"{_shown(resolved[name])} (the {context.profile} profile's)")
                          if value is None and name in resolved else (name, value)
                          for name, value in context.parameters]


def annotate_parameters(context: Context, note: str, *names: str) -> None:
    """A note after the named knobs' values: a knob the page did not act on says so, and why."""
    context.parameters = [(name, f"{_shown(value)}; {note}") if name in names else (name, value)
                          for name, value in context.parameters]


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(item, (list, tuple)) and len(item) == 2 for item in value):
        return ", ".join(f"{n}x{k}" for n, k in value)                  # weight shapes [N, K]
    if isinstance(value, (list, tuple)):
        return ", ".join(_shown(item) for item in value) or "(all)"
    if value is None:
        return "(profile default)"
    return str(value)
