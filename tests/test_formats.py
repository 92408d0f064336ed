"""fp4lab.formats: code tables, rounding, scales, round-trip error, swizzle, bad input."""

import math

import pytest
import torch

from fp4lab import formats as f

cuda = pytest.mark.cuda


def one_block(values, block=16):
    """A [1, block] row starting with `values`, the rest zeros."""
    row = torch.zeros(1, block)
    row[0, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return row


# -- e2m1 -----------------------------------------------------------------------------------

def test_e2m1_code_table_decodes_all_16_nibbles():
    expected = list(f.E2M1_VALUES) + [-v for v in f.E2M1_VALUES]
    assert f.e2m1_decode(torch.arange(16, dtype=torch.uint8)).tolist() == expected


def test_e2m1_encode_maps_each_value_to_its_code():
    values = torch.tensor(f.E2M1_VALUES + tuple(-v for v in f.E2M1_VALUES[1:]))
    codes = f.e2m1_encode(values).tolist()
    assert codes == list(range(8)) + list(range(9, 16))


def test_e2m1_ties_go_to_the_even_code():
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    decoded = f.e2m1_decode(f.e2m1_encode(midpoints)).tolist()
    assert decoded == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert f.e2m1_decode(f.e2m1_encode(-midpoints)).tolist() == [-v for v in decoded]


def test_e2m1_rounds_to_nearest_off_the_ties():
    values = torch.tensor([0.26, 0.74, 1.3, 2.6, 3.4, 4.9, 5.1])
    assert f.e2m1_decode(f.e2m1_encode(values)).tolist() == [0.5, 0.5, 1.5, 3.0, 3.0, 4.0, 6.0]


def test_e2m1_saturates_at_six():
    assert f.e2m1_decode(f.e2m1_encode(torch.tensor([6.0, 7.0, 1e30, -100.0]))).tolist() == \
        [6.0, 6.0, 6.0, -6.0]


def test_nibble_order_low_first():
    q = f.nvfp4_quantize(one_block([6.0, 0.0, 0.0, -6.0]), global_scale=1.0)
    assert q.packed[0, 0].item() == 0x07          # element 0 = +6 (code 7) in the low nibble
    assert q.packed[0, 1].item() == 0xF0          # element 3 = -6 (code 15) in the high nibble
    assert torch.equal(f.unpack_nibbles(f.pack_nibbles(torch.arange(16, dtype=torch.uint8))),
                       torch.arange(16, dtype=torch.uint8))


# -- NVFP4 ----------------------------------------------------------------------------------

def test_nvfp4_exact_values_survive_with_unit_scale():
    # global_scale 1 and block max 6 give block scale e4m3(1) = 1: e2m1 values are exact.
    values = [6.0, -4.0, 3.0, -2.0, 1.5, 1.0, -0.5, 0.0]
    q = f.nvfp4_quantize(one_block(values), global_scale=1.0)
    assert q.scales.float().item() == 1.0
    assert f.dequantize(q)[0, :8].tolist() == values


def test_nvfp4_ties_to_even_through_quantize():
    q = f.nvfp4_quantize(one_block([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]), global_scale=1.0)
    assert f.dequantize(q)[0, :8].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_nvfp4_global_scale_is_the_encode_scale():
    x = torch.randn(4, 64)
    q = f.nvfp4_quantize(x)
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0
    assert q.global_scale.item() == pytest.approx(448 * 6 / x.abs().max().item(), rel=1e-6)


def test_nvfp4_block_scales_agree_with_torch_e4m3_cast():
    x = torch.randn(8, 128) * torch.logspace(-3, 3, 8).unsqueeze(1)
    q = f.nvfp4_quantize(x)
    block_max = x.reshape(8, 8, 16).abs().amax(-1)
    expected = (q.global_scale * block_max / 6).to(torch.float8_e4m3fn)
    assert q.scales.dtype == torch.float8_e4m3fn
    assert torch.equal(q.scales.view(torch.uint8), expected.view(torch.uint8))


def test_e4m3_code_table_at_the_edges():
    # Block scale = 448 * block max / amax: the largest block gets 448 (0x7E); a block
    # 448 * 2^9 times smaller gets e4m3's smallest subnormal, 2^-9 (0x01).
    x = torch.cat([one_block([1.0]), one_block([2**-9 / 448])], dim=1)
    q = f.nvfp4_quantize(x)
    assert q.scales.view(torch.uint8)[0].tolist() == [0x7E, 0x01]
    assert q.scales.float()[0].tolist() == [448.0, 2**-9]


def test_nvfp4_saturates_when_the_block_scale_clamps():
    # A global scale far too large pushes the block scale past 448: it clamps, values saturate at 6.
    q = f.nvfp4_quantize(one_block([6.0, 3.0]), global_scale=1000.0)
    assert q.scales.float().item() == 448.0
    out = f.dequantize(q)[0]
    assert out[0].item() == pytest.approx(6 * 448 / 1000)
    assert torch.isfinite(out).all()


def test_nvfp4_zero_blocks_and_zero_tensor():
    x = torch.cat([one_block([3.0, -1.0]), torch.zeros(1, 16)], dim=1)
    q = f.nvfp4_quantize(x)
    assert q.scales.float()[0, 1].item() == 0.0
    assert q.packed[0, 8:].eq(0).all()
    zero = f.nvfp4_quantize(torch.zeros(2, 32))
    assert zero.global_scale.item() == 1.0
    assert torch.equal(f.dequantize(zero), torch.zeros(2, 32))


def test_nvfp4_subnormal_scales_for_tiny_blocks():
    # amax 448 -> global scale 6; a block of max 0.01 gets scale e4m3(0.01), an e4m3 subnormal.
    x = torch.cat([one_block([448.0]), one_block([0.01, -0.005, 0.0025])], dim=1)
    q = f.nvfp4_quantize(x)
    tiny = q.scales.float()[0, 1].item()
    assert 0 < tiny < 2**-6
    assert tiny == torch.tensor(0.01).to(torch.float8_e4m3fn).float().item()
    out = f.dequantize(q)[0, 16:19]
    assert torch.allclose(out, x[0, 16:19], rtol=0.35)
    # below e4m3's smallest subnormal the scale is 0 and the block decodes to exact zeros, no NaN
    lost = f.nvfp4_quantize(torch.cat([one_block([448.0]), one_block([1e-5])], dim=1))
    assert lost.scales.float()[0, 1].item() == 0.0
    assert f.dequantize(lost)[0, 16:].eq(0).all()


# -- MXFP4 ----------------------------------------------------------------------------------

def test_mxfp4_scale_is_floor_log2_minus_two():
    # block max 1 -> 2^-2 (code 125); 6 -> 2^0 (127); 7.5 -> 2^0 and 7.5 saturates to 6; 8 -> 2^1
    x = torch.cat([one_block([1.0], 32), one_block([6.0], 32), one_block([7.5], 32),
                   one_block([8.0], 32)], dim=1)
    q = f.mxfp4_quantize(x)
    assert q.scales.dtype == torch.uint8 and q.global_scale is None
    assert q.scales[0].tolist() == [125, 127, 127, 128]
    assert f.dequantize(q)[0, ::32].tolist() == [1.0, 6.0, 6.0, 8.0]


def test_mxfp4_zero_and_tiny_blocks():
    x = torch.cat([torch.zeros(1, 32), one_block([2.0**-130], 32), one_block([1.0], 32)], dim=1)
    q = f.mxfp4_quantize(x)
    assert q.scales[0, :2].tolist() == [0, 0]                  # 2^-127, never 255 (NaN)
    out = f.dequantize(q)
    assert torch.isfinite(out).all() and out[0, :64].eq(0).all()
    assert f.mxfp4_quantize(torch.full((1, 32), 1e38)).scales.max().item() < 255


# -- both formats ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, low, high", [("nvfp4", 0.085, 0.105), ("mxfp4", 0.105, 0.125)])
def test_round_trip_error_on_standard_normal(fmt, low, high):
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    error = f.relative_error(x, f.quantize(x, fmt))
    assert low < error < high, f"{fmt} relative Frobenius error {error:.4f}"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_3d_expert_stack_matches_row_by_row(fmt, monkeypatch):
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(f, "CHUNK_ELEMENTS", 64 * 4)   # several chunks, one partial
    q = f.quantize(x, fmt)
    block = f.BLOCK_SIZE[fmt]
    assert q.shape == (3, 5, 64) and q.packed.shape == (3, 5, 32)
    assert q.scales.shape == (3, 5, 64 // block)
    flat = f.nvfp4_quantize(x.reshape(15, 64), q.global_scale) if fmt == "nvfp4" \
        else f.mxfp4_quantize(x.reshape(15, 64))
    assert torch.equal(q.packed.reshape(15, 32), flat.packed)
    out = f.dequantize(q)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.equal(out.reshape(15, 64), f.dequantize(flat))


def test_quantized_tensor_nbytes_and_to():
    q = f.nvfp4_quantize(torch.randn(4, 64))
    assert q.nbytes == 4 * 32 + 4 * 4
    moved = q.to("cpu")
    assert moved.fmt == "nvfp4" and torch.equal(moved.packed, q.packed)
    assert f.mxfp4_quantize(torch.randn(4, 64)).nbytes == 4 * 32 + 4 * 2


def test_packed_bytes_view_as_torch_float4_e2m1fn_x2():
    """torch's float4_e2m1fn_x2 holds two e2m1 nibbles per byte, as fp4lab packs them, so the
    packed bytes hand over to torch without a copy. (torch 2.13 offers no value casts for it on
    CPU, "copy_kernel not implemented", so values are checked against the e2m1 table above.)"""
    q = f.nvfp4_quantize(torch.randn(4, 64))
    as_fp4 = q.packed.view(torch.float4_e2m1fn_x2)
    assert as_fp4.shape == q.packed.shape and as_fp4.element_size() == 1
    assert torch.equal(as_fp4.view(torch.uint8), q.packed)


# -- swizzle --------------------------------------------------------------------------------

def swizzled_offset(row, col, padded_cols):
    """Where CUTLASS's 128x4 tile layout puts linear scale (row, col), by hand."""
    return ((row // 128) * (padded_cols // 4) * 512 + (col // 4) * 512
            + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4)


def test_swizzle_hand_checked_index():
    linear = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    flat = f.swizzle_scales(linear).flatten()
    assert swizzled_offset(33, 1, 8) == 21 and swizzled_offset(130, 5, 8) == 1569
    assert flat[21].item() == linear[33, 1].item()
    assert flat[1569].item() == linear[130, 5].item()
    for row, col in [(0, 0), (31, 3), (32, 0), (127, 7), (200, 6), (255, 7)]:
        assert flat[swizzled_offset(row, col, 8)].item() == linear[row, col].item()


def test_swizzle_pads_with_zeros_and_round_trips():
    scales = f.nvfp4_quantize(torch.randn(200, 144)).scales            # [200, 9] e4m3
    swizzled = f.swizzle_scales(scales)
    assert swizzled.shape == (256, 12) and swizzled.dtype == torch.float8_e4m3fn
    assert swizzled.view(torch.uint8).float().sum() == scales.view(torch.uint8).float().sum()
    back = f.unswizzle_scales(swizzled, 200, 9)
    assert back.dtype == torch.float8_e4m3fn
    assert torch.equal(back.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(f.unswizzle_scales(swizzled.flatten(), 200, 9).view(torch.uint8),
                       scales.view(torch.uint8))


def test_swizzle_3d_is_per_expert():
    scales = torch.randint(0, 255, (2, 130, 5), dtype=torch.uint8)
    swizzled = f.swizzle_scales(scales)
    assert swizzled.shape == (2, 256, 8)
    assert torch.equal(swizzled[1], f.swizzle_scales(scales[1]))
    assert torch.equal(f.unswizzle_scales(swizzled, 130, 5), scales)


# -- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (torch.randn(4, 24), "not a multiple of the nvfp4 block size 16"),
    (torch.ones(4, 16, dtype=torch.int32), "floating-point"),
    (torch.tensor([[float("nan")] + [0.0] * 15]), "NaN or Inf"),
    (torch.tensor([[float("inf")] + [0.0] * 15]), "NaN or Inf"),
    (torch.empty(0, 16), "empty"),
    (torch.tensor(1.0), "0-d"),
    ([1.0] * 16, "torch.Tensor"),
])
def test_bad_input_names_the_problem(bad, message):
    with pytest.raises(ValueError, match=message):
        f.nvfp4_quantize(bad)


def test_bad_input_mxfp4_and_format_and_scale():
    with pytest.raises(ValueError, match="mxfp4 block size 32"):
        f.mxfp4_quantize(torch.randn(2, 48))
    with pytest.raises(ValueError, match="unknown FP4 format 'fp4'"):
        f.quantize(torch.randn(2, 32), "fp4")
    with pytest.raises(ValueError, match="global_scale"):
        f.nvfp4_quantize(torch.randn(2, 32), global_scale=0.0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        f.nvfp4_quantize(torch.tensor([[math.inf] * 16]), global_scale=1.0)
    with pytest.raises(ValueError, match="swizzle_scales needs"):
        f.swizzle_scales(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="whole number"):
        f.unswizzle_scales(torch.zeros(100, dtype=torch.uint8), 128, 4)


# -- CUDA -----------------------------------------------------------------------------------

@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cuda_matches_cpu_bit_for_bit(fmt):
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1))
    on_cpu, on_gpu = f.quantize(x, fmt), f.quantize(x.cuda(), fmt)
    assert torch.equal(on_gpu.packed.cpu(), on_cpu.packed)
    assert torch.equal(on_gpu.scales.cpu().view(torch.uint8), on_cpu.scales.view(torch.uint8))
    assert torch.equal(f.dequantize(on_gpu).cpu(), f.dequantize(on_cpu))
    swizzled = f.swizzle_scales(on_gpu.scales)
    assert torch.equal(swizzled.cpu().view(torch.uint8),
                       f.swizzle_scales(on_cpu.scales).view(torch.uint8))
