"""`python -m fp4lab smem-fit` and `python -m fp4lab project`: questions about GPUs the run did not
measure, answered from spec sheets (fp4lab.tiles, fp4lab.analysis.projection, fp4lab.where).

    python -m fp4lab smem-fit --gpu rtx-pro-6000[,b200] [--kind moe] [--json]
    python -m fp4lab project --preset glm-5 --batch 512 --gpu b200,rtx-pro-6000,h200 [--json]
                             [--run RUN_DIR]
"""

from __future__ import annotations

import json

from fp4lab.errors import UsageError
from fp4lab.hardware import SPECS
from fp4lab.results import RunDir, RunFolderError


def parse_gpus(text: str) -> list:
    """"b200,rtx-pro-6000" -> [GpuSpec, ...]; an unknown name is a UsageError listing the keys."""
    names = [name.strip().lower() for name in str(text).split(",") if name.strip()]
    unknown = [name for name in names if name not in SPECS]
    if not names or unknown:
        raise UsageError(f"--gpu {text!r}: unknown GPU {', '.join(unknown) or '(none given)'}; "
                         f"valid: {', '.join(SPECS)}")
    return [SPECS[name] for name in names]


# -- smem-fit ---------------------------------------------------------------------------------------

def run_smem_fit(args) -> int:
    from fp4lab import tiles

    rows = tiles.fit_rows(parse_gpus(args.gpu))
    if args.kind != "all":
        rows = [row for row in rows if row["kind"] == args.kind]
    print(json.dumps(rows, indent=2) if args.json else tiles.format_rows(rows))
    return 0


# -- project ----------------------------------------------------------------------------------------

def measured_from_run(run_dir: str, batch: int, preset: str):
    """The run's fastest FP4-weight MoE layer at `batch`, as its diagnosis states it (chapter 04's
    number), with the run's GPU and measured launch floor, as a projection.Measured."""
    from fp4lab.analysis import decode, other_gpus

    try:
        run = RunDir.open(run_dir)
    except RunFolderError as exc:
        raise UsageError(f"--run {run_dir}: no readable run.json ({exc})") from None
    gpu = run.run_json().get("provenance", {}).get("device", {}).get("spec")
    if gpu not in SPECS:
        raise UsageError(f"--run {run_dir}: measured on {gpu or 'a device'} that is not on the spec "
                         f"sheet ({', '.join(SPECS)}): nothing to compare the projection with")
    if not run.has_table("moe"):
        raise UsageError(f"--run {run_dir}: has no moe table (no MoE rows measured)")
    d = decode.diagnose(run, decode.DiagnosisConfig(preset=preset, decode_batch=batch).check())
    found = other_gpus.measured(d)
    if found is None:
        methods = ", ".join(sorted(run.read_table("moe")["method"].unique()))
        raise UsageError(f"--run {run_dir}: no correct FP4 MoE layer of preset {preset} at batch "
                         f"{batch} (methods there: {methods})")
    return found


def run_project(args) -> int:
    from fp4lab import where
    from fp4lab.analysis import projection
    from fp4lab.moe import presets

    specs = parse_gpus(args.gpu)
    try:
        model = presets.get(args.preset)
    except ValueError as exc:
        raise UsageError(f"--preset: {exc}") from None
    measured = measured_from_run(args.run, args.batch, model.key) if args.run else None
    try:
        rows = projection.project(model, args.batch, specs, fmt=args.fmt, routing_spec=args.routing,
                                  steps=args.steps, seed=args.seed, measured=measured)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runs_where = where.where_rows(specs)
    if args.json:
        print(json.dumps({"label": projection.LABEL, "floors": rows, "runs_where": runs_where},
                         indent=2))
    else:
        print(projection.format_rows(rows) + "\n\n" + where.format_rows(runs_where))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise UsageError(f"expected a positive integer, got {text!r}")
    return value


def add_cli(subparsers) -> None:
    fit = subparsers.add_parser("smem-fit", help="which CUTLASS FP4 tiles fit each GPU's shared memory")
    fit.add_argument("--gpu", required=True, help=f"GPU key(s), comma-separated: {', '.join(SPECS)}")
    fit.add_argument("--kind", choices=("all", "gemm", "moe"), default="all",
                     help="the dense GEMM's tiles, the fused MoE's, or both (default)")
    fit.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    fit.set_defaults(func=run_smem_fit)

    project = subparsers.add_parser("project", help="a decode MoE layer's floors on other GPUs "
                                                    "(from spec sheets) and which backend runs where")
    project.add_argument("--preset", required=True, help="model preset, e.g. glm-5")
    project.add_argument("--batch", required=True, type=_positive_int, help="decode batch (tokens)")
    project.add_argument("--gpu", required=True, help=f"GPU key(s), comma-separated: {', '.join(SPECS)}")
    project.add_argument("--fmt", choices=("nvfp4", "mxfp4"), default="nvfp4", help="FP4 weight format")
    project.add_argument("--routing", default="uniform", help="uniform | zipf:S | trace:PATH")
    project.add_argument("--steps", type=_positive_int, default=64, help="routing steps averaged")
    project.add_argument("--seed", type=int, default=0)
    project.add_argument("--run", help="a run folder: its fastest FP4 MoE layer at this batch and its "
                                       "launch floor check the projection on the GPU it measured")
    project.add_argument("--json", action="store_true", help="print JSON instead of tables")
    project.set_defaults(func=run_project)
