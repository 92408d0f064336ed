"""`python -m fp4lab moe-stats` (routing statistics as JSON) and `moe-sweep` (grouped GEMMs)."""

from __future__ import annotations

import json
import sys


def add_cli(subparsers) -> None:
    stats = subparsers.add_parser("moe-stats", help="tokens per expert under a routing model, as JSON")
    stats.add_argument("--experts", type=int, required=True, help="routed experts E")
    stats.add_argument("--top-k", type=int, required=True, help="experts per token k")
    stats.add_argument("--batch", type=int, required=True, help="tokens per decode step B")
    stats.add_argument("--routing", default="uniform", help="uniform | zipf:S | trace:PATH")
    stats.add_argument("--steps", type=int, default=200, help="decode steps to draw")
    stats.add_argument("--seed", type=int, default=0)
    stats.add_argument("--ep", type=int, nargs="+", default=[1], help="expert-parallel degrees")
    stats.set_defaults(func=_cli_stats)

    sweep = subparsers.add_parser("moe-sweep", help="measure loop / grouped / padded expert GEMMs")
    sweep.add_argument("--preset", default="glm-5")
    sweep.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    sweep.add_argument("--routing", default="uniform")
    sweep.add_argument("--ep", type=int, nargs="+", default=[1])
    sweep.add_argument("--steps", type=int, default=64, help="routing steps drawn to pick a typical one")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--methods", nargs="+", default=None, help="default: every method")
    sweep.add_argument("--device", default="auto")
    sweep.add_argument("--scaled", action="store_true", help="tiny stand-in preset (CPU smoke)")
    sweep.add_argument("--runs-dir", default="runs")
    sweep.add_argument("--run-id", default=None)
    sweep.set_defaults(func=_cli_sweep)


def _fail(exc: Exception) -> int:
    print(f"fp4lab: error: {exc}", file=sys.stderr)
    return 2


def _cli_stats(args) -> int:
    from fp4lab.moe import routing, stats

    try:
        loads = routing.expert_loads(args.routing, args.experts, args.top_k, args.batch,
                                     args.steps, args.seed)
        summary = stats.summarize(loads, args.ep)
    except ValueError as exc:
        return _fail(exc)
    summary.update({"batch": args.batch, "top_k": args.top_k, "routing": args.routing,
                    "seed": args.seed,
                    "closed_form_mean_tokens_per_expert": args.batch * args.top_k / args.experts})
    print(json.dumps(summary, indent=2))
    return 0


def _cli_sweep(args) -> int:
    from fp4lab.moe import grouped
    from fp4lab.results import RunDir

    try:
        config = grouped.SweepConfig(preset=args.preset, batch_sizes=tuple(args.batch),
                                     routing=args.routing, ep_degrees=tuple(args.ep),
                                     steps=args.steps, seed=args.seed, device=args.device,
                                     scaled=args.scaled,
                                     methods=tuple(args.methods) if args.methods else grouped.METHODS)
        config.validate()
        run = RunDir.create(args.runs_dir, run_id=args.run_id, label=config.preset)
    except ValueError as exc:
        return _fail(exc)
    rows = grouped.run_sweep(config, run)
    print(f"{len(rows)} rows -> {run.path / 'moe.parquet'}")
    return 0
