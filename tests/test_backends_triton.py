"""triton-w4a16: tile choice, and the kernel itself under Triton's CPU interpreter.

TRITON_INTERPRET=1 must be set before triton is imported, so the kernel runs in a child process
(the variable never reaches this one or the other tests).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from fp4lab.backends.triton_w4a16 import TileConfig, choose_config

H200_SMS = 132

INTERPRETER_SCRIPT = r"""
import json, sys, torch
from fp4lab import formats
from fp4lab.backends import get
from fp4lab.backends.triton_w4a16 import TileConfig

results = []
for case in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(case["seed"])
    a = torch.randn(case["m"], case["k"], generator=gen).to(torch.bfloat16)
    w = formats.quantize(torch.randn(case["n"], case["k"], generator=gen), case["fmt"])
    config = TileConfig(**case["config"]) if case["config"] else None
    prepared = get("triton-w4a16").prepare(a, w, "cpu", config=config)
    prepared.out.fill_(float("nan"))
    out = prepared.call()
    ref = prepared.ref_a.double() @ prepared.ref_w.double().T
    results.append({
        "same_buffer": out.data_ptr() == prepared.out.data_ptr(),
        "finite": bool(torch.isfinite(out).all()),
        "shape": list(out.shape), "dtype": str(out.dtype),
        "rel_err": ((out.double() - ref).norm() / ref.norm()).item(),
    })
print(json.dumps(results))
"""


def run_interpreted(cases: list[dict]) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT, json.dumps(cases)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def case(fmt, m, n, k, config=None, seed=0):
    return {"fmt": fmt, "m": m, "n": n, "k": k, "seed": seed,
            "config": None if config is None else config.__dict__}


# M in decode and prefill ranges, N tails that are not a multiple of the tile (and odd),
# K tails shorter than BLOCK_K, split-K with uneven splits, grouped tile order with several M tiles
INTERPRETER_CASES = [
    case(fmt, m, n, k, config)
    for fmt in ("nvfp4", "mxfp4")
    for m, n, k, config in [
        (1, 40, 96, None),
        (5, 33, 64, TileConfig(block_m=16, block_n=32, block_k=64)),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3)),
        (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64, group_m=2)),
        (17, 19, 64, TileConfig(block_m=32, block_n=16, block_k=32)),
    ]
]


def test_kernel_matches_the_reference_in_the_interpreter():
    results = run_interpreted(INTERPRETER_CASES)
    for spec, result in zip(INTERPRETER_CASES, results):
        assert result["same_buffer"] and result["finite"], (spec, result)
        assert result["shape"] == [spec["m"], spec["n"]] and result["dtype"] == "torch.bfloat16"
        assert result["rel_err"] < 4e-3, (spec, result)


def test_interpreter_does_not_leak_into_this_process():
    assert os.environ.get("TRITON_INTERPRET") != "1"


# --- tile choice (pure Python) -------------------------------------------------------------------

@pytest.mark.parametrize("m,block_m", [(1, 16), (16, 16), (17, 32), (64, 64), (200, 64),
                                       (4096, 128)])
def test_tile_rows_follow_m(m, block_m):
    assert choose_config(m, 8192, 8192, H200_SMS).block_m == block_m


@pytest.mark.parametrize("n,k", [(6144, 2048), (4096, 6144), (8192, 8192)])
def test_decode_shapes_fill_the_gpu(n, k):
    config = choose_config(1, n, k, H200_SMS)
    tiles = -(-n // config.block_n)
    ctas = tiles * -(-k // config.k_per_split(k))
    assert ctas >= H200_SMS, config
    assert config.k_per_split(k) >= 4 * config.block_k  # splits stay long enough to pay off
    assert config.k_per_split(k) % config.block_k == 0


def test_large_m_needs_no_split():
    assert choose_config(8192, 8192, 8192, H200_SMS).split_k == 1


def test_short_k_is_not_split():
    assert choose_config(1, 64, 128, H200_SMS).split_k == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 100, 1024])
def test_kernel_on_the_gpu(fmt, m):
    from fp4lab import formats
    from fp4lab.backends import get

    a = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(6144 + 3, 2048, device="cuda"), fmt)
    prepared = get("triton-w4a16").prepare(a, w, "cuda")
    prepared.out.fill_(float("nan"))
    out = prepared.call()
    ref = prepared.ref_a.double() @ prepared.ref_w.double().T
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 4e-3
