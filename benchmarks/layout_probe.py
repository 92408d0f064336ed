"""Does the order of the weight bytes change how fast a tiled kernel reads them? A probe of the
read alone (no decode, no math): each program of a [N/BN, K-chunks] grid reads STEPS tiles of
BN rows x BKW int32 words, as the tensor-core kernel's K loop does, and XORs them into one word,
from either layout of the same words:

  - "rows":  the [N, K] matrix as stored, so a tile is BN runs of 4*BKW bytes, a row apart;
  - "tiles": each tile's words contiguous (`triton_w4a16.tiled_layout`), one run per tile;

beside `stream_kernel` (the anatomy's "stream": contiguous runs, no tiles). Each variant's XORs
are checked exactly against numpy's, then timed with the package's timer (cold L2, CUDA graph).

    PYTHONPATH=src python3 benchmarks/layout_probe.py --out $OUT/layout

Writes measurements.jsonl (one row per variant) and prints one fixed-width line per variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_w4a16 as tune  # noqa: E402  (beside this script)

from fp4lab import bench  # noqa: E402
from fp4lab.backends import stream_kernel  # noqa: E402
from fp4lab.backends.triton_w4a16 import tiled_layout  # noqa: E402



@dataclass(frozen=True)
class Probe:
    """What one run reads (configuration as data: `H200` on the GPU, `SMOKE` on a CPU)."""

    shapes: tuple[tuple[int, int], ...]   # N x K weights, 0.5 B a weight: [N, K/8] int32 words
    tile_words: int                       # words a tile
    row_words: tuple[int, ...]            # words of one tile row
    steps: tuple[int, ...]                # tiles a program reads (its K chunk)


# 16 KB tiles (the decode preset's 128 x 256-weight tile) in 128 B .. 1 KB rows
H200 = Probe(shapes=((8192, 8192), (4096, 6144)), tile_words=4096, row_words=(32, 64, 128, 256),
             steps=(4, 8))
SMOKE = Probe(shapes=((32, 256),), tile_words=64, row_words=(8, 16), steps=(2,))


@triton.jit
def read_tiles(words_ptr, out_ptr, row_words, k_tiles, BN: tl.constexpr, BKW: tl.constexpr,
               STEPS: tl.constexpr, TILED: tl.constexpr):
    """out[n, c] = XOR of the STEPS tiles (BN x BKW words) of row band n, K chunk c."""
    band, chunk = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BN)[:, None]
    cols = tl.arange(0, BKW)[None, :]
    acc = tl.zeros((BN, BKW), dtype=tl.int32)
    for step in tl.static_range(STEPS):
        tile = chunk * STEPS + step
        if TILED:
            start = (band.to(tl.int64) * k_tiles + tile) * (BN * BKW)
            offs = start + rows * BKW + cols
        else:
            offs = (band.to(tl.int64) * BN + rows) * row_words + tile * BKW + cols
        acc ^= tl.load(words_ptr + offs)
    tl.store(out_ptr + band * tl.num_programs(1) + chunk, tl.xor_sum(tl.xor_sum(acc, 1), 0))


def expected(words: np.ndarray, bn: int, bkw: int, steps: int) -> np.ndarray:
    """[N/BN, chunks] XORs of each program's words, from the rows layout [N, W]."""
    n, w = words.shape
    blocks = words.reshape(n // bn, bn, w // (bkw * steps), bkw * steps)
    return np.bitwise_xor.reduce(blocks, axis=(1, 3))


def variant_rows(n: int, k: int, probe: Probe, timer, device: str):
    gen = torch.Generator().manual_seed(0)
    host = torch.randint(-2**31, 2**31 - 1, (n, k // 8), generator=gen, dtype=torch.int32)
    words = host.to(device)                                          # [N, W] int32, rows
    flat = stream_kernel.as_words(words)
    count = stream_kernel.programs(flat)
    out = torch.empty(count, dtype=torch.int32, device=device)
    stream_kernel.launch_read(flat, out)
    ok = torch.equal(out.cpu(), stream_kernel.expected_xor(flat.cpu(), count))
    yield {"layout": "stream", "bn": None, "bkw": None, "steps": None, "ok": ok,
           **_time(lambda args, out: lambda: stream_kernel.launch_read(args[0], out),
                   (flat,), out, timer, device)}
    for bkw in probe.row_words:
        bn = probe.tile_words // bkw
        for steps in probe.steps:
            k_tiles = (k // 8) // bkw
            if n % bn or k_tiles % steps:
                continue
            want = expected(host.numpy(), bn, bkw, steps)
            grid = (n // bn, k_tiles // steps)
            for layout in ("rows", "tiles"):
                src = words if layout == "rows" else tiled_layout(words, bn, bkw)
                out = torch.empty(grid, dtype=torch.int32, device=device)

                def make(args, out, bn=bn, bkw=bkw, steps=steps, tiled=layout == "tiles",
                         grid=grid, k_tiles=k_tiles):
                    return lambda: read_tiles[grid](args[0], out, k // 8, k_tiles, BN=bn,
                                                    BKW=bkw, STEPS=steps, TILED=tiled)
                make((src,), out)()
                ok = bool(np.array_equal(out.cpu().numpy(), want))
                yield {"layout": layout, "bn": bn, "bkw": bkw, "steps": steps, "ok": ok,
                       **(_time(make, (src,), out, timer, device) if ok else {})}


def _time(make, args, out, timer, device) -> dict:
    timing = bench.time_call(make, args, out, timer, device)
    nbytes = sum(a.numel() * a.element_size() for a in args)
    return {"median_us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us,
            "tbps": nbytes / timing.median_us / 1e6, "bytes": nbytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for measurements.jsonl")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny shape (the CPU test, under TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    device = tune.script_device("layout_probe", args.smoke)
    if device is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = SMOKE if args.smoke else H200
    timer = tune.device_timer()
    if args.smoke:
        timer = dataclasses.replace(timer, repeats=2, warmup_s=0.0)
    print(f"{'N x K':>10} {'layout':<7} {'BN':>4} {'row B':>6} {'steps':>5} {'us':>8} "
          f"{'TB/s':>5}  check")
    with open(out / "measurements.jsonl", "w") as log:
        for n, k in probe.shapes:
            for row in variant_rows(n, k, probe, timer, device):
                row = {"n": n, "k": k, **row}
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(f"{f'{n}x{k}':>10} {row['layout']:<7} {row['bn'] or '-':>4} "
                      f"{4 * row['bkw'] if row['bkw'] else '-':>6} {row['steps'] or '-':>5} "
                      f"{row.get('median_us', float('nan')):8.2f} "
                      f"{row.get('tbps', float('nan')):5.2f}  "
                      f"{'exact' if row['ok'] else 'WRONG'}", flush=True)
    return 0 if all(json.loads(line)["ok"] for line in open(out / "measurements.jsonl")) else 1


if __name__ == "__main__":
    sys.exit(main())
