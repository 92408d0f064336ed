"""triton-w4a16: tile choice, scale encoding, and the kernel itself under Triton's CPU interpreter.

TRITON_INTERPRET=1 must be set before triton is imported, so the kernel runs in a child process
(the variable never reaches this one or the other tests). The interpreter tests run only on
machines without a GPU (the CPU CI, triton 3.9): on a GPU machine the compiled kernel is tested
directly by the `cuda` tests, and there the interpreter of triton 3.6 cannot run the kernel at
all (`tl.range` with tensor bounds fails with "only 0-dimensional arrays can be converted to
Python scalars"). The interpreter runs the plain-Triton decode ("bits"); the inline-PTX decode
("ptx") is checked against it byte for byte by the `cuda` tests.
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from fp4lab import formats
from fp4lab.backends import triton_w4a16
from fp4lab.backends.triton_w4a16 import TileConfig, choose_config, tensor_core_config

H200_SMS = 132
REPO = os.path.join(os.path.dirname(__file__), "..")

interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="interpreter test, CPU-only machines: with a GPU the `cuda` tests run the compiled "
           "kernel, and triton 3.6's interpreter cannot run tl.range with tensor bounds")

# Each case runs twice on the same Prepared: split-K leaves its tile counters at zero for the next
# call (as a CUDA-graph replay needs), so the second call must be right too.
INTERPRETER_SCRIPT = r"""
import json, sys, torch
from fp4lab import formats
from fp4lab.backends import get
from fp4lab.backends import triton_w4a16
from fp4lab.backends.triton_w4a16 import TileConfig

results = []
for case in json.loads(sys.argv[1]):
    # a stream-K grid is CTAs an SM times the SMs: a tiny shape's steps outnumber it only on a few
    triton_w4a16.sm_count = lambda device, sms=case["sm_count"]: sms
    gen = torch.Generator().manual_seed(case["seed"])
    a = torch.randn(case["m"], case["k"], generator=gen).to(torch.bfloat16)
    w = formats.quantize(torch.randn(case["n"], case["k"], generator=gen), case["fmt"])
    config = TileConfig(**case["config"]) if case["config"] else None
    prepared = get("triton-w4a16").prepare(a, w, "cpu", config=config)
    ref = prepared.ref_a.double() @ prepared.ref_w.double().T
    errors = []
    for _ in range(2):
        prepared.out.fill_(float("nan"))
        out = prepared.call()
        errors.append(((out.double() - ref).norm() / ref.norm()).item())
    results.append({
        "same_buffer": out.data_ptr() == prepared.out.data_ptr(),
        "finite": bool(torch.isfinite(out).all()), "shape": list(out.shape),
        "dtype": str(out.dtype), "rel_err": errors, "config": prepared.info["config"],
    })
