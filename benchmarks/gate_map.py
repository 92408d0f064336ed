"""Where a `triton-w4a16` config that fails the gate is wrong: its error per output tile.

For each listed config at one point it runs the kernel `--calls` times (poisoned output each
time, as the gate does) and prints, per [BM tokens x BN weight rows] output tile whose error is
over the gate's tolerance, the tile's relative error and the least-squares weights (a, b) of
out ~ a * ref_first + b * ref_rest, where ref_first is the product over the first split's K range
and ref_rest over the others': (1, 1) is right, (1, 0) or (0, 1) a split that never arrived (a
reduction race), anything else a wrong tile. Called twice, a race shows as a map that changes.

    PYTHONPATH=src python3 benchmarks/gate_map.py --shape 6144x2048 --m 256 --fmt nvfp4 \\
        --configs "m256n128k128 s2 w8 st2 tma;m256n128k128 s2 w8 st2 pointer"
A config is "m<BM>n<BN>k<BK> s<split> w<warps> st<stages> <tma|pointer>" (swap_ab, ptx decode).
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

from fp4lab import correctness, formats
from fp4lab.backends import get
from fp4lab.backends.triton_w4a16 import TileConfig

CONFIG = re.compile(r"m(\d+)n(\d+)k(\d+) s(\d+) w(\d+) st(\d+) (tma|pointer)")


def parse_config(text: str) -> TileConfig:
    match = CONFIG.fullmatch(text.strip())
    if not match:
        raise SystemExit(f"config {text!r}: expected 'm<BM>n<BN>k<BK> s<split> w<warps> st<stages> "
                         "tma|pointer'")
    bm, bn, bk, split, warps, stages = (int(v) for v in match.groups()[:6])
    return TileConfig(bm, bn, bk, split_k=split, num_warps=warps, num_stages=stages, swap_ab=True,
                      loads=match.group(7))


def tile_map(out: torch.Tensor, first: torch.Tensor, rest: torch.Tensor, bm: int, bn: int,
             tolerance: float) -> list[str]:
    """One line per output tile over `tolerance`: its place, error and (a, b) fit."""
    lines = []
    m, n = out.shape
    for i in range(0, m, bm):
        for j in range(0, n, bn):
            o, f, r = (t[i:i + bm, j:j + bn].double().flatten() for t in (out, first, rest))
            ref = f + r
            err = (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item()
            if err > tolerance:
                basis = torch.stack([f, r], dim=1)                                   # [bm*bn, 2]
                a, b = torch.linalg.lstsq(basis, o.unsqueeze(1)).solution.flatten().tolist()
                lines.append(f"    tile tokens {i:>5}-{i + bm - 1:<5} rows {j:>6}-{j + bn - 1:<6} "
                             f"rel_err {err:.2e}  fit a={a:+.3f} b={b:+.3f}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="6144x2048", help="N x K")
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--fmt", default="nvfp4", choices=("nvfp4", "mxfp4"))
    parser.add_argument("--configs", required=True, help="configs separated by ';'")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    n, k = (int(v) for v in args.shape.lower().split("x"))
    torch.manual_seed(0)
    a = torch.randn(args.m, k, device=args.device).to(torch.bfloat16)
    w = formats.quantize(torch.randn(n, k, device=args.device) * k ** -0.5, args.fmt)
    tolerance = correctness.TOLERANCE[args.fmt]
    for text in args.configs.split(";"):
        config = parse_config(text)
        prepared = get("triton-w4a16").prepare(a, w, args.device, config=config)
        split_k = config.blocks_per_split(k) * config.block_k                # K of the first split
        ref_a, ref_w = prepared.ref_a.double(), prepared.ref_w.double()
        first = ref_a[:, :split_k] @ ref_w[:, :split_k].T                    # [M, N]
        rest = ref_a[:, split_k:] @ ref_w[:, split_k:].T
        print(f"{config.label()}  {n}x{k} M={args.m} {args.fmt}  splits {config.splits(k)}, "
              f"first split K {split_k}", flush=True)
        for call in range(args.calls):
            out = correctness.run_poisoned(prepared).float()
            bad = tile_map(out, first, rest, config.block_m, config.block_n, tolerance)
            whole = ((out.double() - first - rest).norm() / (first + rest).norm()).item()
            tiles = -(-args.m // config.block_m) * -(-n // config.block_n)
            print(f"  call {call}: rel_err {whole:.2e}, {len(bad)} of {tiles} tiles over tol", flush=True)
            for line in bad[:24]:
                print(line)
            if len(bad) > 24:
                print(f"    ... {len(bad) - 24} more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
