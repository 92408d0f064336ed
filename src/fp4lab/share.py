"""`make share`: the diagnosis as one self-contained HTML file (images embedded, no network).

By default it shares the newest GPU run on record (local runs first, then the committed reference
runs), so a nightly share is a GPU's diagnosis; a smoke run is shared only when asked for by id or
when no GPU run exists, and then its header says so. The file names its run, device, date and
profile at the top and stands alone (it refers to no chapter it does not contain).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from fp4lab import params, profiles, text
from fp4lab.errors import ParameterError
from fp4lab.results import (MEASUREMENTS_ROOT, REFERENCE_ROOT, REPO_ROOT, RUNS_ROOT, RunDir, atomic_write,
                            find_run_dirs, is_gpu_run, latest_gpu_run)

SHARE_DIR = REPO_ROOT / "share"


def pick_run(run_id: str | None, runs_dir: str | os.PathLike) -> RunDir:
    """The run to share: `run_id` under runs_dir (or the committed roots), else the newest GPU
    run by creation time under runs_dir, else the newest committed reference GPU run, else the
    newest run of any kind under runs_dir. Never a folder outside those roots."""
    roots = [Path(runs_dir), REFERENCE_ROOT, MEASUREMENTS_ROOT]
    if run_id:
        params.check_name("run_id", run_id)
        for root in roots:
            if (root / run_id / "run.json").is_file():
                return RunDir.open(root / run_id)
        raise ParameterError(f"run_id={run_id!r}: no such run under {runs_dir} or the committed results")
    leading = latest_gpu_run(runs_dir) or latest_gpu_run(REFERENCE_ROOT)
    if leading is not None:
        return RunDir.open(leading)
    runs = find_run_dirs(runs_dir)
    if not runs:
        raise ParameterError(f"no run folders under {runs_dir}: run `make report` first")
    return RunDir.open(max(runs, key=lambda p: (RunDir(p).run_json().get("created") or "", p.name)))


def figure_png(fig) -> str:
    from fp4lab.chapters.page import png

    return base64.b64encode(png(fig)).decode()


def share_html(run: RunDir, profile: str = "full") -> str:
    from fp4lab.analysis import decode, gemm as gemm_analysis
    from fp4lab.chapters import ch04_diagnosis as words
    from fp4lab.chapters.ch01_gemm import seed_columns, seed_note
    from fp4lab.plots import diagnosis as figures
    from fp4lab.plots.tables import html_table

    d = decode.diagnose(run, decode.DiagnosisConfig.from_profile(profile))
    kind = "CPU smoke run: a check of the pipeline, not a measurement of a GPU" if d.smoke else "GPU run"
    header = (f"<h1>fp4lab diagnosis: {text.html(d.view.device)}</h1>"
              f"<p><b>Run</b> {text.html(run.run_id)} · <b>measured</b> {text.html(d.view.created)} · "
              f"<b>profile</b> {text.html(d.view.profile or 'unknown')} · <b>{text.html(kind)}</b></p>")
    body = [header, words.verdict_box(d)]
    if not d.smoke:
        sentences = [words.kernel_time_sentence(d), words.load_sentence(d), words.power_sentence(d),
                     words.fp4_sentence(d)]
        body.append("<ul>" + "".join(f"<li>{text.markdown_to_html(s)}</li>" for s in sentences if s) + "</ul>")
        if d.chosen is not None:
            png = figure_png(figures.layer_against_floors(d.chosen, d.fp4["floor_us"] if d.fp4 else None))
            body.append(f'<img alt="the diagnosed layer against its floors" style="max-width:100%" '
                        f'src="data:image/png;base64,{png}">')
        if len(d.levers):
            body.append("<h2>What would change it</h2>" + html_table(d.levers, words.LEVERS))
        if len(d.paths):
            body.append("<h2>Every path at decode</h2>" + html_table(d.paths, words.PATHS))
        if len(d.seed):
            dtype = gemm_analysis.seed_math_dtype(d.gemm, d.seed_backend)
            body.append(f"<h2>GEMM speed by M ({text.html(d.seed_backend)})</h2>"
                        + html_table(d.seed, seed_columns(dtype), caption=seed_note(dtype)))
    body.append(f'<p style="color:#555;font-size:0.8em">{text.html(d.view.caption("made by fp4lab share"))}</p>')
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>fp4lab diagnosis "
            f"{text.html(run.run_id)}</title></head><body style='font-family:sans-serif;max-width:60em;"
            f"margin:1em auto;padding:0 1em'>{''.join(body)}</body></html>")


def share(run_id: str | None = None, runs_dir: str | os.PathLike = RUNS_ROOT,
          out_dir: str | os.PathLike = SHARE_DIR) -> Path:
    """`share/<run-id>-diagnosis.html`."""
    run = pick_run(run_id, runs_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)         # before the work: a bad --out-dir costs nothing
    info = run.run_json()
    profile = (info.get("report") or {}).get("profile")
    if profile not in profiles.PROFILES:           # none recorded (a sweep's run), or not one of ours
        profile = "full" if is_gpu_run(info) else "smoke"
    target = out / f"{run.run_id}-diagnosis.html"
    page = share_html(run, profile)
    atomic_write(target, lambda file: file.write(page.encode()))
    return target


def remote_references(html: str) -> list[str]:
    """Remote resources the page would load by itself (scripts, styles, images): none is the goal."""
    import re

    return re.findall(r"<(?:script|img|iframe)[^>]*\bsrc=[\"'](https?://[^\"']+)", html, re.IGNORECASE) + \
        re.findall(r"<link[^>]*\bhref=[\"'](https?://[^\"']+)", html, re.IGNORECASE)
