"""triton-w4a16: tile choice, and the kernel itself under Triton's CPU interpreter.

TRITON_INTERPRET=1 must be set before triton is imported, so the kernel runs in a child process
(the variable never reaches this one or the other tests). The interpreter tests run only on
machines without a GPU (the CPU CI, triton 3.9): on a GPU machine the compiled kernel is tested
directly by the `cuda` tests, and there the interpreter of triton 3.6 cannot run the kernel at
all (`tl.range` with tensor bounds fails with "only 0-dimensional arrays can be converted to
Python scalars").
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from fp4lab.formats import E2M1_VALUES
from fp4lab.backends import triton_w4a16
from fp4lab.backends.triton_w4a16 import TileConfig, choose_config

H200_SMS = 132

interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="interpreter test, CPU-only machines: with a GPU the `cuda` tests run the compiled "
           "kernel, and triton 3.6's interpreter cannot run tl.range with tensor bounds")

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
# K tails shorter than BLOCK_K, K a multiple of BLOCK_K (no K masks), split-K with uneven splits,
# grouped tile order with several M tiles; each of those with the swapped (out^T = W a^T) dot too
INTERPRETER_CASES = [
    case(fmt, m, n, k, config)
    for fmt in ("nvfp4", "mxfp4")
    for m, n, k, config in [
        (1, 40, 96, None),
        (2, 64, 512, None),
        (5, 33, 64, TileConfig(block_m=16, block_n=32, block_k=64)),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3)),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3, swap_ab=True)),
        (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64, group_m=2)),
        (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64, group_m=2, swap_ab=True)),
        (17, 19, 64, TileConfig(block_m=32, block_n=16, block_k=32)),
        (4, 48, 256, TileConfig(block_m=16, block_n=16, block_k=128, swap_ab=True)),
    ]
]


@interpreter_only
def test_kernel_matches_the_reference_in_the_interpreter():
    results = run_interpreted(INTERPRETER_CASES)
    for spec, result in zip(INTERPRETER_CASES, results):
        assert result["same_buffer"] and result["finite"], (spec, result)
        assert result["shape"] == [spec["m"], spec["n"]] and result["dtype"] == "torch.bfloat16"
        assert result["rel_err"] < 4e-3, (spec, result)


def test_interpreter_does_not_leak_into_this_process():
    assert os.environ.get("TRITON_INTERPRET") != "1"


# --- the decode helpers, every code and scale byte -----------------------------------------------

# Written to a real file and run as a script: triton reads a @triton.jit function's source, which a
# `python -c` string does not have. Under TRITON_INTERPRET=1 it runs on the CPU, else on the GPU.
DECODE_SCRIPT = r"""
import json, torch, triton, triton.language as tl
from fp4lab.backends import triton_w4a16_kernel as kernel

@triton.jit
def decode_all(codes_ptr, scales_ptr, values_ptr, nv_ptr, mx_ptr):
    offs = tl.arange(0, 256)
    tl.store(values_ptr + offs, kernel.decode_e2m1_times_2pow_minus14(tl.load(codes_ptr + offs)))
    scale_bytes = tl.load(scales_ptr + offs)
    tl.store(nv_ptr + offs, kernel.decode_scales_times_2pow14(scale_bytes, True))
    tl.store(mx_ptr + offs, kernel.decode_scales_times_2pow14(scale_bytes, False))

device = "cpu" if kernel.INTERPRETED else "cuda"
codes = torch.arange(256, dtype=torch.uint8, device=device) % 16
scales = torch.arange(256, dtype=torch.uint8, device=device)
values, nv, mx = (torch.empty(256, device=device) for _ in range(3))
decode_all[(1,)](codes, scales, values, nv, mx)
print(json.dumps({"values": (values[:16] * 2.0**14).tolist(),
                  "nvfp4": (nv / 2.0**14).tolist(), "mxfp4": (mx / 2.0**14).tolist()}))
