#!/usr/bin/env python3
"""FlashInfer's FP4 bytes as golden files for fp4lab's formats (issue 14).

On the H200 (the lead runs it; needs only torch, numpy and the carried FlashInfer wheels):

    python3 benchmarks/h200_flashinfer_golden.py --out $OUT --wheels .whl/flashinfer
    # carry: [".whl/flashinfer"]  (stripped flashinfer-python 0.7.2.post1 + apache-tvm-ffi,
    #         cuda-tile, nccl4py wheels; benchmarks/pack_flashinfer.py made the first)

What it asks FlashInfer, on fixed seeded inputs (rows not a multiple of 128, K not a multiple of 64,
nvfp4 and mxfp4, linear and 128x4-swizzled scale layouts):
- `block_scale_interleave` (the 128x4 swizzle) of linear scale bytes: its host implementation
  and, on a GPU, its CUDA kernel;
- `e2m1_and_ufp8sf_scale_to_float` (its host decoder) of random packed bytes and scale bytes;
- `fp4_quantize` (nvfp4: sf_vec_size 16, e4m3 scales, the global encode scale 448*6/amax) and
  `mxfp4_quantize` (block 32, ue8m0 scales, which calls the same kernel) of bf16 inputs. Its kernel body is compiled for __CUDA_ARCH__ >= 1000 only
  (csrc/nv_internal/tensorrt_llm/kernels/quantization.cuh, quantize_with_block_size): on sm_90 it
  launches and writes nothing. So every result is first decoded by FlashInfer's own host decoder
  and kept as a golden only when it reproduces its input to FP4 accuracy; otherwise the case is
  recorded as rejected, with the measured error.
Writes $OUT/flashinfer_golden.npz (arrays named "<case>.<array>"; bf16 inputs as uint16 bits),
$OUT/flashinfer_golden.json (versions, device, every case with its status) and $OUT/log.txt; prints
a fixed-width summary last. The FlashInfer work runs in a child process under a time limit
(--budget-s, default 140 s in all), so the summary prints even when a step hangs or fails.
`--host-only` skips everything that needs a GPU (the interleave and decode goldens can be made on a
machine with nvcc and no GPU: set FLASHINFER_CUDA_ARCH_LIST=9.0a).
The committed copies live in tests/golden/flashinfer/ (tests/test_flashinfer_golden.py).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
import traceback

SEED = 14
# (rows, K): rows not a multiple of 128 and K not a multiple of 64 among them
QUANT_SHAPES = ((128, 128), (130, 160), (1, 64), (37, 96))
DECODE_SHAPES = ((128, 64), (130, 96), (1, 32), (37, 160))
INTERLEAVE_SHAPES = ((128, 4), (200, 10), (1, 1), (300, 3), (37, 34), (3, 130, 6))
FORMATS = {"nvfp4": {"sf_vec": 16, "ue8m0": False}, "mxfp4": {"sf_vec": 32, "ue8m0": True}}
DECODE_GLOBAL_SCALE = 0.125          # a power of two, so 1/x is exact for fp4lab's encode scale
GOLDEN_MAX_REL_ERR = 0.2             # FP4 round trips of gaussian data sit near 0.1
NPZ, META = "flashinfer_golden.npz", "flashinfer_golden.json"


def log(out_dir: str, text: str) -> None:
    print(text, flush=True)
    with open(os.path.join(out_dir, "log.txt"), "a") as handle:
        handle.write(text + "\n")


# -- parent: wheels, the child under a time limit, the summary -------------------------------------

def install_wheels(wheels: str, target: str, out_dir: str) -> str | None:
    """pip-install the carried wheels into `target` (no index, no deps); None or the error."""
    found = sorted(glob.glob(os.path.join(wheels, "*.whl")))
    if not found:
        return f"no wheels in {wheels}"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--no-cache-dir", "--upgrade", "--target", target, *found]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "pip install timed out after 60 s"
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["pip failed"])[-1]
    log(out_dir, f"installed {len(found)} wheels into {target}")
    return None


def summary(meta: dict, elapsed: float) -> str:
    lines = [f"{'section':<11} {'ok':>4} {'rejected':>8} {'failed':>6}  note", "-" * 60]
    for section in ("interleave", "decode", "quantize"):
        cases = [case for case in meta.get("cases", []) if case["kind"] == section]
        count = {status: sum(case["status"] == status for case in cases)
                 for status in ("ok", "rejected", "failed")}
        note = next((case.get("why", "") for case in cases if case["status"] != "ok"), "")
        lines.append(f"{section:<11} {count['ok']:>4} {count['rejected']:>8} {count['failed']:>6}  {note[:90]}")
    lines.append(f"device: {meta.get('device', '?')}; flashinfer {meta.get('flashinfer', '?')}; "
                 f"module build {meta.get('build_s', '-')} s; status {meta.get('status', '?')}; "
                 f"{elapsed:.0f} s in all")
    return "\n".join(lines)


def parent(args) -> int:
    started = time.time()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, FLASHINFER_WORKSPACE_BASE=args.workspace, PYTHONUNBUFFERED="1",
               MAX_JOBS=str(os.cpu_count() or 4))
    if args.wheels:
        error = install_wheels(args.wheels, args.site, args.out)
        if error:
            log(args.out, f"wheels: {error}")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.site, env.get("PYTHONPATH", "")) if p)
    child = [sys.executable, __file__, "--child", "--out", args.out] + (["--host-only"] if args.host_only else [])
    limit = max(10.0, args.budget_s - (time.time() - started))
    try:
        done = subprocess.run(child, env=env, timeout=limit, capture_output=True, text=True)
        status = "complete" if done.returncode == 0 else f"child exited {done.returncode}"
        tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    except subprocess.TimeoutExpired as exc:
        status = f"child stopped at the {limit:.0f} s limit"
        tail = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
                else (exc.stdout or "")).strip().splitlines()[-12:]
    for line in tail:
        log(args.out, f"child: {line}")
    meta_path = os.path.join(args.out, META)
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {"cases": []}
    if meta.get("status") != "complete" or status != "complete":   # the child's word and its exit agree
        meta["status"] = status if status != "complete" else f"child left status {meta.get('status')}"
    json.dump(meta, open(meta_path, "w"), indent=1)
    log(args.out, summary(meta, time.time() - started))
    return 0 if meta["status"] == "complete" else 1


# -- child: the FlashInfer calls --------------------------------------------------------------------

class Recorder:
    """Collects arrays and case records; saved after every section so a timeout keeps them."""

    def __init__(self, out_dir: str):
        self.out_dir, self.arrays, self.meta = out_dir, {}, {"cases": [], "status": "running"}

    def case(self, name: str, kind: str, info: dict, work) -> None:
        record = {"name": name, "kind": kind, **info}
        try:
            arrays, extra = work()
            record.update(extra)
            record.setdefault("status", "ok")
            if record["status"] == "ok":
                self.arrays.update({f"{name}.{key}": value for key, value in arrays.items()})
        except Exception as exc:  # noqa: BLE001 - one failing case is a row, never the whole run
            record.update(status="failed", why=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                          if str(exc) else type(exc).__name__)
            traceback.print_exc()
        self.meta["cases"].append(record)

    def save(self, status: str | None = None) -> None:
        import numpy as np

        if status:
            self.meta["status"] = status
        np.savez_compressed(os.path.join(self.out_dir, NPZ), **self.arrays)
        json.dump(self.meta, open(os.path.join(self.out_dir, META), "w"), indent=1)


def child(args) -> int:
    import numpy as np
    import torch

    recorder = Recorder(args.out)
    gpu = torch.cuda.is_available() and not args.host_only
    rng = np.random.default_rng(SEED)
    started = time.time()
    import flashinfer
    from flashinfer.quantization import fp4_quantization as fq

    cc = torch.cuda.get_device_capability() if gpu else None
    recorder.meta.update(
        flashinfer=flashinfer.__version__, torch=torch.__version__, import_s=round(time.time() - started, 1),
        device=torch.cuda.get_device_name() if gpu else "cpu (host paths only)",
        compute_capability=list(cc) if cc else None, seed=SEED)
    started = time.time()
    module = fq.get_fp4_quantization_module(f"{cc[0]}{cc[1]}" if cc else "90")
    recorder.meta["build_s"] = round(time.time() - started, 1)
    print(f"fp4 quantization module ready in {recorder.meta['build_s']} s", flush=True)

    for shape in INTERLEAVE_SHAPES:
        name = "interleave_" + "x".join(map(str, shape))

        def work(shape=shape):
            linear = torch.from_numpy(rng.integers(0, 256, size=shape, dtype=np.uint8))
            arrays = {"linear": linear.numpy(), "host": module.block_scale_interleave_sm100(linear).numpy()}
            if gpu:
                arrays["cuda"] = module.block_scale_interleave_sm100(linear.cuda()).cpu().numpy()
                if not np.array_equal(arrays["cuda"], arrays["host"]):
                    return arrays, {"status": "failed", "why": "CUDA kernel and host disagree"}
            return arrays, {}
        recorder.case(name, "interleave", {"shape": list(shape)}, work)
    recorder.save()

    for fmt, spec in FORMATS.items():
        for rows, k in DECODE_SHAPES:
            for swizzled in (False, True):
                name = f"decode_{fmt}_{rows}x{k}_{'swizzled' if swizzled else 'linear'}"

                def work(fmt=fmt, spec=spec, rows=rows, k=k, swizzled=swizzled):
                    packed = torch.from_numpy(rng.integers(0, 256, size=(rows, k // 2), dtype=np.uint8))
                    low, high = (1, 127) if fmt == "nvfp4" else (110, 145)   # finite e4m3 / modest e8m0
                    linear = torch.from_numpy(rng.integers(low, high, size=(rows, k // spec["sf_vec"]),
                                                           dtype=np.uint8))
                    scales = module.block_scale_interleave_sm100(linear) if swizzled else linear.reshape(-1)
                    gs = torch.tensor([DECODE_GLOBAL_SCALE], dtype=torch.float32)
                    values = module.e2m1_and_ufp8sf_scale_to_float_sm100(
                        packed, scales, gs, spec["sf_vec"], 0 if spec["ue8m0"] else 1, swizzled, False)
                    return ({"packed": packed.numpy(), "scales": scales.numpy(), "linear_scales": linear.numpy(),
                             "values": values.numpy()}, {})
                recorder.case(name, "decode", {"fmt": fmt, "rows": rows, "k": k, "swizzled": swizzled,
                                               "decode_global_scale": DECODE_GLOBAL_SCALE}, work)
    recorder.save()

    if gpu:
        quantize_cases(recorder, module, flashinfer, rng)
    else:
        recorder.meta["quantize_skipped"] = "no GPU (--host-only or none visible)"
    recorder.save("complete")
    return 0


def quantize_cases(recorder, module, flashinfer, rng) -> None:
    import numpy as np
    import torch

    inputs = [((rows, k), torch.from_numpy(rng.standard_normal((rows, k), dtype=np.float32)))
              for rows, k in QUANT_SHAPES]
    inputs.append(((64, 64), ties_input()))
    for (rows, k), x in inputs:
        x = x.to(torch.bfloat16)
        for fmt, spec in FORMATS.items():
            for swizzled in (False, True):
                name = f"quantize_{fmt}_{rows}x{k}_{'swizzled' if swizzled else 'linear'}"

                def work(x=x, fmt=fmt, spec=spec, swizzled=swizzled):
                    gs = None
                    if fmt == "nvfp4":
                        gs = torch.tensor([448.0 * 6.0], dtype=torch.float32) / x.float().abs().amax()
                    if fmt == "nvfp4":
                        packed, scales = flashinfer.fp4_quantize(
                            x.cuda(), gs.cuda(), spec["sf_vec"], spec["ue8m0"], swizzled,
                            nvfp4_4over6=None)
                    else:
                        layout = flashinfer.SfLayout.layout_128x4 if swizzled else flashinfer.SfLayout.layout_linear
                        packed, scales = flashinfer.mxfp4_quantize(x.cuda(), sfLayout=layout)
                    torch.cuda.synchronize()
                    packed = packed.view(torch.uint8).cpu().contiguous()
                    scales = scales.view(torch.uint8).cpu().contiguous()
                    decode_gs = (1.0 / gs) if gs is not None else torch.ones(1)
                    decoded = module.e2m1_and_ufp8sf_scale_to_float_sm100(
                        packed, scales.reshape(-1), decode_gs.float(), spec["sf_vec"],
                        0 if spec["ue8m0"] else 1, swizzled, False)
                    rel_err = float((decoded - x.float()).norm() / x.float().norm())
                    arrays = {"input_bf16_bits": x.view(torch.int16).numpy().view(np.uint16),
                              "packed": packed.numpy(), "scales": scales.numpy()}
                    extra = {"rel_err": rel_err, "global_scale": None if gs is None else float(gs)}
                    if not rel_err < GOLDEN_MAX_REL_ERR:
                        extra.update(status="rejected",
                                     why=f"FlashInfer's own decoder reads the result back at relative "
                                         f"error {rel_err:.3g}: the kernel wrote no FP4 data here "
                                         f"(its body needs __CUDA_ARCH__ >= 1000)")
                    return arrays, extra
                recorder.case(name, "quantize", {"fmt": fmt, "rows": rows, "k": k, "swizzled": swizzled},
                              work)
        recorder.save()


def ties_input():
    """[64, 64] float32 whose every 16-block holds its max 6 and exact e2m1 midpoints: with an
    encode scale of 448 (nvfp4) or a unit e8m0 scale (mxfp4) each value sits on a rounding tie."""
    import torch

    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    row = torch.cat([torch.tensor([6.0]), midpoints, -midpoints, torch.tensor([0.0])])   # 16 values
    return row.repeat(64, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--wheels", default="", help="folder of carried wheels (installed with --no-deps)")
    parser.add_argument("--site", default="/tmp/fi_site", help="where the wheels are installed")
    parser.add_argument("--workspace", default="/tmp/fi_workspace", help="FlashInfer's JIT cache base")
    parser.add_argument("--budget-s", type=float, default=140.0)
    parser.add_argument("--host-only", action="store_true", help="no GPU calls (interleave + decode)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
