"""The native-FP4 adapters' calls, checked where the libraries cannot run.

The shared fake `flashinfer` (tests/fakes/flashinfer.py) and a fake `sgl_kernel` expose functions
with the documented signatures; each binds its arguments with `inspect.signature(...).bind` (a
wrong keyword or arity fails), records them, and computes the product from exactly what it was
given (unswizzling the scales), so a wrong transpose, layout or alpha shows up as a wrong number.
torch-fp4 goes through torch's own meta-kernel checks of `scaled_mm` / `_scaled_mm`.
"""

import sys
import types

import pytest
import torch

from fp4lab import backends, formats
from fp4lab.backends import torch_native
from fp4lab.backends.base import round_up
from fakes import flashinfer as flashinfer_fake
from fakes.flashinfer import Recorder, decoded
from test_backends import operands, rel_err


def documented_cutlass_scaled_fp4_mm(a, b, block_scale_a, block_scale_b, alpha, out_dtype):
    """sgl_kernel.cutlass_scaled_fp4_mm."""


@pytest.fixture
def fake_flashinfer(monkeypatch):
    return flashinfer_fake.install(monkeypatch)


@pytest.fixture
def fake_sgl_kernel(monkeypatch):
    def result(call):
        a = decoded(call["a"], call["block_scale_a"], "nvfp4")
        w = decoded(call["b"], call["block_scale_b"], "nvfp4")
        return (a @ w.T * call["alpha"].item()).to(call["out_dtype"])

    module = types.ModuleType("sgl_kernel")
    module.cutlass_scaled_fp4_mm = Recorder(documented_cutlass_scaled_fp4_mm, result)
    monkeypatch.setitem(sys.modules, "sgl_kernel", module)
    return module


CASES = [("flashinfer-cutlass", "nvfp4", "cutlass"), ("flashinfer-cudnn", "nvfp4", "cudnn"),
         ("flashinfer-cudnn", "mxfp4", "cudnn"), ("flashinfer-trtllm", "nvfp4", "trtllm")]