print(json.dumps(results))
"""


def run_interpreted(script: str, payload) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(REPO, "src")}
    result = subprocess.run([sys.executable, "-c", script, json.dumps(payload)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def case(fmt, m, n, k, config=None, seed=0, sm_count=132):
    return {"fmt": fmt, "m": m, "n": n, "k": k, "seed": seed, "sm_count": sm_count,
            "config": None if config is None else dataclasses.asdict(config)}


# Every code path of the kernel at tiny shapes: M in decode and prefill ranges, N tails (odd),
# K tails shorter than BLOCK_K (EVEN_K off) and K a multiple of it, split-K with uneven splits
# (the last-CTA reduction) and with more splits requested than K has blocks, swapped and plain
# tensor-core dots, several M tiles, the default choice, and the CUDA-core gemv kernel (one
# activation row a program): K tails (EVEN_K off, K a multiple of 4 but not of BLOCK_K), split-K
# with uneven splits (one of a single K step under 3 tiles in flight), several rows, 1, 2 and 3
# tiles in flight; TMA loads (tensor descriptors) with the same tails, both dots, split-K, the
# scales by pointer (BK/S < 16 bytes) and by descriptor (BK 256 in nvfp4, 512 in both formats);
# and the tiled weight layout (N padded to whole tiles) on both load paths, both dots, split-K;
# stream-K on one SM's worth of CTAs (`sm_count` 1): runs that end inside a tile and runs that
# span two (the partials' slots and counters), a K tail, whole-tile runs (stored directly) with
# the plain dot and several M tiles, runs longer than a tile, and the tiled layout (stream-K
# refuses TMA loads: they raced on the GPU).
STREAM_CASES = [
    (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, swap_ab=True, stream_k=3)),
    (2, 33, 448, TileConfig(block_m=16, block_n=16, block_k=128, swap_ab=True, stream_k=5)),
    (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64, stream_k=6)),
    (1, 40, 256, TileConfig(block_m=16, block_n=16, block_k=64, swap_ab=True, stream_k=2)),
    (2, 33, 448, TileConfig(block_m=16, block_n=16, block_k=128, swap_ab=True, layout="tiles",
                            stream_k=5)),
]
INTERPRETER_CASES = [
    case(fmt, m, n, k, config, sm_count=1) for fmt in ("nvfp4", "mxfp4") for m, n, k, config in STREAM_CASES
] + [
    case(fmt, m, n, k, config)
    for fmt in ("nvfp4", "mxfp4")
    for m, n, k, config in [
        (1, 40, 96, None),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3, swap_ab=True)),
        (2, 33, 448, TileConfig(block_m=16, block_n=16, block_k=128, split_k=8, swap_ab=True)),
        (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64)),
        (17, 19, 96, TileConfig(block_m=32, block_n=16, block_k=64, swap_ab=True)),
        (1, 40, 256, TileConfig(block_m=1, block_n=16, block_k=64, math="gemv")),
        (3, 33, 352, TileConfig(block_m=1, block_n=16, block_k=128, math="gemv", split_k=2,
                                num_stages=2)),
        (2, 32, 448, TileConfig(block_m=1, block_n=32, block_k=64, math="gemv", split_k=8,
                                num_stages=1)),
        (1, 24, 320, TileConfig(block_m=1, block_n=16, block_k=64, math="gemv", split_k=3)),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3, swap_ab=True,
                                loads="tma")),
        (2, 33, 448, TileConfig(block_m=16, block_n=16, block_k=128, split_k=8, swap_ab=True,
                                loads="tma")),
        (37, 24, 640, TileConfig(block_m=16, block_n=16, block_k=256, loads="tma")),
        (1, 24, 1120, TileConfig(block_m=16, block_n=16, block_k=512, split_k=2, swap_ab=True,
                                 loads="tma")),
        (3, 40, 320, TileConfig(block_m=16, block_n=32, block_k=64, split_k=3, swap_ab=True,
                                layout="tiles")),
        (37, 24, 128, TileConfig(block_m=16, block_n=16, block_k=64, layout="tiles")),
        (2, 33, 448, TileConfig(block_m=16, block_n=16, block_k=128, split_k=8, swap_ab=True,
                                loads="tma", layout="tiles")),
        (1, 24, 1120, TileConfig(block_m=16, block_n=16, block_k=512, split_k=2, swap_ab=True,
                                 loads="tma", layout="tiles")),
    ]
]


@interpreter_only
def test_kernel_matches_the_reference_in_the_interpreter():
    results = run_interpreted(INTERPRETER_SCRIPT, INTERPRETER_CASES)
    for spec, result in zip(INTERPRETER_CASES, results):
        assert result["same_buffer"] and result["finite"], (spec, result)
        assert result["shape"] == [spec["m"], spec["n"]] and result["dtype"] == "torch.bfloat16"
        # the interpreter truncates float32 -> bf16 (the GPU rounds): ~2x the rounding error
        assert max(result["rel_err"]) < 5e-3, (spec, result)


def test_interpreter_does_not_leak_into_this_process():
    assert os.environ.get("TRITON_INTERPRET") != "1"


# --- the decode helpers, every code and scale byte -----------------------------------------------

# Written to a real file and run as a script: triton reads a @triton.jit function's source, which a
# `python -c` string does not have. Under TRITON_INTERPRET=1 it runs on the CPU (plain-Triton
# decode only), else on the GPU (both decodes, which must agree bit for bit).
DECODE_SCRIPT = r"""
import json, torch, triton, triton.language as tl
from fp4lab.backends import triton_w4a16_kernel as kernel

