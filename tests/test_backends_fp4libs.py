"""humming, gemlite and tinygemm as dense GEMM backends, on the CPU.

humming and gemlite run through fakes (tests/fakes) that check what they are handed and compute
the product from exactly that; tinygemm runs for real where torch has its CPU kernel.
"""

from __future__ import annotations

import sys

import pytest
import torch

from fp4lab import backends, correctness, formats
from fp4lab.backends import base, gemlite as gemlite_backend, humming as humming_backend
from fp4lab.backends import tinygemm
from fakes import gemlite as fake_gemlite, humming as fake_humming
from test_backends import operands, rel_err

NEW_BACKENDS = ("humming-w4a16", "humming-w4a4", "gemlite-w4a16", "tinygemm-int4")
HAS_CPU_TINYGEMM = hasattr(torch, "_weight_int4pack_mm_for_cpu")


@pytest.fixture
def fresh_imports():
    """availability imports each package once per process: forget that around a test."""
    base.import_reason.cache_clear()
    yield
    base.import_reason.cache_clear()


@pytest.fixture
def gpu_of(monkeypatch):
    def set_capability(cc):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)
    return set_capability


@pytest.fixture
def fake_hum(monkeypatch):
    return fake_humming.install(monkeypatch)


@pytest.fixture
def fake_gem(monkeypatch):
    return fake_gemlite.install(monkeypatch)


def gate(prepared, key="nvfp4"):
    return correctness.check_backend(prepared, correctness.TOLERANCE[key])


# --- registry and availability -----------------------------------------------------------------

def test_registered_with_their_dtypes():
    assert set(NEW_BACKENDS) <= set(backends.names())
    rows = {name: backends.get(name).describe() for name in NEW_BACKENDS}
    assert rows["humming-w4a16"] == {"library": "humming", "weight_dtype": "fp4",
                                     "act_dtype": "bf16", "math_dtype": "bf16"}
    assert rows["humming-w4a4"]["math_dtype"] == "fp4"
    assert rows["gemlite-w4a16"]["math_dtype"] == "bf16"
    assert rows["tinygemm-int4"]["weight_dtype"] == "int4"
    assert backends.get("tinygemm-int4").note == "int4 (not FP4): the same-bytes reference"


def test_cli_lists_them_with_reasons_on_this_machine(capsys):
    from fp4lab.cli import main

    assert main(["backends", "--device", "cpu"]) == 0
    body = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    for name in NEW_BACKENDS:
        assert name in body
    if not torch.cuda.is_available():
        for name in ("humming-w4a16", "humming-w4a4", "gemlite-w4a16"):
            assert body[name].split()[3] == "no" and "no CUDA GPU" in body[name]


def test_not_installed_names_the_pip_package(gpu_of, monkeypatch, fresh_imports):
    gpu_of((9, 0))
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None)
    assert backends.get("humming-w4a16").availability("cuda") == (
        False, "humming-kernels is not installed (pip install fp4lab[gpu])")
    assert backends.get("gemlite-w4a16").availability("cuda") == (
        False, "gemlite is not installed (pip install fp4lab[gpu])")


