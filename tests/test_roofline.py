"""Roofline arithmetic by hand, the intensity claim, the regime, % of peak, measured ceilings."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from fp4lab.roofline import (Ceilings, classify, floors, gemm_bytes, gemm_flops, math_dtype,
                             spec_ceilings)
from fp4lab.ceilings import measure_ceilings

# an H200-like GPU with round numbers, so the floors can be checked by hand
CEILINGS = Ceilings(bandwidth_tbps=4.0, peak_tflops={"fp4": None, "fp8": 1600.0, "bf16": 800.0},
                    launch_us=1.0, source="measured")


def test_flops():
    assert gemm_flops(1, 6144, 2048) == 25_165_824


def test_bytes_nvfp4_weight_only_by_hand():
    # weights 6144*2048/2 = 6,291,456 + e4m3 scales 6144*2048/16 = 786,432 + fp32 global 4
    # activations bf16 1*2048*2 = 4,096; output bf16 1*6144*2 = 12,288
    assert gemm_bytes(1, 6144, 2048, "fp4", "nvfp4", act_dtype="bf16") == 7_094_276


def test_bytes_mxfp4_weight_only_by_hand():
    # weights 6,291,456 + e8m0 scales 6144*2048/32 = 393,216; no global scale
    assert gemm_bytes(1, 6144, 2048, "fp4", "mxfp4", act_dtype="bf16") == 6_701_056


def test_bytes_native_fp4_fp8_and_bf16_by_hand():
    # m=2, n=3, k=32; output 2*3*2 = 12 bytes in every case
    assert gemm_bytes(2, 3, 32, "fp4", "nvfp4") == (3 * 16 + 3 * 2 + 4) + (2 * 16 + 2 * 2 + 4) + 12
    assert gemm_bytes(2, 3, 32, "fp8", None) == (3 * 32 + 3 * 4) + (2 * 32 + 2 * 4) + 12
    assert gemm_bytes(2, 3, 32, "bf16", "nvfp4") == 3 * 32 * 2 + 2 * 32 * 2 + 12  # fmt ignored


@pytest.mark.parametrize("m", [1, 2, 4])
def test_nvfp4_intensity_is_about_3_6_m_at_small_m(m):
    # DESIGN.md: 0.5625 B per weight value -> 2*M*N*K / (0.5625*N*K) = 3.56*M FLOP/B
    intensity = gemm_flops(m, 6144, 2048) / gemm_bytes(m, 6144, 2048, "fp4", "nvfp4", "bf16")
    assert intensity / m == pytest.approx(2 / 0.5625, rel=0.02)
    assert abs(intensity / m - 3.6) < 0.1


@pytest.mark.parametrize("call", [
    lambda: gemm_bytes(0, 1, 32, "bf16", None),
    lambda: gemm_bytes(1, 1, 32, "int8", "nvfp4"),
    lambda: gemm_bytes(1, 1, 32, "fp4", None),
    lambda: gemm_bytes(1, 1, 32, "bf16", None, out_dtype="int8"),
    lambda: math_dtype("int4", "fp8"),
])
def test_bad_inputs_are_clear_errors(call):
    with pytest.raises(ValueError):
        call()


def test_floors_by_hand():
    point = floors(1, 6144, 2048, "fp4", "nvfp4", CEILINGS, act_dtype="bf16")
    assert point["memory_floor_us"] == pytest.approx(7_094_276 / 4e6)      # 1.77 us
    assert point["compute_floor_us"] == pytest.approx(25_165_824 / 800e6)  # bf16 math
    assert point["launch_floor_us"] == 1.0


def test_small_m_weight_only_is_memory_bound():
    verdict = classify({"m": 1, "n": 6144, "k": 2048, "fmt": "nvfp4", "weight_dtype": "fp4",
                        "act_dtype": "bf16", "median_us": 10.0}, CEILINGS)
    assert verdict["bound"] == "memory"
    assert verdict["peak_dtype"] == "bf16"
    assert verdict["tbps"] == pytest.approx(7_094_276 / 10e6)
    assert verdict["pct_of_floor"] == pytest.approx(100 * 1.773569 / 10, rel=1e-4)


def test_tiny_gemm_is_launch_bound():
    verdict = classify({"m": 1, "n": 64, "k": 64, "fmt": "nvfp4", "weight_dtype": "bf16",
                        "median_us": 1.2}, CEILINGS)
    assert verdict["bound"] == "launch"
    assert verdict["pct_of_floor"] == pytest.approx(100 / 1.2)


def test_large_gemm_is_compute_bound_and_pct_peak_by_hand():
    flops = gemm_flops(8192, 8192, 8192)
    compute_floor_us = flops / 800e6
    verdict = classify({"m": 8192, "n": 8192, "k": 8192, "fmt": "nvfp4", "weight_dtype": "bf16",
                        "median_us": 2 * compute_floor_us}, CEILINGS)
    assert verdict["bound"] == "compute"
    assert verdict["pct_peak"] == pytest.approx(50.0)
    assert verdict["tflops"] == pytest.approx(400.0)


def test_native_fp4_on_a_gpu_without_fp4_peak_has_no_pct_peak():
    verdict = classify({"m": 4096, "n": 4096, "k": 4096, "fmt": "mxfp4", "weight_dtype": "fp4",
                        "median_us": 100.0}, CEILINGS)
    assert verdict["peak_dtype"] == "fp4"
    assert verdict["pct_peak"] is None and verdict["compute_floor_us"] is None
    assert verdict["bound"] in ("memory", "launch")


def test_fp8_uses_the_fp8_peak():
    verdict = classify({"m": 8192, "n": 8192, "k": 8192, "fmt": "nvfp4", "weight_dtype": "fp8",
                        "median_us": 1000.0}, CEILINGS)
    assert verdict["peak_dtype"] == "fp8"
    assert verdict["pct_peak"] == pytest.approx(100 * gemm_flops(8192, 8192, 8192) / 1e9 / 1600)


def test_spec_ceilings_have_no_launch_floor_and_classify_without_it():
    spec = SimpleNamespace(name="H200", memory_bw_tbps=4.8,
                           peak_tflops={"fp4": None, "fp8": 1979.0, "bf16": 989.0, "fp32": 67.0},
                           sources={"memory_bw_tbps": "nvidia datasheet"})
    ceilings = spec_ceilings(spec)
    assert ceilings.source == "spec" and ceilings.launch_us is None
    assert ceilings.peak_tflops["bf16"] == 989.0
    verdict = classify({"m": 1, "n": 64, "k": 64, "fmt": "nvfp4", "weight_dtype": "bf16",
                        "median_us": 5.0}, ceilings)
    assert verdict["bound"] == "memory" and verdict["launch_floor_us"] is None


def test_classify_rejects_a_missing_time():
    with pytest.raises(ValueError, match="median_us"):
        classify({"m": 1, "n": 1, "k": 32, "weight_dtype": "bf16", "median_us": None}, CEILINGS)


def test_ceilings_round_trip_through_asdict():
    assert Ceilings(**dataclasses.asdict(CEILINGS)) == CEILINGS


def test_measured_cpu_ceilings_are_honest_and_labeled():
    ceilings = measure_ceilings("cpu", quick=True)
    assert ceilings.source == "measured" and ceilings.device == "cpu"
    assert ceilings.bandwidth_tbps > 0 and ceilings.launch_us > 0
    assert ceilings.peak_tflops["fp32"] > 0 and ceilings.peak_tflops["bf16"] > 0
    assert ceilings.peak_tflops["fp8"] is None and "fp8" in ceilings.details["not_measured"]
    assert "copy" in ceilings.details["bandwidth"]


@pytest.mark.cuda
def test_measured_gpu_ceilings_are_plausible():
    ceilings = measure_ceilings("cuda", quick=True)
    assert 0.3 < ceilings.bandwidth_tbps < 10  # any datacenter or desktop GPU of this decade
    assert ceilings.peak_tflops["bf16"] > 10
    assert 0 < ceilings.launch_us < 20
    if torch.cuda.get_device_capability() >= (8, 9):
        assert ceilings.peak_tflops["fp8"] > ceilings.peak_tflops["bf16"]