@triton.jit
def decode_all(bytes_ptr, scales_ptr, nv_ptr, mx_ptr, lo_ptr, hi_ptr, PTX: tl.constexpr):
    offs = tl.arange(0, 256)
    scale_bytes = tl.load(scales_ptr + offs)
    tl.store(nv_ptr + offs, kernel.decode_scales_bf16(scale_bytes, True).to(tl.float32))
    tl.store(mx_ptr + offs, kernel.decode_scales_bf16(scale_bytes, False).to(tl.float32))
    # every byte against one scale per nibble, times 2^SCALE_EXP: mxfp4 scale byte 127 is 2^0
    # for the low nibbles, 128 is 2^1 for the high ones (each half takes its own block's scale)
    scale_lo = kernel.decode_scales_bf16(tl.full((256,), 127, tl.uint8), False)
    scale_hi = kernel.decode_scales_bf16(tl.full((256,), 128, tl.uint8), False)
    packed = tl.load(bytes_ptr + offs)
    if PTX:
        lo, hi = kernel.decode_ptx(packed, scale_lo, scale_hi)
    else:
        lo, hi = kernel.decode_bits(packed, scale_lo, scale_hi)
    tl.store(lo_ptr + offs, lo.to(tl.float32))
    tl.store(hi_ptr + offs, hi.to(tl.float32))

device = "cpu" if kernel.INTERPRETED else "cuda"
every = torch.arange(256, dtype=torch.uint8, device=device)
results = {}
for ptx in ([False] if kernel.INTERPRETED else [False, True]):
    nv, mx, lo, hi = (torch.empty(256, device=device) for _ in range(4))
    decode_all[(1,)](every, every, nv, mx, lo, hi, PTX=ptx)
    results["ptx" if ptx else "bits"] = {
        "nvfp4": (nv.double() * 2.0**-kernel.SCALE_EXP).tolist(),
        "mxfp4": (mx.double() * 2.0**-kernel.SCALE_EXP).tolist(),
        "lo": (lo.double() * 2.0**kernel.WEIGHT_SHIFT).tolist(),
        "hi": (hi.double() * 2.0**kernel.WEIGHT_SHIFT).tolist()}
