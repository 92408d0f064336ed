"""`python -m fp4lab comm`: measure the communication of TP, EP and PP decode across local ranks.

Two modes, one command. Outside torchrun it is the launcher: it starts torchrun with
`--nproc-per-node N` ranks running this same command, waits (up to `--timeout`), and prints the
verdict. Under torchrun (RANK and WORLD_SIZE set) it is one rank of the run:
    python -m fp4lab comm --nproc-per-node 8                      # 8 GPUs (NCCL)
    python -m fp4lab comm --device cpu --nproc-per-node 2 --profile smoke
    torchrun --nproc-per-node 8 -m fp4lab comm                    # ranks launched by hand
"""

from __future__ import annotations

import os
import sys

from fp4lab.comm import ops
from fp4lab.comm.plan import CommPlan
from fp4lab.errors import UsageError

PROFILES = ("auto", "smoke", "full")
# --ops also takes "all_to_all" for both of its directions
OP_ALIASES = {"all_to_all": ops.ALL_TO_ALL_OPS}


def add_cli(subparsers) -> None:
    from fp4lab.results import RUNS_ROOT

    parser = subparsers.add_parser("comm", help="all-reduce / all-to-all / send-recv across ranks "
                                                "(torchrun; NCCL on GPUs, gloo on CPUs)")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="ranks to launch (default: the GPUs seen, 2 on a CPU)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--profile", default="auto", help="auto (full on a GPU, smoke on CPU) | "
                                                          "smoke | full")
    parser.add_argument("--preset", default=None, help="model preset for hidden / experts / top-k")
    parser.add_argument("--ops", default=None, help="comma list of " + ", ".join(
        (*ops.OPS, "all_to_all")))
    parser.add_argument("--tokens", default=None, help="comma list of token counts")
    parser.add_argument("--world-sizes", default=None,
                        help="group sizes to measure (default: powers of two up to the world)")
    parser.add_argument("--dtypes", default=None, help="all-to-all dtypes: bf16, fp8")
    parser.add_argument("--routing", default=None, help="comma list: uniform, zipf:S, trace:PATH")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=float, default=None, help="seconds of clock warm-up")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs: eager launches")
    parser.add_argument("--point-timeout", type=float, default=None,
                        help="seconds a point may take before the run stops (a stuck rank)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="launcher: seconds the whole run may take")
    # the runs folder every command writes to, wherever it is started (FP4LAB_RUNS_DIR honoured)
    parser.add_argument("--out", default=str(RUNS_ROOT),
                        help="runs folder (default: runs/ of the repository, or $FP4LAB_RUNS_DIR)")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--quiet", action="store_true", help="no line per point")
    parser.add_argument("--fault", default=None,
                        help="testing the fault handling: RANK:POINT:exit or RANK:POINT:hang")
    parser.set_defaults(func=_cli_comm)


def _int_list(text: str | None, argument: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{argument}: {text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise UsageError(f"{argument}: values must be integers >= 1, got {text!r}")
    return values


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(p.strip() for p in text.split(",") if p.strip())


def _ops(text: str | None) -> tuple[str, ...] | None:
    names = _names(text)
    if names is None:
        return None
    expanded = [op for name in names for op in OP_ALIASES.get(name, (name,))]
    unknown = [name for name in expanded if name not in ops.OPS]
    if unknown or not expanded:
        raise UsageError(f"--ops: unknown {', '.join(unknown) or 'empty list'}; choose from "
                         f"{', '.join((*ops.OPS, 'all_to_all'))}")
    return tuple(dict.fromkeys(expanded))


def resolve_profile(profile: str, device: str) -> str:
    if profile not in PROFILES:
        raise UsageError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if profile != "auto":
        return profile
    if device == "cpu":
        return "smoke"
    import torch

    return "full" if torch.cuda.is_available() else "smoke"


DEVICES = ("auto", "cpu", "cuda")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA GPU here")


def plan_from_args(args) -> CommPlan:
    """The plan the flags describe (profile first, then preset sizes, then each flag)."""
    check_device(args.device)
    profile = resolve_profile(args.profile, args.device)
    base = CommPlan.smoke() if profile == "smoke" else CommPlan.full()
    try:
        if args.preset:
            from fp4lab.moe import presets

            model = presets.get(args.preset)
            base = base.with_overrides(hidden=model.hidden, experts=model.experts,
                                       top_k=model.top_k, preset=model.key)
        return base.with_overrides(
            ops=_ops(args.ops), tokens=_int_list(args.tokens, "--tokens"),
            world_sizes=_int_list(args.world_sizes, "--world-sizes"),
            dtypes=_names(args.dtypes), routings=_names(args.routing), repeats=args.repeats,
            warmup_s=args.warmup, use_graph=False if args.eager else None,
            point_timeout_s=args.point_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def worker_args(args, run_id: str) -> list[str]:
    """The flags each rank gets: the user's, minus the launcher's, with the run folder fixed."""
    argv = ["--device", args.device, "--profile", args.profile, "--out", args.out,
            "--run-id", run_id]
    optional = {"--preset": args.preset, "--ops": args.ops, "--tokens": args.tokens,
                "--world-sizes": args.world_sizes, "--dtypes": args.dtypes,
                "--routing": args.routing, "--repeats": args.repeats, "--warmup": args.warmup,
                "--point-timeout": args.point_timeout, "--fault": args.fault}
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv + [flag for flag, on in (("--eager", args.eager), ("--quiet", args.quiet)) if on]


def default_nproc(device: str) -> int:
    if device == "cpu":
        return 2
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def under_torchrun(environ=os.environ) -> bool:
    return "RANK" in environ and "WORLD_SIZE" in environ


def _cli_comm(args) -> int:
    plan = plan_from_args(args)  # bad flags fail here, before any process starts
    fault = _fault(args.fault)
    if under_torchrun():
        from fp4lab.comm.runner import run_rank

        status = run_rank(plan, args.out, args.run_id, args.device, fault,
                          progress=not args.quiet, command=sys.argv)
        # A rank ends without interpreter teardown: gloo's worker threads can abort the process
        # there (SIGABRT, "terminate called without an active exception"; pytorch PR#179291),
        # after every row is written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    from fp4lab.comm.launch import launch
    from fp4lab.results import RunDir, new_run_id

    nproc = args.nproc_per_node or default_nproc(args.device)
    if nproc < 1:
        raise UsageError(f"--nproc-per-node must be >= 1, got {nproc}")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    try:
        plan.group_sizes(nproc)
    except ValueError as exc:
        raise UsageError(f"--world-sizes: {exc} (--nproc-per-node {nproc})") from None
    run_id = args.run_id or new_run_id(f"comm-{nproc}")
    try:
        run = RunDir.create(args.out, run_id=run_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if run.has_table("comm"):
        raise UsageError(f"--run-id {run_id}: {run.path} already holds comm rows; use a new one")
    run_path = run.path
    with run.lock("fp4lab comm"):               # the ranks inherit the right to write
        result = launch(nproc, worker_args(args, run_id), run_path, timeout_s=args.timeout)
    stream = sys.stdout if result.ok else sys.stderr
    print(f"fp4lab comm: {result.status}: {result.message}", file=stream)
    return 0 if result.ok else 1


def _fault(text: str | None):
    if text is None:
        return None
    from fp4lab.comm.faults import Fault

    try:
        return Fault.parse(text)
    except ValueError as exc:
        raise UsageError(f"--fault: {exc}") from None