def test_installed_but_broken_is_one_reason(gpu_of, tmp_path, monkeypatch, fresh_imports):
    gpu_of((9, 0))
    package = tmp_path / "humming"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('libcuda.so.1: cannot open shared object file\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "humming", raising=False)
    available, reason = backends.get("humming-w4a16").availability("cuda")
    assert not available
    assert reason == ("humming-kernels is installed but does not import: "
                      "ImportError: libcuda.so.1: cannot open shared object file")


def test_w4a4_needs_blackwell_w4a16_runs_on_hopper(gpu_of, fake_hum, fresh_imports):
    gpu_of((9, 0))
    assert backends.get("humming-w4a16").availability("cuda")[0]
    available, reason = backends.get("humming-w4a4").availability("cuda")
    assert not available
    assert reason.startswith("needs compute capability 10.0 or 12.0 (FP4 tensor cores")
    assert reason.endswith("this GPU is sm_90 (Hopper): FP4 runs only as weight-only kernels here")
    gpu_of((10, 0))
    assert backends.get("humming-w4a4").availability("cuda")[0]
    gpu_of((12, 0))
    assert backends.get("humming-w4a4").availability("cuda")[0]


# --- humming: the schema it is handed, the numbers it returns ----------------------------------

def test_humming_gets_the_modelopt_nvfp4_schema(fake_hum, monkeypatch):
    monkeypatch.setenv("HUMMING_CACHE_DIR", "/tmp/humming-cache-here")
    a, w = operands(5, 64, 128, "nvfp4")
    prepared = backends.get("humming-w4a16").prepare(a, w, "cpu")
    [layer] = fake_hum.layers
    assert layer.kwargs["weight_config"] == {"quant_method": "modelopt", "quant_algo": "nvfp4"}
    assert layer.kwargs["shape_n"] == 64 and layer.kwargs["shape_k"] == 128
    assert layer.kwargs["num_experts"] is None and layer.kwargs["input_config"] is None
    loaded = layer.loaded
    assert set(loaded) == {"weight", "weight_scale", "weight_scale_2"}
    assert loaded["weight"].dtype == torch.uint8 and torch.equal(loaded["weight"], w.packed)
    assert loaded["weight_scale"].dtype == torch.float8_e4m3fn
    assert torch.equal(loaded["weight_scale"].view(torch.uint8), w.scales.view(torch.uint8))
    assert loaded["weight_scale_2"].shape == (1,) and loaded["weight_scale_2"].dtype == torch.float32
    assert loaded["weight_scale_2"].item() == pytest.approx(1.0 / w.global_scale.item(), rel=1e-7)
    assert prepared.info["compile_cache"] == "/tmp/humming-cache-here"
    assert prepared.info["compile_s"] >= 0
    assert len(fake_hum.calls) == 1            # the compiling first call happened in prepare
    assert gate(prepared).ok


def test_humming_gets_the_mxfp4_schema(fake_hum):
    a, w = operands(3, 32, 256, "mxfp4")
    prepared = backends.get("humming-w4a16").prepare(a, w, "cpu")
    [layer] = fake_hum.layers
    assert layer.kwargs["weight_config"] == {"quant_method": "mxfp4"}
    assert set(layer.loaded) == {"weight", "weight_scale"}
    assert layer.loaded["weight_scale"].dtype == torch.uint8
    assert layer.loaded["weight_scale"].shape == (32, 256 // 32)
    assert torch.equal(layer.loaded["weight_scale"], w.scales)
    assert gate(prepared, "mxfp4").ok


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_humming_call_writes_out_and_rebinds_to_copies(fake_hum, fmt):
    a, w = operands(4, 64, 128, fmt)
    prepared = backends.get("humming-w4a16").prepare(a, w, "cpu")
    out = prepared.call()
    assert out.data_ptr() == prepared.out.data_ptr() and out.dtype == torch.bfloat16
    assert rel_err(out, prepared) < 4e-3
    # the timer's cold-L2 copies: the call must read the weights it is given, not the layer's
    copies = tuple(t.clone() for t in prepared.args)
    copies[1].zero_()                                      # the copy's packed weights
    zeroed = prepared.make_call(copies, torch.empty_like(prepared.out))()
    assert not zeroed.any()
    assert fake_hum.calls[-1]["compute_config"] is None   # dense


def test_the_gate_catches_a_kernel_that_drops_the_global_scale(fake_hum):
    fake_hum.ignore_global_scale = True
    a, w = operands(4, 64, 128, "nvfp4")
    result = gate(backends.get("humming-w4a16").prepare(a, w, "cpu"))
    assert result.status == "wrong_result" and result.rel_err > 100
    assert "cosine 1.000" in result.message     # what a cosine check would have passed


def test_humming_w4a4_quantizes_activations_as_the_kernel_does(fake_hum):
    a, w = operands(6, 64, 128, "nvfp4")
    prepared = backends.get("humming-w4a4").prepare(a, w, "cpu")
    [layer] = fake_hum.layers
    assert layer.kwargs["input_config"] == {"quant_method": "modelopt", "quant_algo": "nvfp4"}
    scale = layer.loaded["input_scale"]
    assert scale.shape == (1,)
    assert scale.item() == pytest.approx(a.float().abs().max().item() / (448 * 6), rel=1e-6)
    assert fake_hum.calls[-1]["input_scale_2"] is not None   # what transform() renamed
    assert not torch.equal(prepared.ref_a, a.float())        # NVFP4-rounded activations
    assert ((prepared.ref_a - a.float()).norm() / a.float().norm()) < 0.15
    result = gate(prepared)
    assert result.ok and result.rel_err < 4e-3, result.message


def test_round_up_e4m3_never_rounds_down():
    values = torch.rand(4096) * 448
    rounded = humming_backend.round_up_e4m3(values).float()
    assert (rounded >= values).all()
    table = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    below = table[torch.searchsorted(table, rounded) - 1]
    assert (below < values).all()     # the next e4m3 down would be below the value


def test_bad_input_names_the_parameter(fake_hum):
    a, w = operands(2, 32, 64, "mxfp4")
    with pytest.raises(ValueError, match="takes formats \\['nvfp4'\\], not fmt='mxfp4'"):
        backends.get("humming-w4a4").prepare(a, w, "cpu")
    with pytest.raises(ValueError, match="activations a have K=32 but weights w have K=64"):
        backends.get("humming-w4a16").prepare(a[:, :32], w, "cpu")


# --- gemlite -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_gemlite_gets_fp4labs_packed_weights(fake_gem, fmt):
    a, w = operands(5, 64, 256, fmt)
    prepared = backends.get("gemlite-w4a16").prepare(a, w, "cpu")
    built = fake_gem.built[-1]
    assert built[0] == fmt and torch.equal(built[1], w.packed)
    if fmt == "nvfp4":
        assert built[3].item() == pytest.approx(w.global_scale.item())   # the encode scale
    else:
        assert torch.equal(built[2].view(torch.uint8), w.scales)
    assert prepared.out is None and prepared.info["compile_s"] >= 0
    assert len(fake_gem.calls) == 1   # autotuned in prepare
    result = gate(prepared, fmt)
    assert result.ok and result.rel_err < 4e-3, result.message


def test_gemlite_compile_failure_is_one_error_line(fake_gem, capfd):
    fake_gem.fail_nvfp4 = True
    a, w = operands(2, 64, 128, "nvfp4")
    with pytest.raises(gemlite_backend.LibraryCompileError) as raised:
        backends.get("gemlite-w4a16").prepare(a, w, "cpu")
    lines = str(raised.value).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gemlite A16W4_NVFP does not compile here: "
                               "RuntimeError: PassManager::run failed (")
    assert "TritonGPUAccelerateMatmul" in lines[0]
    assert "TritonGPUAccelerateMatmul" in capfd.readouterr().err   # still shown, not swallowed
    # MXFP4 is unaffected
    a, w = operands(2, 64, 128, "mxfp4")
    assert gate(backends.get("gemlite-w4a16").prepare(a, w, "cpu"), "mxfp4").ok


def test_compile_cause_without_diagnostics():
    cause = gemlite_backend.compile_cause(ValueError("first\nsecond"), "warning: nothing\n")
    assert cause == "ValueError: first"


# --- tinygemm ----------------------------------------------------------------------------------

def test_int4_quantize_round_trip():
    w = torch.randn(16, 256)
    codes, scales, zeros = tinygemm.int4_quantize(w)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == zeros.shape == (16, 2) and scales.dtype == torch.bfloat16
    back = tinygemm.int4_dequantize(codes, scales, zeros)
    step = scales.float().repeat_interleave(128, dim=1)
    assert ((back - w).abs() <= 0.51 * step + 0.02).all()   # half a step, plus bf16 scale/zero


def test_int4_group_must_divide_k():
    with pytest.raises(ValueError, match="K=100, not a multiple of the int4 group 128"):
        tinygemm.int4_quantize(torch.randn(4, 100))


def test_cuda_packing_puts_the_even_element_in_the_high_nibble(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch, "_convert_weight_to_int4pack",
                        lambda source, tiles: seen.update(source=source, tiles=tiles), raising=False)
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    tinygemm.pack_int4(codes, tinygemm.INT4_OPS["cuda"])
    assert seen["tiles"] == 8 and seen["source"].tolist() == [[0x12, 0x34]]


@pytest.mark.skipif(not HAS_CPU_TINYGEMM, reason=f"torch {torch.__version__} has no CPU tinygemm")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_tinygemm_runs_on_the_cpu_and_passes_its_own_gate(fmt):
    assert backends.get("tinygemm-int4").availability("cpu")[0]
    a, w = operands(5, 64, 256, fmt)
    prepared = backends.get("tinygemm-int4").prepare(a, w, "cpu")
    result = gate(prepared, "bf16")
    assert result.ok and result.rel_err < 4e-3, result.message
    # the reference is the int4 weights, not the FP4 ones it was made from
    fp4 = formats.dequantize(w)
    assert 0.02 < ((prepared.ref_w - fp4).norm() / fp4.norm()) < 0.2


def test_tinygemm_without_the_torch_op_says_so(monkeypatch):
    monkeypatch.delattr(torch, "_weight_int4pack_mm_for_cpu", raising=False)
    available, reason = backends.get("tinygemm-int4").availability("cpu")
    assert not available and reason == f"torch {torch.__version__} has no torch._weight_int4pack_mm_for_cpu"


# --- the real libraries, where a GPU and the packages are there (pytest -m cuda) ---------------

@pytest.mark.cuda
@pytest.mark.parametrize("name,fmt", [("humming-w4a16", "nvfp4"), ("humming-w4a16", "mxfp4"),
                                      ("humming-w4a4", "nvfp4"), ("gemlite-w4a16", "mxfp4"),
                                      ("gemlite-w4a16", "nvfp4"), ("tinygemm-int4", "nvfp4")])
def test_real_library_on_the_gpu_passes_the_gate(name, fmt):
    backend = backends.get(name)
    available, reason = backend.availability("cuda")
    if not available:
        pytest.skip(reason)
    a, w = operands(16, 512, 1024, fmt)
    try:
        prepared = backend.prepare(a.cuda(), w.to("cuda"), "cuda")
    except gemlite_backend.LibraryCompileError as exc:   # gemlite nvfp4 on sm_90, as measured
        assert len(str(exc).splitlines()) == 1
        pytest.skip(str(exc))
    result = gate(prepared, "bf16" if backend.weight_dtype == "int4" else fmt)
    assert result.ok, result.message
