"""`python -m fp4lab <command>`: the headless entry point.

Every command checks every flag before it starts work: a bad value is one line on stderr naming
the flag and the value, exit status 2, nothing written. Ctrl-C, SIGTERM and SIGHUP stop a sweep
cleanly (exit 130): measured rows are kept and the command says how to resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from fp4lab.errors import ParameterError, UsageError
from fp4lab.text import printable

GRID_FLAGS = ("backends", "format", "m", "shapes", "preset", "repeats", "max_burst_ms", "energy_window",
              "profile", "run_id", "eager", "point_timeout", "device", "gpus")
MAX_BURST_HELP = ("cut a point's timed burst to fewer replays where they would outlast this many ms "
                  "(a call at the power limit lowers the clock ~0.1 s into sustained load)")
EXTRA_COMMANDS = ("fp4lab.gpus_cli", "fp4lab.comm.cli")   # modules with an `add_cli(subparsers)` of their own


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, no traceback
        raise UsageError(message)


def _backends(sub) -> None:
    parser = sub.add_parser("backends", help="list the GEMM backends and whether they run here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.set_defaults(func=run_backends)


def run_backends(args) -> int:
    from fp4lab import backends, hardware

    try:
        hardware.resolve_device(args.device)
    except ValueError as exc:
        raise ParameterError(f"--device: {exc}") from None
    rows = backends.list_backends(args.device)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = f"{'backend':<20} {'formats':<12} {'weights':<8} {'available':<9}  reason"
    print(header + "\n" + "-" * len(header))
    for row in rows:
        note = f" [{row['note']}]" if row["note"] else ""
        print(f"{row['name']:<20} {','.join(row['formats']):<12} {row['weight_dtype']:<8} "
              f"{'yes' if row['available'] else 'no':<9}  {row['reason']}{note}")
    return 0


def _sweep(sub) -> None:
    parser = sub.add_parser("sweep", help="measure the FP4 GEMM grid into a run folder")
    parser.add_argument("--backends", help="comma list of backends (default: the profile's: every one)")
    parser.add_argument("--format", help="nvfp4, mxfp4 or both as a comma list")
    parser.add_argument("--m", help="comma list of M values (tokens), e.g. 1,16,256")
    parser.add_argument("--shapes", help="comma list of NxK weight shapes, e.g. 4096x6144,6144x2048")
    parser.add_argument("--preset", help="a model preset whose expert shapes are added (e.g. glm-5)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--gpus", help="one (this process, one device) or all (one torchrun rank per "
                                       "visible GPU; default: the profile's)")
    parser.add_argument("--repeats", type=int, help="timed samples per point")
    parser.add_argument("--max-burst-ms", type=float, help=MAX_BURST_HELP)
    parser.add_argument("--energy-window", type=float, help="seconds of NVML energy window per point (0: none)")
    parser.add_argument("--point-timeout", type=float, help="seconds before a point becomes a timeout row")
    parser.add_argument("--profile", default="auto", help="smoke, full or auto (full where a GPU is seen)")
    parser.add_argument("--out", help="the runs folder (default: runs/ of the repository)")
    parser.add_argument("--run-id", help="name of the run folder (default: time stamp + device)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue this run folder's stored grid")
    parser.add_argument("--retry-failed", action="store_true", help="re-measure error, oom and timeout rows")
    parser.add_argument("--eager", action="store_true", help="time eager launches instead of CUDA-graph replays")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-point lines")
    parser.set_defaults(func=run_sweep)


def _resume_conflicts(args, flags) -> None:
    given = [flag for flag in flags if getattr(args, flag, None) not in (None, False, "auto")]
    if args.resume and given:
        raise UsageError(f"--resume continues the stored grid: it takes no --{given[0].replace('_', '-')}")


def _timer_overrides(args) -> dict:
    """The timer settings given on the command line (the profile's fill the rest)."""
    from fp4lab import params

    timer = {}
    if args.repeats is not None:
        timer["repeats"] = params.check_int("--repeats", args.repeats)
    if args.max_burst_ms is not None:
        timer["max_burst_ms"] = params.check_float("--max-burst-ms", args.max_burst_ms, minimum=0,
                                                     strict_minimum=True)
    return timer


def run_sweep(args) -> int:
    from fp4lab import params
    from fp4lab.results import RUNS_ROOT, RunDir
    from fp4lab.sweep import GemmSweep
    from fp4lab.sweep.gemm import run_sweep as sweep

    _resume_conflicts(args, GRID_FLAGS + ("out",))
    _check_run_id(args.run_id)
    if args.resume:
        run = RunDir.open(args.resume)
        stored = (run.run_json().get("sweep") or {}).get("config")
        if not stored:
            raise ParameterError(f"--resume: {args.resume} has no stored sweep configuration")
        config = GemmSweep.from_dict(stored)
    else:
        timer = _timer_overrides(args)
        if args.eager:
            timer["use_graph"] = False
        config = GemmSweep.from_profile(
            params.check_text("--profile", args.profile), args.device, preset=args.preset,
            backends=_names("--backends", args.backends), fmts=_names("--format", args.format),
            m_values=params.parse_int_list("--m", args.m) if args.m is not None else None,
            shapes=params.parse_shapes("--shapes", args.shapes) if args.shapes is not None else None,
            energy_window_s=args.energy_window, point_timeout_s=args.point_timeout, gpus=args.gpus,
            timer=timer or None)
        out = params.check_text("--out", args.out, allow_empty=False) if args.out is not None else RUNS_ROOT
        run = RunDir.create(out, run_id=args.run_id, label=_label(config.device))
    return _measure(lambda: sweep(config, run, retry_failed=args.retry_failed, progress=not args.quiet,
                                  command=" ".join(sys.argv)), run, "gemm")


def _names(flag: str, text: str | None) -> tuple[str, ...] | None:
    """A comma list flag: None when not given (the profile's), never empty when given."""
    from fp4lab import params

    if text is None:
        return None
    names = params.parse_text_list(params.check_text(flag, text))
    if not names:
        raise params.fail(flag, text, "expected a comma list of names")
    return names


def _check_run_id(run_id: str | None) -> None:
    """A --run-id given (even empty) is checked, never silently replaced by a new one."""
    from fp4lab import params

    if run_id is not None:
        params.check_name("--run-id", run_id)


def _label(device: str) -> str:
    from fp4lab import hardware

    return hardware.detect(device).label


def _measure(work, run, table: str) -> int:
    """Run a sweep; Ctrl-C / SIGTERM / SIGHUP keep the rows and say how to go on."""
    from fp4lab.sweep.ranks import RanksFailed
    from fp4lab.sweep.runner import Interrupted

    started = time.monotonic()
    try:
        measured = work()
    except RanksFailed as exc:
        print(f"fp4lab: stopped: {printable(str(exc))}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        print(f"interrupted: measured points are kept; continue with --resume {run.path}", file=sys.stderr)
        return 130
    except OSError as exc:           # a full disk, a folder gone read-only: the log repairs itself
        print(f"fp4lab: stopped: {_os_error(exc)}; measured points are kept; continue with --resume "
              f"{run.path}", file=sys.stderr)
        return 1
    rows = run.read_table(table)
    held = [_held(rows, table)]
    stages = {"gemm": "anatomy", "moe": "moe_anatomy"}.get(table)   # the sweeps also time kernels' stages
    if stages and run.has_table(stages):
        held.append(_held(run.read_table(stages), stages))
    print(f"{measured} points measured in {time.monotonic() - started:.1f} s; the run holds "
          + " and ".join(held), file=sys.stderr)
    if table == "gemm" and len(rows):
        print(printable(_headline(run)), file=sys.stderr)      # names from the run's rows
    print(run.path)
    return 0


def _held(rows, table: str) -> str:
    """"22 gemm rows (2 ok, 20 unavailable)"."""
    counts = rows["status"].value_counts().to_dict() if len(rows) else {}
    return (f"{len(rows)} {table} rows"
            + (f" ({', '.join(f'{n} {status}' for status, n in sorted(counts.items()))})" if counts else ""))


def _headline(run) -> str:
    """gpt-fast's habit: one line that says what the sweep found."""
    from fp4lab import text
    from fp4lab.analysis import gemm

    results = gemm.gemm_results(run)
    numbers = gemm.headline(results)
    if "best" not in numbers:
        return "no correct point"
    small, best = numbers["smallest"], numbers["best"]
    return (f"headline: at M={small['m']} {small['backend']} reads {text.sig(small['tbps'])} TB/s of "
            f"{text.sig(results.bandwidth_tbps)} measured; best point {best['backend']} "
            f"{text.sig(best['tflops'], 4)} TFLOP/s at M={best['m']} {best['n']}x{best['k']}")


def _moe(sub) -> None:
    stats = sub.add_parser("moe-stats", help="tokens per expert under a routing model, as JSON")
    stats.add_argument("--experts", type=int, required=True, help="routed experts E")
    stats.add_argument("--top-k", type=int, required=True, help="experts per token k")
    stats.add_argument("--batch", type=int, required=True, help="tokens per decode step B")
    stats.add_argument("--routing", default="uniform", help="uniform | zipf:S | trace:PATH")
    stats.add_argument("--steps", type=int, default=200, help="decode steps to draw")
    stats.add_argument("--seed", type=int, default=0, help="random seed of the routing draw")
    stats.add_argument("--ep", type=int, nargs="+", default=[1], help="expert-parallel degrees")
    stats.set_defaults(func=run_moe_stats)

    sweep = sub.add_parser("moe-sweep", help="measure every MoE method at routed loads into a run folder")
    sweep.add_argument("--preset", help="model preset (default: the profile's, glm-5)")
    sweep.add_argument("--batch", type=int, nargs="+", help="decode batches B")
    sweep.add_argument("--routing", help="uniform | zipf:S | trace:PATH")
    sweep.add_argument("--ep", type=int, nargs="+", help="expert-parallel degrees")
    sweep.add_argument("--fmts", nargs="+", help="FP4 formats of the FP4 methods")
    sweep.add_argument("--methods", nargs="+", help="MoE methods (default: every registered one)")
    sweep.add_argument("--steps", type=int, help="routing steps drawn to pick a typical one")
    sweep.add_argument("--anatomy-batch", type=int, nargs="*",
                       help="batches at which fp4lab's fused MoE is dissected by build (default: the "
                            "profile's; none given: not dissected)")
    sweep.add_argument("--repeats", type=int, help="timed samples per point")
    sweep.add_argument("--max-burst-ms", type=float, help=MAX_BURST_HELP)
    sweep.add_argument("--point-timeout", type=float, help="seconds before a point becomes a timeout row")
    sweep.add_argument("--scaled", action="store_true", default=None, help="tiny stand-in preset (CPU smoke)")
    sweep.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    sweep.add_argument("--profile", default="auto", help="smoke, full or auto")
    sweep.add_argument("--runs-dir", help="the runs folder (default: runs/ of the repository)")
    sweep.add_argument("--run-id", help="name of the run folder; an existing one is resumed")
    sweep.add_argument("--retry-failed", action="store_true", help="re-measure error, oom and timeout rows")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar or per-point lines")
    sweep.set_defaults(func=run_moe_sweep)


def run_moe_stats(args) -> int:
    from fp4lab import params
    from fp4lab.moe import routing, stats

    for name in ("experts", "top_k", "batch", "steps"):
        params.check_int(f"--{name.replace('_', '-')}", getattr(args, name))
    params.check_int("--seed", args.seed, minimum=0)
    params.check_int_list("--ep", args.ep)
    try:
        loads = routing.expert_loads(args.routing, args.experts, args.top_k, args.batch, args.steps, args.seed)
        summary = stats.summarize(loads, args.ep)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    summary.update({"batch": args.batch, "top_k": args.top_k, "routing": args.routing, "seed": args.seed,
                    "closed_form_mean_tokens_per_expert": args.batch * args.top_k / args.experts})
    print(json.dumps(summary, indent=2))
    return 0


def run_moe_sweep(args) -> int:
    from fp4lab.results import RUNS_ROOT, RunDir
    from fp4lab.sweep import MoeSweep
    from fp4lab.sweep.moe import run_sweep as sweep

    _check_run_id(args.run_id)
    config = MoeSweep.from_profile(args.profile, args.device, preset=args.preset, batch_sizes=args.batch,
                                   routing=args.routing, ep_degrees=args.ep, fmts=args.fmts, methods=args.methods,
                                   steps=args.steps, anatomy_batches=args.anatomy_batch,
                                   point_timeout_s=args.point_timeout, scaled=args.scaled,
                                   timer=_timer_overrides(args) or None)
    run = RunDir.create(args.runs_dir or RUNS_ROOT, run_id=args.run_id, label=f"moe-{config.preset}")
    return _measure(lambda: sweep(config, run, retry_failed=args.retry_failed, progress=not args.quiet,
                                  command=" ".join(sys.argv)), run, "moe")


def _report(sub) -> None:
    parser = sub.add_parser("report", help="run every chapter into a run folder, build the book")
    parser.add_argument("--profile", default="auto", help="smoke, full or auto (full where a GPU is seen)")
    parser.add_argument("--run-id", help="name of the run folder (default: time stamp + device)")
    parser.add_argument("--runs-dir", help="the runs folder (default: runs/ of the repository)")
    parser.add_argument("--reference-dir", help="the run shown beside (default: newest under results/reference; none: none)")
    parser.add_argument("--notebooks", nargs="*", help="only these notebooks (default: notebooks/NN_*.ipynb); with an existing --run-id "
                        "the run's other chapters keep their earlier renders")
    parser.add_argument("--no-build", action="store_true", help="run the chapters, skip the book")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_report)


def run_report(args) -> int:
    from pathlib import Path

    from fp4lab import hardware, profiles, report
    from fp4lab.results import RUNS_ROOT
    from fp4lab.sweep.runner import signals_as_interrupt

    if args.profile != "auto":
        profiles.check(args.profile)
    try:
        hardware.resolve_device(args.device)
    except ValueError as exc:
        raise ParameterError(f"--device: {exc}") from None
    _check_run_id(args.run_id)
    notebooks = None
    if args.notebooks:
        notebooks = [Path(p) for p in args.notebooks]
        missing = [str(p) for p in notebooks if not p.is_file()]
        if missing:
            raise ParameterError(f"--notebooks: not found: {', '.join(missing)}")
    with signals_as_interrupt():          # SIGTERM/SIGHUP: the kernel is shut down, as on Ctrl-C
        result = report.run_report(args.profile, args.run_id, args.runs_dir or RUNS_ROOT, notebooks,
                                   build=not args.no_build, reference_dir=args.reference_dir,
                                   device=args.device, progress=not args.quiet)
    return result.exit_code


def _share(sub) -> None:
    parser = sub.add_parser("share", help="one self-contained HTML file of the diagnosis")
    parser.add_argument("--run-id", help="the run to share (default: the newest GPU run on record)")
    parser.add_argument("--runs-dir", help="the runs folder (default: runs/ of the repository)")
    parser.add_argument("--out-dir", help="where the file goes (default: share/)")
    parser.set_defaults(func=run_share)


def run_share(args) -> int:
    from fp4lab import share
    from fp4lab.results import RUNS_ROOT

    target = share.share(args.run_id, args.runs_dir or RUNS_ROOT, args.out_dir or share.SHARE_DIR)
    print(f"shared diagnosis: {target}")
    return 0


def _runs(sub) -> None:
    parser = sub.add_parser("runs", help="list run folders (local and committed)")
    parser.add_argument("roots", nargs="*", help="folders holding run folders (default: runs/ and results/)")
    parser.set_defaults(func=run_runs)


def run_runs(args) -> int:
    from pathlib import Path

    from fp4lab import params
    from fp4lab.results import MEASUREMENTS_ROOT, REFERENCE_ROOT, RUNS_ROOT, list_runs

    for root in args.roots:
        if not Path(params.check_text("roots", root)).is_dir():
            raise ParameterError(f"roots: {params.shown(root)} is not a folder")
    roots = args.roots or [RUNS_ROOT, REFERENCE_ROOT, MEASUREMENTS_ROOT]
    frame = list_runs(*roots).drop(columns=["path", "root"])
    shown = frame.map(lambda value: value if value is None else printable(" ".join(str(value).split())))
    print(shown.to_string(index=False) if len(frame) else "no runs under " + ", ".join(map(str, roots)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="python -m fp4lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_backends, _sweep, _moe, _report, _share, _runs):
        add(sub)
    for name in EXTRA_COMMANDS:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("fp4lab: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except (UsageError, ParameterError, FileNotFoundError) as exc:
        print(f"fp4lab: error: {printable(' '.join(str(exc).split())[:500])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fp4lab: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:           # permission denied, a full disk: the file and the reason
        print(f"fp4lab: error: {_os_error(exc)}", file=sys.stderr)
        return 1


class _PrintableFormatter(logging.Formatter):
    """Log lines name files and runs: their control characters are shown, never sent."""

    def format(self, record) -> str:
        return printable(super().format(record))


def _os_error(exc: OSError) -> str:
    where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name)
    message = f"{where}: {exc.strerror or exc}" if where else str(exc.strerror or exc)
    return printable(" ".join(message.split())[:500])
