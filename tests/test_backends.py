"""The backend registry, availability reasons, and the adapters' numbers on the CPU."""

import json
import subprocess
import sys

import pytest
import torch

from fp4lab import backends, formats
from fp4lab.backends import base
from fp4lab.dtypes import WEIGHT_DTYPES
from fp4lab.cli import main as cli_main

EXPECTED_NAMES = ["torch-bf16", "torch-fp8", "emulated", "torch-fp4", "flashinfer-cutlass",
                  "flashinfer-cudnn", "flashinfer-trtllm", "sgl-cutlass", "triton-w4a16", "cuda-w4a16", "humming-w4a16",
                  "humming-w4a4", "gemlite-w4a16", "tinygemm-int4"]
FP4_NATIVE = ["torch-fp4", "flashinfer-cutlass", "flashinfer-cudnn", "flashinfer-trtllm",
              "sgl-cutlass"]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")


def rel_err(out: torch.Tensor, prepared) -> float:
    ref = (prepared.ref_a.double() @ prepared.ref_w.double().T).cpu()
    return ((out.cpu().double() - ref).norm() / ref.norm()).item()


def operands(m, n, k, fmt, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = formats.quantize(torch.randn(n, k, generator=gen), fmt)
    return a, w


# --- registry ------------------------------------------------------------------------------------

def test_registry_names_are_exact():
    assert backends.names() == EXPECTED_NAMES
    assert list(backends.REGISTRY) == EXPECTED_NAMES
    for name in EXPECTED_NAMES:
        backend = backends.get(name)
        assert backend.name == name
        assert backend.weight_dtype in WEIGHT_DTYPES and backend.math_dtype in ("fp4", "fp8", "bf16")
        assert set(backend.formats) <= {"nvfp4", "mxfp4"}


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown backend 'cublas'.*torch-bf16.*triton-w4a16"):
        backends.get("cublas")


def test_importing_backends_imports_no_gpu_library():
    code = ("import sys, fp4lab.backends; "
            "print(','.join(m for m in ('triton', 'flashinfer', 'sgl_kernel') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


@no_gpu
def test_cpu_availability():
    rows = {row["name"]: row for row in backends.list_backends("auto")}
    assert list(rows) == EXPECTED_NAMES
    on_cpu = {"torch-bf16", "emulated", "tinygemm-int4"}       # torch ships tinygemm's CPU kernel too
    assert {name for name, row in rows.items() if row["available"]} == on_cpu
    for name in set(EXPECTED_NAMES) - on_cpu:
        assert rows[name]["reason"].startswith("no CUDA GPU"), rows[name]


def test_bad_device_is_a_clear_error():
    with pytest.raises(ValueError, match="device 'tpu': use 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        backends.list_backends("tpu")


def test_hopper_reasons(fake_gpu):
    fake_gpu((9, 0))
    rows = {row["name"]: row for row in backends.list_backends("cuda")}
    assert rows["torch-fp8"]["available"]
    for name in FP4_NATIVE:
        assert not rows[name]["available"]
        assert "this GPU is sm_90 (Hopper): FP4 runs only as weight-only kernels here" \
            in rows[name]["reason"], rows[name]
    assert rows["torch-fp4"]["reason"].startswith(
        "needs compute capability 10.0 or 12.0 (FP4 tensor cores: sm_100/sm_103/sm_120/sm_121)")
    # trtllm-gen kernels are datacenter-Blackwell only
    assert rows["flashinfer-trtllm"]["reason"].startswith(
        "needs compute capability 10.0 (FP4 tensor cores: sm_100/sm_103)")


def test_blackwell_without_packages_names_the_package(fake_gpu, monkeypatch):
    fake_gpu((10, 0))
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None)
    rows = {row["name"]: row for row in backends.list_backends("cuda")}
    assert rows["torch-fp4"]["available"]
    assert rows["flashinfer-cutlass"]["reason"] == \
        "flashinfer-python is not installed (pip install fp4lab[gpu])"
    assert rows["sgl-cutlass"]["reason"] == "sgl-kernel is not installed (pip install fp4lab[gpu])"
    assert not rows["flashinfer-trtllm"]["available"]


def test_old_gpu_has_no_fp8(fake_gpu):
    fake_gpu((8, 0))
    ok, reason = backends.get("torch-fp8").availability("cuda")
    assert not ok and "needs compute capability 8.9 or newer" in reason


# --- CLI -----------------------------------------------------------------------------------------

def test_cli_table_and_json(capsys):
    assert cli_main(["backends", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["backend", "formats", "weights", "available"]
    body = {line.split()[0]: line for line in lines[2:]}
    assert list(body) == EXPECTED_NAMES
    assert body["emulated"].split()[3] == "yes"
    assert body["sgl-cutlass"].split()[3] == "no"

    assert cli_main(["backends", "--json", "--device", "cpu"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == EXPECTED_NAMES
    assert set(rows[0]) == {"name", "formats", "library", "weight_dtype", "act_dtype", "math_dtype",
                            "note", "available", "reason"}


def test_cli_bad_device_exits_2(capsys):
    assert cli_main(["backends", "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err


# --- adapters that run on the CPU ----------------------------------------------------------------

def cpu_has_rowwise_scaled_mm() -> bool:
    """torch 2.13's CPU `_scaled_mm` takes row-wise scales; 2.11's (the H200 image) only per-tensor."""
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16),
                         out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", ["torch-bf16", "emulated", "torch-fp8"])
def test_cpu_adapters_match_the_float64_reference(name, fmt):
    if name == "torch-fp8" and not cpu_has_rowwise_scaled_mm():
        pytest.skip(f"torch {torch.__version__} has no row-wise _scaled_mm on the CPU")
    a, w = operands(5, 48, 64, fmt)
    prepared = backends.get(name).prepare(a, w, "cpu")
    prepared.out.fill_(float("nan"))  # the gate's poison: every element must be written
    out = prepared.call()
    assert out.shape == (5, 48) and out.dtype == torch.bfloat16
    assert out.data_ptr() == prepared.out.data_ptr()
    assert torch.isfinite(out).all()
    assert rel_err(out, prepared) < 4e-3  # bf16 output rounding only


def test_reference_operands_are_what_is_multiplied():
    a, w = operands(3, 32, 64, "nvfp4")
    exact = formats.dequantize(w)
    emulated = backends.get("emulated").prepare(a, w, "cpu")
    assert torch.equal(emulated.ref_w, exact.to(torch.bfloat16).float())
    fp8 = backends.get("torch-fp8").prepare(a, w, "cpu")
    assert fp8.ref_w.shape == exact.shape and not torch.equal(fp8.ref_w, exact)  # fp8-rounded
    assert ((fp8.ref_w - exact).norm() / exact.norm()) < 0.05


def test_make_call_rebinds_to_cloned_args():
    a, w = operands(2, 16, 32, "mxfp4")
    prepared = backends.get("emulated").prepare(a, w, "cpu")
    clones = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in prepared.args)
    out = torch.full_like(prepared.out, float("nan"))
    result = prepared.make_call(clones, out)()
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(result, prepared.call())


def test_bad_inputs_name_the_input():
    a, w = operands(2, 16, 64, "mxfp4")
    with pytest.raises(ValueError, match="takes formats \\['nvfp4'\\], not fmt='mxfp4'"):
        backends.get("sgl-cutlass").prepare(a, w, "cpu")
    with pytest.raises(ValueError, match="activations a have K=32 but weights w have K=64"):
        backends.get("emulated").prepare(a[:, :32], w, "cpu")
    with pytest.raises(ValueError, match="activations a must be 2-D"):
        backends.get("torch-bf16").prepare(a[0], w, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["torch-bf16", "emulated", "torch-fp8", "torch-fp4",
                                  "flashinfer-cutlass", "flashinfer-cudnn", "flashinfer-trtllm",
                                  "sgl-cutlass", "triton-w4a16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_backends_match_the_reference(name, fmt):
    backend = backends.get(name)
    ok, reason = backend.availability("cuda")
    if not ok or fmt not in backend.formats:
        pytest.skip(reason if not ok else f"{name} takes {backend.formats}")
    a, w = operands(33, 256, 512, fmt)
    prepared = backend.prepare(a.cuda(), w.to("cuda"), "cuda")
    if prepared.out is not None:
        prepared.out.fill_(float("nan"))
    out = prepared.call()
    torch.cuda.synchronize()
    assert out.shape == (33, 256) and torch.isfinite(out).all()
    assert rel_err(out.cpu(), prepared) < 1e-2