@pytest.mark.parametrize("name,fmt,backend_string", CASES)
def test_flashinfer_mm_fp4_call(fake_flashinfer, name, fmt, backend_string):
    m, n, k = 5, 128, 256
    a, w = operands(m, n, k, fmt)
    prepared = backends.get(name).prepare(a, w, "cpu")
    prepared.out.fill_(float("nan"))
    out = prepared.call()
    call = fake_flashinfer.mm_fp4.calls[-1]
    block = formats.BLOCK_SIZE[fmt]
    k_blocks = round_up(k // block, 4)
    scale_dtype = torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8

    assert call["a"].dtype == torch.uint8 and call["a"].shape == (m, k // 2)
    assert call["b"].dtype == torch.uint8 and call["b"].shape == (k // 2, n)
    assert call["b"].stride() == (1, k // 2)  # column-major: the [N, K/2] weights transposed
    assert call["a_descale"].dtype == scale_dtype
    assert call["a_descale"].shape == (round_up(m, 128), k_blocks)
    assert call["b_descale"].dtype == scale_dtype
    assert call["b_descale"].shape == (k_blocks, round_up(n, 128))  # transposed swizzled
    assert call["out"] is prepared.out and call["out_dtype"] == torch.bfloat16
    assert call["block_size"] == block and call["use_nvfp4"] == (fmt == "nvfp4")
    assert call["use_8x4_sf_layout"] is False and call["backend"] == backend_string
    if fmt == "nvfp4":
        gs_a = formats.nvfp4_global_scale(a.float())
        assert call["alpha"].dtype == torch.float32 and call["alpha"].shape == (1,)
        assert call["alpha"].item() == pytest.approx(1.0 / (gs_a * w.global_scale).item(), rel=1e-6)
    else:
        assert call["alpha"] is None
    assert rel_err(out, prepared) < 4e-3  # the library got what the reference multiplies


def test_trtllm_weights_are_shuffled_once_in_prepare(fake_flashinfer):
    a, w = operands(3, 128, 64, "nvfp4")
    prepared = backends.get("flashinfer-trtllm").prepare(a, w, "cpu")
    [shuffle_a] = fake_flashinfer.shuffle_matrix_a.calls
    [shuffle_sf] = fake_flashinfer.shuffle_matrix_sf_a.calls
    assert shuffle_a["epilogue_tile_m"] == 128 and shuffle_sf["epilogue_tile_m"] == 128
    assert shuffle_a["input_tensor"].shape == (128, 32)
    assert shuffle_sf["input_tensor"].dtype == torch.uint8  # linear e4m3 bytes
    assert shuffle_sf["input_tensor"].shape == (128, 4)
    prepared.call()
    prepared.call()
    assert len(fake_flashinfer.shuffle_matrix_a.calls) == 1  # not in the timed call


def test_sgl_cutlass_call(fake_sgl_kernel):
    m, n, k = 3, 96, 128
    a, w = operands(m, n, k, "nvfp4")
    prepared = backends.get("sgl-cutlass").prepare(a, w, "cpu")
    assert prepared.out is None  # the library allocates its own output
    out = prepared.call()
    [call] = fake_sgl_kernel.cutlass_scaled_fp4_mm.calls
    assert call["a"].dtype == torch.uint8 and call["a"].shape == (m, k // 2)
    assert call["b"].dtype == torch.uint8 and call["b"].shape == (n, k // 2)  # no transpose
    for key, rows in (("block_scale_a", m), ("block_scale_b", n)):
        assert call[key].dtype == torch.float8_e4m3fn
        assert call[key].shape == (round_up(rows, 128), round_up(k // 16, 4))
    assert call["alpha"].dtype == torch.float32 and call["alpha"].shape == (1,)
    assert call["out_dtype"] == torch.bfloat16
    assert out.shape == (m, n) and rel_err(out, prepared) < 4e-3


def test_global_scales_stay_float32():
    """FlashInfer #3398: a bf16 global scale silently produced wrong results."""
    from fp4lab.backends.flashinfer import mm_fp4_alpha
    alpha = mm_fp4_alpha(torch.tensor(1234.5678), torch.tensor(3.0e4))
    assert alpha.dtype == torch.float32
    assert alpha.item() == pytest.approx(1.0 / (1234.5678 * 3.0e4), rel=1e-7)
    assert mm_fp4_alpha(None, None) is None


def cublas_blocked(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS's block-scaling-factor layout, written from its docs: 128x4 tiles in row-major tile
    order, each stored as 32 rows of (4 row-groups x 4 columns)."""
    rows, cols = scales.shape
    padded = torch.zeros(round_up(rows, 128), round_up(cols, 4), dtype=scales.dtype)
    padded[:rows, :cols] = scales
    tiles = padded.view(padded.shape[0] // 128, 128, padded.shape[1] // 4, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_torch_fp4_operands_pass_torch_own_checks(fmt):
    m, n, k = 5, 48, 64
    a, w = operands(m, n, k, fmt)
    args, ref_a, ref_w = torch_native.fp4_operands(a, w, "cpu")
    assert args[0].dtype == torch.float4_e2m1fn_x2 and args[0].shape == (m, k // 2)
    assert args[1].dtype == torch.float4_e2m1fn_x2 and args[1].shape == (n, k // 2)
    # fp4lab's swizzle is the cuBLAS block-scaling layout torch's own tests build
    assert torch.equal(args[3].view(torch.uint8).reshape(-1),
                       cublas_blocked(w.scales.view(torch.uint8)))
    if fmt == "nvfp4":
        assert args[4].dtype == torch.float32 and args[5].dtype == torch.float32
        assert args[5].item() == pytest.approx(1.0 / w.global_scale.item())
    assert torch.equal(ref_w, formats.dequantize(w))
    # torch's meta kernels validate dtypes, shapes, scale counts and swizzle without a GPU
    meta = tuple(t.to("meta") for t in args)
    gemm = torch_native.nvfp4_scaled_mm if fmt == "nvfp4" else torch_native.mxfp4_scaled_mm
    result = gemm(*meta, None)
    assert result.shape == (m, n) and result.dtype == torch.bfloat16
