"""fp4lab's FP4 bytes against FlashInfer's (goldens made by benchmarks/h200_flashinfer_golden.py,
committed in tests/golden/flashinfer/), and torch's fp8 / fp4 dtype views of the same bytes.

- interleave: fp4lab.swizzle_scales of linear scale bytes == FlashInfer's block_scale_interleave
  (its host code, and its CUDA kernel where the goldens were made on a GPU), byte for byte;
- decode: fp4lab.dequantize of random packed bytes and scales (linear, or swizzled and read back
  through fp4lab.unswizzle_scales) == FlashInfer's host decoder, bit for bit;
- quantize (goldens made where FlashInfer's quantize kernel runs, sm_100+): fp4lab's nvfp4 bytes
  equal FlashInfer's except rounding near-ties, each one named; fp4lab's mxfp4 (OCP MX v1.0 scale,
  floor(log2 amax) - 2) differs from FlashInfer's (ceil(log2(amax / 6))) exactly in the blocks whose
  amax mantissa exceeds 1.5, where FlashInfer's scale is one power of two larger.
Goldens are only ever produced by FlashInfer; none is hand-written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fp4lab import formats
from fp4lab.formats import QuantizedTensor

GOLDEN_DIR = Path(__file__).resolve().parent / "golden" / "flashinfer"
NEAR_TIE = 2e-6          # relative distance to a rounding midpoint that float32 fast math can flip


def golden_sets() -> list[tuple[dict, dict]]:
    sets = []
    for meta_path in sorted(GOLDEN_DIR.glob("*.json")):
        arrays_path = meta_path.with_suffix(".npz")
        if arrays_path.is_file():
            with np.load(arrays_path) as arrays:
                sets.append((json.loads(meta_path.read_text()), dict(arrays)))
    return sets


GOLDENS = golden_sets()
NO_GOLDENS = (f"no FlashInfer goldens in {GOLDEN_DIR.relative_to(GOLDEN_DIR.parents[2])}: run "
              "benchmarks/h200_flashinfer_golden.py on a GPU box and commit its .npz and .json there")


def cases(kind: str) -> list[tuple[dict, dict]]:
    found = [(case, {key.split(".", 1)[1]: value for key, value in arrays.items()
                     if key.split(".", 1)[0] == case["name"]})
             for meta, arrays in GOLDENS for case in meta["cases"]
             if case["kind"] == kind and case["status"] == "ok"]
    return found


def ids(found):
    return [case["name"] for case, _ in found]


def skip_when_missing(found, kind):
    if not GOLDENS:
        pytest.skip(NO_GOLDENS)
    if not found:
        made_on = ", ".join(meta.get("device", "?") for meta, _ in GOLDENS)
        pytest.skip(f"the goldens here ({made_on}) hold no {kind} cases: FlashInfer's quantize kernel "
                    f"runs only on sm_100+ (on sm_90 it writes nothing)")


INTERLEAVE, DECODE, QUANTIZE = cases("interleave"), cases("decode"), cases("quantize")


def test_goldens_are_flashinfers_and_say_where_they_were_made():
    if not GOLDENS:
        pytest.skip(NO_GOLDENS)
    for meta, _ in GOLDENS:
        assert meta["flashinfer"] and meta["device"] and meta["status"] == "complete"
        assert not [case["name"] for case in meta["cases"] if case["status"] == "failed"]


@pytest.mark.parametrize("case, arrays", INTERLEAVE or [({}, {})], ids=ids(INTERLEAVE) or ["none"])
def test_swizzle_scales_is_flashinfers_128x4_layout(case, arrays):
    skip_when_missing(INTERLEAVE, "interleave")
    linear = torch.from_numpy(arrays["linear"])
    ours = formats.swizzle_scales(linear).reshape(-1).numpy()
    for source in ("host", "cuda"):
        if source in arrays:
            np.testing.assert_array_equal(ours, arrays[source], err_msg=f"{case['name']} vs {source}")
    rows, cols = linear.shape[-2:]
    back = formats.unswizzle_scales(torch.from_numpy(arrays["host"]), rows, cols)
    np.testing.assert_array_equal(back.reshape(linear.shape).numpy(), arrays["linear"])


@pytest.mark.parametrize("case, arrays", DECODE or [({}, {})], ids=ids(DECODE) or ["none"])
def test_dequantize_reads_bytes_as_flashinfer_does(case, arrays):
    skip_when_missing(DECODE, "decode")
    rows, k, fmt = case["rows"], case["k"], case["fmt"]
    cols = k // formats.BLOCK_SIZE[fmt]
    scales = torch.from_numpy(arrays["scales"])
    if case["swizzled"]:
        scales = formats.unswizzle_scales(scales, rows, cols)
    scales = scales.reshape(rows, cols)
    np.testing.assert_array_equal(scales.numpy(), arrays["linear_scales"])
    if fmt == "nvfp4":
        scales = scales.view(torch.float8_e4m3fn)
        # FlashInfer multiplies by a decode scale; fp4lab keeps the encode scale (its inverse)
        global_scale = torch.tensor(1.0 / case["decode_global_scale"], dtype=torch.float32)
    else:
        global_scale = None
    q = QuantizedTensor(packed=torch.from_numpy(arrays["packed"]), scales=scales,
                        global_scale=global_scale, fmt=fmt, shape=(rows, k))
    ours = formats.dequantize(q).numpy()
    theirs = arrays["values"]
    differs = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert differs.size == 0, (f"{case['name']}: {differs.size} values differ, first at flat index "
                               f"{differs[0]}: fp4lab {ours.flat[differs[0]]}, FlashInfer {theirs.flat[differs[0]]}")


# -- quantize goldens (made on sm_100+) ------------------------------------------------------------

def bf16_input(arrays) -> torch.Tensor:
    return torch.from_numpy(arrays["input_bf16_bits"].view(np.int16)).view(torch.bfloat16)


def linear_scales(case, arrays, cols: int) -> np.ndarray:
    scales = torch.from_numpy(arrays["scales"].reshape(-1))
    if case["swizzled"]:
        return formats.unswizzle_scales(scales, case["rows"], cols).numpy()
    return scales.reshape(case["rows"], cols).numpy()


def e2m1_midpoint_between(code_a, code_b) -> np.ndarray:
    """The rounding midpoint between two neighbouring e2m1 magnitude codes (NaN if not neighbours)."""
    values = np.asarray(formats.E2M1_VALUES)
    low, high = np.minimum(code_a, code_b) & 7, np.maximum(code_a, code_b) & 7
    return np.where(high - low == 1, (values[low] + values[np.minimum(high, 7)]) / 2, np.nan)


def code_differences(ours_packed, theirs_packed, scaled: np.ndarray) -> list[str]:
    """Every differing nibble must be a neighbour code with the scaled value on (or within float32
    noise of) their midpoint; returns the unexplained ones, described."""
    ours = formats.unpack_nibbles(torch.from_numpy(ours_packed)).numpy()
    theirs = formats.unpack_nibbles(torch.from_numpy(theirs_packed)).numpy()
    index = np.flatnonzero(ours != theirs)
    midpoint = e2m1_midpoint_between(ours.flat[index], theirs.flat[index])
    same_sign = (ours.flat[index] >> 3) == (theirs.flat[index] >> 3)
    distance = np.abs(np.abs(scaled.flat[index]) - midpoint) / midpoint
    bad = ~(same_sign & (distance <= NEAR_TIE))
    return [f"element {i}: scaled value {scaled.flat[i]:.9g}, fp4lab code {ours.flat[i]}, FlashInfer "
            f"code {theirs.flat[i]}" for i in index[bad][:5]]


@pytest.mark.parametrize("case, arrays", [c for c in QUANTIZE if c[0]["fmt"] == "nvfp4"] or [({}, {})],
                         ids=[c[0]["name"] for c in QUANTIZE if c[0]["fmt"] == "nvfp4"] or ["none"])
def test_nvfp4_quantize_matches_flashinfer_but_for_named_near_ties(case, arrays):
    skip_when_missing([c for c in QUANTIZE if c[0]["fmt"] == "nvfp4"], "nvfp4 quantize")
    x = bf16_input(arrays)
    q = formats.nvfp4_quantize(x, global_scale=case["global_scale"])
    theirs_scales = linear_scales(case, arrays, q.scales.shape[1])
    ours_scales = q.scales.view(torch.uint8).numpy()
    ideal = (x.float().reshape(x.shape[0], -1, 16).abs().amax(-1) * (case["global_scale"] / 6)).numpy()
    scale_index = np.flatnonzero(ours_scales != theirs_scales)
    e4m3 = lambda codes: torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()
    edge = (e4m3(ours_scales.flat[scale_index]) + e4m3(theirs_scales.flat[scale_index])) / 2
    unexplained = np.abs(ideal.flat[scale_index] - edge) > NEAR_TIE * edge
    assert not unexplained.any(), (f"{case['name']}: {int(unexplained.sum())} scale bytes differ away "
                                   f"from an e4m3 rounding edge")
    # codes compared in the blocks whose scales agree (a differing scale changes the whole block)
    agree = np.repeat(ours_scales == theirs_scales, 16, axis=1)
    factor = np.repeat((1.0 / formats.block_decode_scales(q)).numpy(), 16, axis=1)
    scaled = np.where(agree, x.float().numpy() * factor, np.nan)
    ours_packed = np.where(agree[:, ::2], q.packed.numpy(), 0).astype(np.uint8)
    theirs_packed = np.where(agree[:, ::2], arrays["packed"], 0).astype(np.uint8)
    bad = code_differences(ours_packed, theirs_packed, scaled)
    assert not bad, f"{case['name']}: codes differ away from a rounding tie: {bad}"


@pytest.mark.parametrize("case, arrays", [c for c in QUANTIZE if c[0]["fmt"] == "mxfp4"] or [({}, {})],
                         ids=[c[0]["name"] for c in QUANTIZE if c[0]["fmt"] == "mxfp4"] or ["none"])
def test_mxfp4_quantize_differs_from_flashinfer_only_where_its_scale_recipe_rounds_up(case, arrays):
    skip_when_missing([c for c in QUANTIZE if c[0]["fmt"] == "mxfp4"], "mxfp4 quantize")
    x = bf16_input(arrays)
    q = formats.mxfp4_quantize(x)
    ours = q.scales.numpy().astype(np.int32)
    theirs = linear_scales(case, arrays, ours.shape[1]).astype(np.int32)
    block_max = x.float().reshape(x.shape[0], -1, 32).abs().amax(-1).numpy()
    mantissa, _ = np.frexp(block_max)                  # block_max = mantissa * 2^e, mantissa in [0.5, 1)
    rounds_up = (block_max > 0) & (2 * mantissa > 1.5)
    np.testing.assert_array_equal(theirs - ours, rounds_up.astype(np.int32),
                                  err_msg=f"{case['name']}: e8m0 scales differ elsewhere than in blocks "
                                          f"with amax mantissa > 1.5")
    # with FlashInfer's scales, fp4lab's own encoder must give FlashInfer's codes (ties to even)
    scaled = x.float().numpy() * np.repeat(np.exp2(127.0 - theirs), 32, axis=1)
    ours_codes = formats.pack_nibbles(formats.e2m1_encode(torch.from_numpy(scaled.astype(np.float32)))).numpy()
    bad = code_differences(ours_codes, arrays["packed"], scaled)
    assert not bad, f"{case['name']}: codes differ with the same scale: {bad}"


# -- torch's dtype views of the same bytes (no FlashInfer needed) ----------------------------------

def e4m3_from_bits(code: int) -> float:
    """OCP FP8 E4M3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** -6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e2m1_from_bits(nibble: int) -> float:
    """OCP FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no NaN or Inf."""
    sign = -1.0 if nibble & 0x8 else 1.0
    exponent, mantissa = (nibble >> 1) & 0x3, nibble & 0x1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1)
    return sign * magnitude


