"""The dense kernel's anatomy variants: each stage switch runs (interpreter, CPU), each passes its
own check, and each check fails when the variant's output is wrong (a check that cannot fail
says nothing about what was timed)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from fp4lab import formats
from fp4lab.backends import triton_w4a16

REPO = os.path.join(os.path.dirname(__file__), "..")

ANATOMY_SCRIPT = r"""
import json, sys, torch
from fp4lab import formats
from fp4lab.backends import triton_w4a16
from fp4lab.backends.triton_w4a16 import TileConfig, anatomy_variants

triton_w4a16.sm_count = lambda device: 1     # a stream-K grid with fewer CTAs than steps
results = []
for fmt, config in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(3, 320, generator=gen).to(torch.bfloat16)
    w = formats.quantize(torch.randn(40, 320, generator=gen), fmt)
    for variant in anatomy_variants(a, w, "cpu", TileConfig(**config)):
        first = variant.check()
        again = variant.check()                      # split-K counters reset between calls
        call = variant.prepared.call
        variant.prepared.call = lambda call=call: call().add_(1)   # a variant gone wrong
        broken = variant.check()
        results.append({"fmt": fmt, "stage": variant.stage, "ok": [first.ok, again.ok],
                        "broken_ok": broken.ok, "message": first.message,
                        "dtype": str(variant.prepared.out.dtype),
                        "weight_bytes": variant.weight_bytes})
print(json.dumps(results))
"""

CONFIGS = [   # split-K with the swapped dot; the plain dot (and the other format); TMA loads;
              # the tiled layout (N 40 padded to 48 rows) by pointer and by TMA; stream-K (runs
              # that span two tiles: every stage's partials shared)
    ("nvfp4", {"block_m": 16, "block_n": 16, "block_k": 64, "split_k": 3, "swap_ab": True}),
    ("mxfp4", {"block_m": 16, "block_n": 32, "block_k": 64, "split_k": 2}),
    ("nvfp4", {"block_m": 16, "block_n": 16, "block_k": 256, "split_k": 2, "swap_ab": True,
               "loads": "tma"}),
    ("mxfp4", {"block_m": 16, "block_n": 16, "block_k": 64, "split_k": 3, "swap_ab": True,
               "layout": "tiles"}),
    ("nvfp4", {"block_m": 16, "block_n": 16, "block_k": 256, "split_k": 2, "swap_ab": True,
               "loads": "tma", "layout": "tiles"}),
    ("mxfp4", {"block_m": 16, "block_n": 16, "block_k": 64, "swap_ab": True, "stream_k": 4}),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CPU-only machines)")
def test_every_stage_passes_its_check_and_the_check_catches_a_wrong_output():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(REPO, "src")}
    run = subprocess.run([sys.executable, "-c", ANATOMY_SCRIPT, json.dumps(CONFIGS)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) == len(CONFIGS) * len(triton_w4a16.ANATOMY_STAGES)
    for result in results:
        assert result["ok"] == [True, True], result
        assert not result["broken_ok"], result
    dtypes = {r["stage"]: r["dtype"] for r in results}
    assert dtypes["load"] == "torch.int32" and dtypes["decode"] == "torch.float32"
    assert dtypes["full"] == dtypes["math"] == dtypes["decode_x2"] == "torch.bfloat16"
    fp4_bytes = {r["weight_bytes"] for r in results if r["stage"] != "math" and r["fmt"] == "nvfp4"}
    math_bytes = {r["weight_bytes"] for r in results if r["stage"] == "math"}
    assert fp4_bytes == {40 * 160 + 40 * 20} and math_bytes == {2 * 40 * 320}


def test_expected_checksum_wraps_like_int32():
    packed = torch.full((2, 4096), 255, dtype=torch.uint8)
    scales = torch.full((2, 512), 255, dtype=torch.uint8)
    a = torch.full((1, 8192), -1.0).to(torch.bfloat16)           # bits 0xBF80
    total = 255 * (4096 + 512) + 0xBF80 * 8192
    expected = (total + 2**31) % 2**32 - 2**31
    assert triton_w4a16.expected_checksum(a, packed, scales).tolist() == [[expected, expected]]


def test_unknown_stage_is_refused_by_name():
    w = formats.quantize(torch.randn(16, 64), "nvfp4")
    with pytest.raises(ValueError, match="anatomy stage 'mma'"):
        triton_w4a16.anatomy_variants(torch.randn(1, 64), w, "cpu", stages=("mma",))


def test_one_list_of_stages_from_the_kernels_to_the_figure():
    """Each dissected kernel's stages are the schema's (the sweep plans them from it), the schema's
    every stage has a label in the figure, and the sweep knows where each kernel's variants live."""
    from fp4lab import schema
    from fp4lab.backends import cuda_w4a16
    from fp4lab.plots.gemm import STAGE_LABELS
    from fp4lab.sweep.anatomy import KERNEL_MODULES

    assert schema.ANATOMY_KERNELS["triton-w4a16"] == tuple(triton_w4a16.ANATOMY_STAGES)
    assert set(schema.ANATOMY_KERNELS["cuda-w4a16"]) == set(cuda_w4a16.ANATOMY_STAGES)
    assert tuple(STAGE_LABELS) == schema.ANATOMY_STAGES
    assert set(schema.ANATOMY_STAGES) == {s for stages in schema.ANATOMY_KERNELS.values() for s in stages}
    assert set(KERNEL_MODULES) == set(schema.ANATOMY_KERNELS)