print(json.dumps(results))
"""


def run_decode_script(tmp_path, env: dict) -> dict:
    script = tmp_path / "decode_helpers.py"
    script.write_text(DECODE_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_decoded(decoded: dict) -> None:
    every = torch.arange(256, dtype=torch.uint8)
    e2m1 = formats.e2m1_decode(every & 15).double(), formats.e2m1_decode(every >> 4).double()
    # e5m3 bytes of every positive e4m3 value decode to that value (what nvfp4 scales go through)
    e4m3 = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn)     # 0x7f is NaN
    e5m3 = triton_w4a16.e4m3_to_e5m3(e4m3).long()
    positive = e4m3.float() > 0
    top = triton_w4a16.MXFP4_MAX_SCALE_BYTE
    low = triton_w4a16.MXFP4_MIN_SCALE_BYTE
    for decode, values in decoded.items():
        nv = torch.tensor(values["nvfp4"]).double()
        assert torch.equal(nv[e5m3[positive]], e4m3.double()[positive]), decode
        mx = torch.tensor(values["mxfp4"]).double()
        expected_mx = torch.pow(2.0, torch.arange(low, top + 1, dtype=torch.float64) - 127)
        assert torch.equal(mx[low:top + 1], expected_mx), decode
        assert values["lo"] == e2m1[0].tolist(), decode
        assert values["hi"] == (2 * e2m1[1]).tolist(), decode       # its scale is 2^1


@interpreter_only
def test_decode_helpers_match_the_formats_every_byte(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(REPO, "src")}
    check_decoded(run_decode_script(tmp_path, env))


@pytest.mark.cuda
def test_ptx_and_bits_decodes_match_the_formats_every_byte_on_the_gpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    decoded = run_decode_script(tmp_path, env)
    assert set(decoded) == {"bits", "ptx"}
    check_decoded(decoded)


def test_e5m3_encoding_is_exact_and_keeps_zero():
    e4m3 = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn)
    e5m3 = triton_w4a16.e4m3_to_e5m3(e4m3).long()
    exponent, mantissa = e5m3 >> 3, e5m3 & 7
    value = torch.pow(2.0, (exponent - triton_w4a16.E5M3_BIAS).double()) * (1 + mantissa / 8)
    value[e5m3 == 0] = 0.0
    assert torch.equal(value, e4m3.double())
    assert e5m3.max() < 256 and int(e5m3[0]) == 0


def test_mxfp4_scales_beyond_the_decode_range_are_refused():
    w = formats.quantize(torch.randn(16, 64), "mxfp4")
    w.scales[3, 1] = triton_w4a16.MXFP4_MAX_SCALE_BYTE + 1
    with pytest.raises(ValueError, match="mxfp4 block scales"):
        triton_w4a16.TritonW4A16().prepare(torch.randn(2, 64), w, "cpu")
    w.scales[3, 1] = triton_w4a16.MXFP4_MIN_SCALE_BYTE - 1
    with pytest.raises(ValueError, match="mxfp4 block scales"):
        triton_w4a16.TritonW4A16().prepare(torch.randn(2, 64), w, "cpu")


def test_an_all_zero_mxfp4_block_may_have_any_scale():
    x = torch.randn(16, 64)
    x[2, 32:] = 0.0                                   # one all-zero block: e8m0 byte 0
    w = formats.quantize(x, "mxfp4")
    assert int(w.scales[2, 1]) == 0
    triton_w4a16.check_scale_range(w)                 # no error


# --- tile choice (pure Python) -------------------------------------------------------------------

UNTUNED_SHAPE = (8192, 4096)  # not in SHAPE_PRESETS: choose_config falls back to TILE_PRESETS


def test_untuned_shape_is_not_in_the_shape_presets():
    assert UNTUNED_SHAPE not in triton_w4a16.SHAPE_PRESETS


@pytest.mark.parametrize("m,block_m", [(1, 16), (16, 16), (17, 32), (64, 64), (100, 64), (200, 128),
                                       (4096, 128)])
def test_tile_rows_follow_m(m, block_m):
    assert choose_config(m, *UNTUNED_SHAPE, H200_SMS).block_m == block_m


@pytest.mark.parametrize("n,k", [(6144, 2048), (4096, 6144), (8192, 8192), UNTUNED_SHAPE])
def test_decode_shapes_fill_the_gpu(n, k):
    config = choose_config(1, n, k, H200_SMS)
    assert config.ctas(1, n, k) >= H200_SMS, config
    assert config.blocks_per_split(k) >= triton_w4a16.MIN_K_BLOCKS_PER_SPLIT


def test_large_m_needs_no_split():
    assert choose_config(8192, *UNTUNED_SHAPE, H200_SMS).split_k == 1


def test_short_k_is_not_split():
    assert choose_config(1, 64, 128, H200_SMS).split_k == 1


@pytest.mark.parametrize("k,split,splits", [(1024, 4, 4), (1024, 3, 3), (1024, 5, 4),
                                            (320, 3, 3), (256, 8, 4), (96, 2, 2)])
def test_splits_cover_k_and_none_is_empty(k, split, splits):
    config = TileConfig(block_m=16, block_n=16, block_k=64, split_k=split)
    blocks = -(-k // 64)
    assert config.splits(k) == splits
    assert (splits - 1) * config.blocks_per_split(k) < blocks <= splits * config.blocks_per_split(k)


def test_presets_from_json_round_trip(monkeypatch):
    tuned = TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)
    large = TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8)
    rows = [{"n": 6144, "k": 2048, "m_max": 256, "config": dataclasses.asdict(large)},
            {"n": 6144, "k": 2048, "m_max": 16, "config": dataclasses.asdict(tuned)}]
    presets = triton_w4a16.presets_from_json(json.loads(json.dumps(rows)))
    assert presets == {(6144, 2048): ((16, tuned), (256, large))}
    monkeypatch.setattr(triton_w4a16, "SHAPE_PRESETS", presets)
    assert choose_config(1, 6144, 2048, H200_SMS) == tuned
    assert choose_config(17, 6144, 2048, H200_SMS) == large
    # past the largest measured M: the generic presets
    assert choose_config(4096, 6144, 2048, H200_SMS) == choose_config(4096, *UNTUNED_SHAPE)
    assert choose_config(1, *UNTUNED_SHAPE, H200_SMS) != tuned  # other shapes: generic presets


@pytest.mark.parametrize("field,value", [("block_m", 8), ("block_n", 48), ("block_k", 32),
                                         ("split_k", 0), ("split_k", 33), ("num_warps", 3),
                                         ("num_stages", 0), ("swap_ab", 1), ("math", "mma"),
                                         ("decode", "lut"), ("stream_k", -1), ("stream_k", 9),
                                         ("stream_k", True)])
def test_bad_tile_config_names_the_field(field, value):
    fields = {"block_m": 16, "block_n": 64, "block_k": 128, field: value}
    with pytest.raises(ValueError, match=f"TileConfig.{field}"):
        TileConfig(**fields)


@pytest.mark.parametrize("fields", [{"block_m": 16}, {"block_m": 1, "swap_ab": True}])
def test_gemv_math_runs_one_row_a_program(fields):
    assert TileConfig(block_m=1, block_n=64, block_k=256, math="gemv").block_m == 1
    with pytest.raises(ValueError, match="block_m must be 1 and swap_ab False"):
        TileConfig(**{"block_n": 64, "block_k": 128, "math": "gemv", **fields})


def test_tma_loads_need_the_tensor_core_kernel_and_a_known_name():
    with pytest.raises(ValueError, match="loads='tma'.*math='dot'"):
        TileConfig(block_m=1, block_n=16, block_k=64, math="gemv", loads="tma")
    with pytest.raises(ValueError, match="TileConfig.loads must be one of"):
        TileConfig(block_m=16, block_n=16, block_k=64, loads="bulk")
    assert TileConfig(block_m=16, block_n=16, block_k=64, loads="tma").label().endswith(" tma")


def test_stream_k_needs_the_tensor_core_kernel_unsplit_and_is_labelled():
    with pytest.raises(ValueError, match="stream_k.*math='dot' and split_k=1, got math='gemv'"):
        TileConfig(block_m=1, block_n=16, block_k=64, math="gemv", stream_k=2)
    with pytest.raises(ValueError, match="split_k=4"):
        TileConfig(block_m=16, block_n=16, block_k=64, split_k=4, stream_k=2)
    with pytest.raises(ValueError, match="stream_k with loads='tma' returned wrong results"):
        TileConfig(block_m=64, block_n=128, block_k=128, swap_ab=True, loads="tma", stream_k=3)
    config = TileConfig(block_m=64, block_n=128, block_k=128, swap_ab=True, stream_k=3)
    assert config.label().endswith(" ptx sk3")
    # 3 CTAs on each of 132 SMs: 4096 steps at 11 a CTA leave 373 with work
    assert config.ctas(64, 8192, 8192, 132) == 373
    assert config.ctas(64, 256, 256, 132) == 4                 # no more CTAs than steps


@pytest.mark.parametrize("tiles,k_blocks,programs", [(64, 64, 396), (48, 16, 396), (2, 5, 3), (3, 4, 2),
                                                     (6, 2, 6), (5, 7, 1), (4, 3, 100)])
def test_a_stream_k_plan_gives_every_step_to_one_program_and_counts_the_slots(tiles, k_blocks, programs):
    config = TileConfig(block_m=16, block_n=16, block_k=64, stream_k=1)       # one CTA an SM
    per_program, used, slots = config.stream_plan(16, 16 * tiles, 64 * k_blocks, sm_count=programs)
    steps = tiles * k_blocks
    assert used <= programs and (used - 1) * per_program < steps <= used * per_program   # none idle
    owners = [step // per_program for step in range(steps)]                              # [steps]
    meets = [len(set(owners[t * k_blocks:(t + 1) * k_blocks])) for t in range(tiles)]
    assert slots == max(meets)


def test_tiled_layout_needs_the_tensor_core_kernel_and_a_known_name():
    with pytest.raises(ValueError, match="layout='tiles'.*math='dot'"):
        TileConfig(block_m=1, block_n=16, block_k=64, math="gemv", layout="tiles")
    with pytest.raises(ValueError, match="TileConfig.layout must be one of"):
        TileConfig(block_m=16, block_n=16, block_k=64, layout="columns")
    assert TileConfig(block_m=16, block_n=16, block_k=64, loads="tma",
                      layout="tiles").label().endswith(" tma tiles")


@pytest.mark.parametrize("n,tile_rows,tile_cols,cols", [(5, 2, 4, 8), (16, 16, 8, 24), (1, 4, 2, 2)])
def test_tiled_layout_puts_each_tile_in_one_run_and_undoes_exactly(n, tile_rows, tile_cols, cols):
    rows = torch.randint(0, 256, (n, cols), dtype=torch.uint8)
    tiles = triton_w4a16.tiled_layout(rows, tile_rows, tile_cols)
    steps = cols // tile_cols
    assert tiles.shape == (-(-n // tile_rows) * steps * tile_rows, tile_cols)
    # tile (band 0, K step 1) is rows 0..BN of columns tc..2tc, as one contiguous run
    if steps > 1:
        first = tiles[tile_rows:2 * tile_rows]
        assert torch.equal(first[:min(n, tile_rows)], rows[:tile_rows, tile_cols:2 * tile_cols])
    assert int(tiles[:, :].long().sum()) == int(rows.long().sum())   # the padding is zeros
    assert torch.equal(triton_w4a16.untiled(tiles, n, tile_rows), rows)


@pytest.mark.parametrize("depth", [0, 4])
def test_gemv_keeps_one_to_three_tiles_in_flight(depth):
    with pytest.raises(ValueError, match=r"num_stages \(tiles in flight\) must be one of"):
        TileConfig(block_m=1, block_n=64, block_k=256, math="gemv", num_stages=depth)


GEMV = TileConfig(block_m=1, block_n=16, block_k=64, math="gemv")


def test_the_anatomy_runs_the_tensor_core_kernel_when_a_gemv_preset_wins(monkeypatch):
    gemv = TileConfig(block_m=1, block_n=64, block_k=256, split_k=4, math="gemv")
    monkeypatch.setitem(triton_w4a16.SHAPE_PRESETS, (4096, 4096), ((1, gemv),))
    assert choose_config(1, 4096, 4096, H200_SMS) == gemv
    config = triton_w4a16.tensor_core_config(1, 4096, 4096, H200_SMS)
    assert config.math == "dot" and config.swap_ab and config.ctas(1, 4096, 4096) >= H200_SMS
    # a tensor-core preset is used as it is
    assert (triton_w4a16.tensor_core_config(1, 8192, 8192, H200_SMS)
            == choose_config(1, 8192, 8192, H200_SMS))


def test_gemv_refuses_what_it_cannot_read_with_a_clear_error():
    from fp4lab.backends import triton_w4a16_kernel as kernel

    with pytest.raises(ValueError, match="K must be a multiple of 4, got 66"):
        kernel.Launch(m=1, n=16, k=66, fmt="nvfp4", config=GEMV, stage="full", device="cpu")
    with pytest.raises(ValueError, match="'load' runs on the tensor-core kernel"):
        kernel.Launch(m=1, n=16, k=64, fmt="nvfp4", config=GEMV, stage="load", device="cpu")
    launch = kernel.Launch(m=1, n=16, k=64, fmt="nvfp4", config=GEMV, stage="full", device="cpu")
    shifted = torch.zeros(1, 65, dtype=torch.bfloat16)[:, 1:]           # rows 2 bytes off
    with pytest.raises(ValueError, match="rows must start 8-byte aligned"):
        launch(shifted, None, None, None, None)


def test_tma_loads_refuse_a_misaligned_operand_with_a_clear_error():
    from fp4lab.backends import triton_w4a16_kernel as kernel

    config = TileConfig(block_m=16, block_n=16, block_k=64, loads="tma")
    launch = kernel.Launch(m=1, n=16, k=64, fmt="nvfp4", config=config, stage="full", device="cpu")
    shifted = torch.zeros(1, 65, dtype=torch.bfloat16)[:, 1:]           # rows 2 bytes off
    codes = torch.zeros(16, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="loads='tma' reads activations a .* 16-byte aligned"):
        launch(shifted, codes, torch.zeros(16, 4, dtype=torch.uint8), None, torch.empty(1, 16))


def test_backend_declares_weight_only_roofline_dtypes():
    backend = triton_w4a16.TritonW4A16()
    assert (backend.weight_dtype, backend.act_dtype, backend.math_dtype) == ("fp4", "bf16", "bf16")


def assert_right_twice(prepared, tolerance: float) -> None:
    """Two calls into a NaN-filled output, each within `tolerance` (relative error) of the
    float64 product: split-K and stream-K counters are back at zero after each call."""
    ref = prepared.ref_a.double() @ prepared.ref_w.double().T
    for _ in range(2):
        prepared.out.fill_(float("nan"))
        out = prepared.call()
        assert torch.isfinite(out).all()
        assert ((out.double() - ref).norm() / ref.norm()).item() < tolerance


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("decode", ["ptx", "bits"])
def test_gemv_kernel_on_the_gpu(fmt, m, decode):
    """The gemv kernel's inline PTX (bf16 products and chain sums) within the gate's reach."""
    from fp4lab.backends import get

    a = torch.randn(m, 2048 + 64, device="cuda").to(torch.bfloat16)         # K tail: EVEN_K off
    w = formats.quantize(torch.randn(6144 + 3, 2048 + 64, device="cuda"), fmt)
    config = TileConfig(block_m=1, block_n=64, block_k=256, split_k=2, math="gemv",
                        num_stages=1, decode=decode)
    assert_right_twice(get("triton-w4a16").prepare(a, w, "cuda", config=config), 6e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 100, 1024])
@pytest.mark.parametrize("decode", ["ptx", "bits"])
@pytest.mark.parametrize("loads,layout", [("pointer", "rows"), ("tma", "rows"),
                                          ("pointer", "tiles"), ("tma", "tiles")])
def test_kernel_on_the_gpu(fmt, m, decode, loads, layout):
    from fp4lab.backends import get

    a = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(6144 + 3, 2048, device="cuda"), fmt)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = dataclasses.replace(tensor_core_config(m, 6144 + 3, 2048, sms), decode=decode,
                                 loads=loads, layout=layout)
    assert_right_twice(get("triton-w4a16").prepare(a, w, "cuda", config=config), 4e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 64, 100])
@pytest.mark.parametrize("stream_k", [1, 3])
def test_stream_k_on_the_gpu(fmt, m, stream_k):
    """The persistent grid on the GPU's own SMs, a K of 47 blocks (no even share) and N with a
    tail, called twice: runs inside and across tiles, counters reset between calls."""
    from fp4lab.backends import get

    a = torch.randn(m, 47 * 128, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(4096 + 3, 47 * 128, device="cuda"), fmt)
    config = TileConfig(block_m=64, block_n=128, block_k=128, swap_ab=True, stream_k=stream_k)
    assert_right_twice(get("triton-w4a16").prepare(a, w, "cuda", config=config), 4e-3)


def shape_preset_cases():
    """Every tuned preset at the largest M it covers and at the least (the bound below + 1)."""
    for (n, k), entries in triton_w4a16.SHAPE_PRESETS.items():
        below = 0
        for m_max, config in entries:
            for m in sorted({below + 1, m_max}):
                yield pytest.param(n, k, m, config, id=f"{n}x{k}-M{m}-{config.label()}")
            below = m_max


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k,m,config", list(shape_preset_cases()))
def test_every_shape_preset_passes_the_gate_on_the_gpu(fmt, n, k, m, config):
    """The sweep gates the presets at the M it measures; here each at both ends of its M range
    (a partial row tile at the least), both formats, called twice (split-K counters reset)."""
    from fp4lab import correctness
    from fp4lab.backends import get

    assert choose_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count) \
        == config
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(n, k, device="cuda") * k ** -0.5, fmt)
    prepared = get("triton-w4a16").prepare(a, w, "cuda", config=config)
    for _ in range(2):
        gate = correctness.check_backend(prepared, correctness.TOLERANCE[fmt])   # poisons out
        assert gate.ok, gate.message