"""


def run_decode_script(tmp_path, env: dict) -> dict:
    script = tmp_path / "decode_helpers.py"
    script.write_text(DECODE_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_decoded(decoded: dict) -> None:
    e2m1 = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
    assert decoded["values"] == e2m1
    scale_bytes = torch.arange(256, dtype=torch.uint8)
    # e4m3 scales are positive: the sign bit is ignored; 0x7f (NaN) is never written by formats
    positive = scale_bytes & 0x7F
    expected_nv = positive.view(torch.float8_e4m3fn).double()
    finite = positive != 0x7F
    assert torch.equal(torch.tensor(decoded["nvfp4"]).double()[finite], expected_nv[finite])
    # e8m0: 2^(e-127) for every e up to MAX_MXFP4_SCALE_BYTE (prepare refuses larger scales)
    top = triton_w4a16.MAX_MXFP4_SCALE_BYTE
    expected_mx = torch.pow(2.0, torch.arange(top + 1, dtype=torch.float64) - 127)
    assert torch.equal(torch.tensor(decoded["mxfp4"][:top + 1]).double(), expected_mx)


@interpreter_only
def test_decode_helpers_match_the_formats_every_byte(tmp_path):
    check_decoded(run_decode_script(tmp_path, {**os.environ, "TRITON_INTERPRET": "1"}))


@pytest.mark.cuda
def test_decode_helpers_match_the_formats_every_byte_on_the_gpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    check_decoded(run_decode_script(tmp_path, env))


def test_mxfp4_scales_beyond_the_decode_range_are_refused():
    from fp4lab import formats

    w = formats.quantize(torch.randn(16, 64), "mxfp4")
    w.scales[3, 1] = triton_w4a16.MAX_MXFP4_SCALE_BYTE + 1
    with pytest.raises(ValueError, match="mxfp4 block scale"):
        triton_w4a16.TritonW4A16().prepare(torch.randn(2, 64), w, "cpu")


# --- tile choice (pure Python) -------------------------------------------------------------------

UNTUNED_SHAPE = (8192, 4096)  # not in SHAPE_PRESETS: choose_config falls back to TILE_PRESETS


def test_untuned_shape_is_not_in_the_shape_presets():
    assert UNTUNED_SHAPE not in triton_w4a16.SHAPE_PRESETS


@pytest.mark.parametrize("m,block_m", [(1, 16), (16, 16), (17, 32), (64, 64), (200, 64),
                                       (4096, 128)])
def test_tile_rows_follow_m(m, block_m):
    assert choose_config(m, *UNTUNED_SHAPE, H200_SMS).block_m == block_m


# the tuned presets (and the generic ones with auto split-K) at decode size
@pytest.mark.parametrize("n,k", [(6144, 2048), (4096, 6144), (8192, 8192), UNTUNED_SHAPE])
def test_decode_shapes_fill_the_gpu(n, k):
    config = choose_config(1, n, k, H200_SMS)
    tiles = -(-n // config.block_n)
    ctas = tiles * -(-k // config.k_per_split(k))
    assert ctas >= H200_SMS, config
    assert config.k_per_split(k) >= 4 * config.block_k  # splits stay long enough to pay off
    assert config.k_per_split(k) % config.block_k == 0


def test_large_m_needs_no_split():
    assert choose_config(8192, *UNTUNED_SHAPE, H200_SMS).split_k == 1
    assert choose_config(8192, 8192, 8192, H200_SMS).split_k == 1


def test_shape_presets_cover_every_m_and_keep_decode_tiles_small():
    for shape, presets in triton_w4a16.SHAPE_PRESETS.items():
        bounds = [m_max for m_max, _ in presets]
        assert bounds[-1] is None, shape            # every M has a config
        assert bounds[:-1] == sorted(bounds[:-1]), shape
        assert choose_config(1, *shape, H200_SMS).block_m == 16, shape  # no rows wasted at decode


def test_short_k_is_not_split():
    assert choose_config(1, 64, 128, H200_SMS).split_k == 1


def test_tuned_shape_presets_are_used_exactly(monkeypatch):
    tuned = TileConfig(block_m=16, block_n=32, block_k=256, split_k=2, swap_ab=True)
    large = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8)
    monkeypatch.setitem(triton_w4a16.SHAPE_PRESETS, (6144, 2048), ((16, tuned), (None, large)))
    assert choose_config(1, 6144, 2048, H200_SMS) == tuned
    assert choose_config(16, 6144, 2048, H200_SMS) == tuned
    assert choose_config(4096, 6144, 2048, H200_SMS) == large
    assert choose_config(1, *UNTUNED_SHAPE, H200_SMS) != tuned  # other shapes: generic presets


@pytest.mark.parametrize("field,value", [("block_m", 8), ("block_n", 48), ("block_k", 16),
                                         ("split_k", 0), ("num_warps", 3), ("num_stages", 0),
                                         ("group_m", 0), ("swap_ab", 1)])
def test_bad_tile_config_names_the_field(field, value):
    fields = {"block_m": 16, "block_n": 64, "block_k": 128, field: value}
    with pytest.raises(ValueError, match=f"TileConfig.{field}"):
        TileConfig(**fields)


def test_backend_declares_weight_only_roofline_dtypes():
    backend = triton_w4a16.TritonW4A16()
    assert (backend.weight_dtype, backend.act_dtype, backend.math_dtype) == ("fp4", "bf16", "bf16")


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 100, 1024])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_kernel_on_the_gpu(fmt, m, swap_ab):
    from fp4lab import formats
    from fp4lab.backends import get

    a = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(6144 + 3, 2048, device="cuda"), fmt)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = dataclasses.replace(choose_config(m, 6144 + 3, 2048, sms), swap_ab=swap_ab)
    prepared = get("triton-w4a16").prepare(a, w, "cuda", config=config)
    prepared.out.fill_(float("nan"))
    out = prepared.call()
    ref = prepared.ref_a.double() @ prepared.ref_w.double().T
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 4e-3


# --- benchmarks/tune_w4a16.py: the grid, the paste-ready presets, one tiny run -------------------

TUNE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tune_w4a16.py")


def load_tune_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tune_w4a16", TUNE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("m", [1, 16, 64, 256, 4096])
def test_tune_grid_starts_with_the_pick_and_has_no_duplicates(m):
    tune = load_tune_script()
    grid = tune.candidates(tune.Point("nvfp4", 6144, 2048, m), H200_SMS)
    assert grid[0] == choose_config(m, 6144, 2048, H200_SMS)
    assert len(grid) == len(set(grid)) and 3 <= len(grid) <= 7
    if m <= 16:  # decode: no tile wastes rows on tokens that are not there
        assert {config.block_m for config in grid} == {16}
    if m >= 4096:  # prefill: every tile amortizes its decode over >= 128 rows
        assert min(config.block_m for config in grid) >= 128
    if grid[0].split_k > 1:  # what split-K buys is measured, not assumed
        assert dataclasses.replace(grid[0], split_k=1) in grid


def test_tune_snippet_pastes_back_as_shape_presets():
    tune = load_tune_script()
    small = TileConfig(block_m=16, block_n=64, block_k=128, split_k=3, swap_ab=True)
    large = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8)
    best = [{"fmt": "nvfp4", "n": 6144, "k": 2048, "m": m, "best": dataclasses.asdict(c)}
            for m, c in ((4096, large), (1, small))]
    best.append({"fmt": "mxfp4", "n": 6144, "k": 2048, "m": 1, "best": dataclasses.asdict(large)})
    namespace = {"TileConfig": TileConfig}
    exec(tune.shape_presets_snippet(best), namespace)
    assert namespace["SHAPE_PRESETS"] == {(6144, 2048): ((1, small), (None, large))}


@interpreter_only
def test_tune_script_gates_and_times_every_config_in_the_interpreter(tmp_path):
    out = tmp_path / "tune.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, TUNE_SCRIPT, "--device", "cpu", "--shapes", "40x64",
                             "--m", "3", "--mxfp4-points", "40x64:3", "--out", str(out)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["point"]["fmt"] for r in report["results"]] == ["nvfp4", "mxfp4"]
    for point in report["results"]:
        assert point["cublas"]["status"] == "ok"
        assert point["rows"] and all(r["status"] == "ok" and r["rel_err"] < 2e-2
                                     for r in point["rows"])
    assert all(b["best"] is not None for b in report["best"])
    assert "SHAPE_PRESETS" in report["shape_presets"] and "best config per point" in result.stdout
