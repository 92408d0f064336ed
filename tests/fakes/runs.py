"""Synthetic run folders with chosen numbers, for the analysis and chapter tests: a fake H200 run
(provenance, measured and spec ceilings) whose gemm/moe rows say exactly what a test needs."""

from __future__ import annotations

from pathlib import Path

from fp4lab import schema
from fp4lab.results import RunDir

H200 = {"kind": "cuda", "name": "NVIDIA H200", "spec": "h200", "compute_capability": [9, 0],
        "power_limit_w": 700.0, "native_fp4": [], "sm_count": 132, "memory_gb": 139.7}
CPU = {"kind": "cpu", "name": "Test CPU", "cpu_model": "Test CPU", "cpu_count": 2, "native_fp4": []}
MEASURED = {"bandwidth_tbps": 4.0, "peak_tflops": {"fp4": None, "fp8": 1200.0, "bf16": 800.0},
            "launch_us": 2.0, "source": "measured", "device": "NVIDIA H200", "details": {}}
SPEC = {"bandwidth_tbps": 4.8, "peak_tflops": {"fp4": None, "fp8": 1979.0, "bf16": 989.0, "fp32": 67.0},
        "launch_us": None, "source": "spec", "device": "NVIDIA H200 SXM", "details": {}}
DTYPES = {"torch-bf16": ("bf16", "bf16", "bf16"), "torch-fp8": ("fp8", "fp8", "fp8"),
          "triton-w4a16": ("fp4", "bf16", "bf16"), "cuda-w4a16": ("fp4", "bf16", "bf16"),
          "emulated": ("fp4", "bf16", "bf16"), "humming-w4a16": ("fp4", "bf16", "bf16"),
          "gemlite-w4a16": ("fp4", "bf16", "bf16"), "tinygemm-int4": ("int4", "bf16", "bf16")}


def make_run(root: Path, run_id: str = "fake-h200", device: dict | None = None,
             measured: dict | None = MEASURED, created: str = "2026-12-01T00:00:00+00:00") -> RunDir:
    run = RunDir.create(root, run_id=run_id)
    run.update_run_json(None, {"created": created, "provenance": {
        "device": device or H200, "versions": {"torch": "2.11.0"}, "fp4lab_git_sha": "abc123"}})
    run.update_run_json("sweep", {"ceilings": {"measured": measured, "spec": SPEC}})
    return run


def gemm_row(backend: str, m: int, n: int, k: int, median_us: float | None, status: str = "ok",
             fmt: str = "nvfp4", **extra) -> dict:
    weight, act, math = DTYPES.get(backend, ("bf16", "bf16", "bf16"))
    return schema.blank_row("gemm", run_id="fake", backend=backend, fmt=fmt, m=m, n=n, k=k,
                            weight_dtype=weight, act_dtype=act, math_dtype=math, status=status,
                            median_us=median_us, p20_us=median_us, p80_us=median_us, device="cuda",
                            gpu_index=0, **extra)


def moe_row(method: str, gemm: str, batch: int | None, median_us: float, weight_dtype: str = "bf16",
            preset: str = "glm-5", kind: str = "gemm", fmt: str | None = None, m: int | None = None,
            weight_bytes: float = 1e9, gemm_backend: str | None = None, **extra) -> dict:
    math = "bf16" if weight_dtype in ("bf16", "fp4") else weight_dtype
    return schema.blank_row("moe", run_id="fake", preset=preset, method=method, kind=kind, gemm=gemm,
                            fmt=fmt, weight_dtype=weight_dtype, act_dtype=math, math_dtype=math,
                            batch=batch, m=m, routing="uniform", ep=1, status="ok", median_us=median_us,
                            weight_bytes=weight_bytes, flops=1e9, bytes_moved=weight_bytes,
                            gemm_backend=gemm_backend, gpu_index=0, **extra)


def glm5_gemm_rows(backend: str, us_by_m: dict[int, float], **extra) -> list[dict]:
    """Rows of `backend` at both GLM-5 expert shapes, the same time at each M."""
    return [gemm_row(backend, m, n, k, us, **extra) for (n, k) in ((4096, 6144), (6144, 2048))
            for m, us in us_by_m.items()]


def moe_anatomy_row(stage: str, median_us: float | None, batch: int = 512, fmt: str = "nvfp4",
                    method: str = "cuda-w4a16-moe", preset: str = "glm-5", weight_bytes: float = 4e9,
                    status: str = "ok", **extra) -> dict:
    return schema.blank_row("moe_anatomy", run_id="fake", preset=preset, method=method, stage=stage,
                            fmt=fmt, batch=batch, routing="uniform", ep=1, status=status,
                            median_us=median_us, weight_bytes=weight_bytes, gpu_index=0, **extra)


def fused_anatomy_run(root: Path, builds: dict[str, float | None], **extra) -> RunDir:
    """A GLM-5 layer of cuda-w4a16-moe at B=512 and its anatomy builds (`builds`: stage -> us; 4
    GB of weights, a 1 ms floor at the fake run's 4 TB/s)."""
    run = make_run(root)
    run.append_rows("moe", [moe_row("cuda-w4a16-moe", "layer", 512, 1850.0, weight_dtype="fp4",
                                    kind="layer", fmt="nvfp4", weight_bytes=4e9)])
    run.append_rows("moe_anatomy", [moe_anatomy_row(stage, us, **extra) for stage, us in builds.items()])
    return run

