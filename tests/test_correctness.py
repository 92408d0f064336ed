"""The gate catches zeros, NaN, a wrong scale and unwritten output; it passes a correct kernel."""

import math

import pytest
import torch

from fp4lab.backends.base import Prepared
from fp4lab.correctness import TOLERANCE, check_backend, poison, poison_survived, reference_gemm

M, N, K = 8, 12, 32


def fake_prepared(kernel, out_dtype=torch.bfloat16) -> Prepared:
    """A tiny fake backend: `kernel(a, w, out)` writes into out; ref operands are a and w."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=generator)
    w = torch.randn(N, K, generator=generator)
    out = torch.empty(M, N, dtype=out_dtype)

    def make_call(args, call_out):
        return lambda: kernel(*args, call_out)

    args = (a, w)
    return Prepared(call=make_call(args, out), args=args, out=out, ref_a=a, ref_w=w,
                    make_call=make_call)


def correct(a, w, out):
    return out.copy_(a @ w.T)


def test_reference_is_float64_matmul():
    a = torch.tensor([[1.0, 2.0]])
    w = torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    ref = reference_gemm(a, w)
    assert ref.dtype == torch.float64
    assert ref.tolist() == [[11.0, 17.0]]


def test_reference_rejects_mismatched_k():
    with pytest.raises(ValueError, match="K=3"):
        reference_gemm(torch.ones(2, 4), torch.ones(5, 3))


def test_correct_kernel_passes_with_bf16_rounding_error():
    result = check_backend(fake_prepared(correct), TOLERANCE["nvfp4"])
    assert result.status == "ok", result.message
    assert 0 < result.rel_err < 1e-2  # bf16 output rounding is visible but small
    assert "<= tol" in result.message


def test_zeros_are_caught():
    result = check_backend(fake_prepared(lambda a, w, out: out.zero_()), TOLERANCE["nvfp4"])
    assert result.status == "wrong_result"
    assert result.rel_err == 1.0
    assert "all zeros" in result.message


def test_nan_is_caught_and_told_apart_from_unwritten():
    def writes_nan(a, w, out):
        out.copy_(a @ w.T)
        out[0, 0] = float("nan")
        return out

    result = check_backend(fake_prepared(writes_nan), TOLERANCE["nvfp4"])
    assert result.status == "wrong_result"
    assert "1 of 96 output elements are NaN/Inf" in result.message
    assert math.isnan(result.rel_err)


def test_unwritten_output_is_caught():
    def skips_last_row(a, w, out):
        out[:-1].copy_(a[:-1] @ w.T)
        return out

    result = check_backend(fake_prepared(skips_last_row), TOLERANCE["nvfp4"])
    assert result.status == "wrong_result"
    assert f"{N} of {M * N} output elements unwritten" in result.message


def test_wrong_scale_is_caught_and_named():
    result = check_backend(fake_prepared(lambda a, w, out: out.copy_(0.5 * (a @ w.T))),
                           TOLERANCE["nvfp4"])
    assert result.status == "wrong_result"
    assert result.rel_err == pytest.approx(0.5, abs=5e-3)
    assert "wrong scale" in result.message and "norm ratio 0.50" in result.message


def test_garbage_is_caught_without_scale_diagnosis():
    result = check_backend(fake_prepared(lambda a, w, out: out.copy_(torch.randn(M, N))),
                           TOLERANCE["mxfp4"])
    assert result.status == "wrong_result"
    assert "wrong scale" not in result.message and "cosine" in result.message


def test_shape_mismatch_is_caught():
    result = check_backend(fake_prepared(lambda a, w, out: (a @ w.T)[:, :-1]), TOLERANCE["bf16"])
    assert result.status == "wrong_result" and "shape" in result.message


def test_exception_from_the_call_propagates():
    def crashes(a, w, out):
        raise RuntimeError("illegal memory access")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        check_backend(fake_prepared(crashes), TOLERANCE["nvfp4"])


@pytest.mark.parametrize("tolerance", [0, -1, float("nan"), "0.02"])
def test_bad_tolerance_is_a_clear_error(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        check_backend(fake_prepared(correct), tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
def test_poison_is_recognised_and_distinct_from_computed_nan(dtype):
    out = torch.empty(4, dtype=dtype)
    poison(out)
    assert poison_survived(out).all()
    if dtype.is_floating_point:
        assert torch.isnan(out).all()  # a consumer of unwritten values still sees NaN
        out[0] = float("nan")  # a NaN the hardware computes has the canonical payload
        assert poison_survived(out).tolist() == [False, True, True, True]


def test_tolerance_covers_every_operand_format():
    assert set(TOLERANCE) >= {"nvfp4", "mxfp4", "fp8", "bf16"}
    assert all(2.0**-9 < tol < 0.1 for tol in TOLERANCE.values())


@pytest.mark.cuda
def test_gate_on_cuda_passes_cublas_and_catches_a_scale():
    a = torch.randn(64, 2048, device="cuda")
    w = torch.randn(256, 2048, device="cuda")
    out = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    args = (a.bfloat16(), w.bfloat16())

    def make_call(call_args, call_out, scale=1.0):
        return lambda: torch.mm(call_args[0], call_args[1].T, out=call_out).mul_(scale)

    good = Prepared(make_call(args, out), args, out, args[0].float(), args[1].float(), make_call)
    assert check_backend(good, TOLERANCE["bf16"]).status == "ok"
    bad = Prepared(make_call(args, out, 2.0), args, out, args[0].float(), args[1].float(),
                   make_call)
    result = check_backend(bad, TOLERANCE["bf16"])
    assert result.status == "wrong_result" and "wrong scale" in result.message


def test_run_poisoned_takes_a_list_of_results_as_a_loop_of_expert_gemms_returns():
    """loop-triton-w4a16's call returns one tensor per expert: the check must run it (the H200
    reference run 20261203T1155Z stored 32 error rows when it assumed one tensor)."""
    from types import SimpleNamespace

    from fp4lab import correctness

    out = torch.zeros(2, 3)
    experts = [torch.ones(1, 3), torch.full((1, 3), 2.0)]
    prepared = SimpleNamespace(out=out, call=lambda: experts)
    assert correctness.run_poisoned(prepared) is experts
    assert poison_survived(out).all()                                      # poisoned before the call
    single = SimpleNamespace(out=None, call=lambda: experts[0])
    assert correctness.run_poisoned(single) is experts[0]