def test_torch_float8_e4m3fn_view_decodes_every_byte_as_the_ocp_definition():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch_values = codes.view(torch.float8_e4m3fn).float().numpy()
    expected = np.array([e4m3_from_bits(code) for code in range(256)], dtype=np.float32)
    np.testing.assert_array_equal(torch_values, expected)
    assert formats.E4M3_MAX == max(v for v in expected if np.isfinite(v))


def test_torch_float8_e8m0fnu_view_decodes_like_fp4labs_mxfp4_scales():
    codes = torch.arange(255, dtype=torch.int32).to(torch.uint8)             # 255 is NaN
    torch_values = codes.view(torch.float8_e8m0fnu).float().numpy()
    ours = formats.exp2_exact(codes.to(torch.int32) - formats.E8M0_BIAS).numpy()
    np.testing.assert_array_equal(torch_values, ours)


def test_fp4labs_e2m1_codes_are_the_ocp_definition_low_nibble_first():
    nibbles = torch.arange(16, dtype=torch.uint8)
    expected = np.array([e2m1_from_bits(n) for n in range(16)], dtype=np.float32)
    np.testing.assert_array_equal(formats.e2m1_decode(nibbles).numpy(), expected)
    byte = torch.tensor([[0x7 | (0xA << 4)]], dtype=torch.uint8)             # low 6.0, high -1.0
    np.testing.assert_array_equal(formats.e2m1_decode(formats.unpack_nibbles(byte)).numpy(), [[6.0, -1.0]])


def test_torch_float4_e2m1fn_x2_view_holds_two_values_per_byte():
    q = formats.nvfp4_quantize(torch.randn(4, 64, generator=torch.Generator().manual_seed(0)))
    view = q.packed.view(torch.float4_e2m1fn_x2)
    assert view.shape == q.packed.shape and view.element_size() == 1
    assert torch.equal(view.view(torch.uint8), q.packed)


def test_torch_float4_e2m1fn_x2_decodes_like_fp4lab_where_torch_can_convert_it():
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    try:
        torch_values = packed.view(torch.float4_e2m1fn_x2).float()
    except (NotImplementedError, RuntimeError) as exc:
        pytest.skip(f"torch {torch.__version__} cannot convert float4_e2m1fn_x2 on the CPU "
                    f"({str(exc).splitlines()[0][:80]}): only its byte view is checked")
    ours = formats.e2m1_decode(formats.unpack_nibbles(packed))
    assert torch.equal(torch_values.reshape(-1), ours.reshape(-1))
