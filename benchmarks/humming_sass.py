"""Which tensor-core instructions humming's kernels issue at decode points: wgmma (HGMMA, and how
many are waited for before the next) or mma.sync (HMMA), read from the SASS it JIT-compiled.

humming-w4a16 (the fastest peer at M = 64 in the reference run) compiles its kernels through nvcc
on a layer shape's first call into $HUMMING_CACHE_DIR. Each point runs in its own process with an
empty cache: humming-w4a16 is prepared, gated and called once there, then every file the cache
gained is read by cuobjdump, function by function. On a GPU (humming needs one):

    PYTHONPATH=src:/tmp/site python3 benchmarks/humming_sass.py --points nvfp4:8192x8192:64 --out DIR

Writes DIR/sass.jsonl (a row a point and kernel function) and prints one fixed-width line a row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_sass import HGMMA, cuobjdump, parse_points, waited_wgmma  # noqa: E402

HMMA = re.compile(r"\bHMMA\.")
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)


def run_point(fmt: str, n: int, k: int, m: int) -> str:
    """In this process: humming-w4a16 at the point, gated and called once; the gate's message."""
    import torch

    import tune_w4a16 as tune
    from fp4lab import correctness
    from fp4lab.backends import get

    point = tune.Point(fmt, n, k, m)
    a, w = tune.operands(point, "cuda", {})
    prepared = get("humming-w4a16").prepare(a, w, "cuda")
    gate = correctness.check_backend(prepared, correctness.TOLERANCE[fmt])
    prepared.call()
    torch.cuda.synchronize()
    return f"{gate.status}: {gate.message}"


def functions(sass: str) -> list[tuple[str, str]]:
    """(name, text) of each kernel function in a cuobjdump listing."""
    marks = list(FUNCTION.finditer(sass))
    return [(mark.group(1), sass[mark.end():marks[i + 1].start() if i + 1 < len(marks) else len(sass)])
            for i, mark in enumerate(marks)]


def read_cache(cache: Path) -> list[dict]:
    """A row per kernel function in every file of `cache` that cuobjdump can read."""
    rows = []
    for path in sorted(p for p in cache.rglob("*") if p.is_file()):
        listing = subprocess.run([cuobjdump(), "-sass", str(path)], capture_output=True, text=True)
        if listing.returncode != 0:
            continue
        for name, text in functions(listing.stdout):
            issued, waited = waited_wgmma(text)
            rows.append({"file": str(path.relative_to(cache)), "function": name, "hgmma": issued,
                         "hgmma_waited": waited, "hmma": len(HMMA.findall(text))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", required=True, help="fmt:NxK:M, comma-separated")
    parser.add_argument("--out", help="folder for sass.jsonl")
    parser.add_argument("--one", help=argparse.SUPPRESS)    # fmt:NxK:M: run it in this process
    args = parser.parse_args(argv)
    if args.one:
        print(run_point(*parse_points(args.one)[0]))
        return 0
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    print(f"{'point':<24} {'function':<60} {'HGMMA':>6} {'waited':>6} {'HMMA':>6}  gate")
    rows = []
    for fmt, n, k, m in parse_points(args.points):
        label = f"{fmt}:{n}x{k}:{m}"
        with tempfile.TemporaryDirectory() as cache:
            run = subprocess.run([sys.executable, __file__, "--points", label, "--one", label],
                                 env={**os.environ, "HUMMING_CACHE_DIR": cache},
                                 capture_output=True, text=True, timeout=600)
            gate = (run.stdout.strip().splitlines() or [run.stderr.strip()[-200:]])[-1]
            found = read_cache(Path(cache)) if run.returncode == 0 else []
        for row in found or [{"file": None, "function": None, "hgmma": 0, "hgmma_waited": 0, "hmma": 0}]:
            row = {"fmt": fmt, "n": n, "k": k, "m": m, **row, "gate": gate, "exit": run.returncode}
            rows.append(row)
            print(f"{label:<24} {str(row['function'])[:60]:<60} {row['hgmma']:>6} {row['hgmma_waited']:>6} "
                  f"{row['hmma']:>6}  {gate[:60]}", flush=True)
    if out:
        (out / "sass.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
