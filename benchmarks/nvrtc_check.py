"""Compile every `cuda-w4a16-moe` build a device call will run (the presets and the probe's
`GRID`, `LARGE_GRID`, `MORE_WARPS_GRID` and the presets' `buffer_variants`, both formats, both
launches, every anatomy stage) through a given NVRTC, here, without a GPU: what `torch.cuda._compile_kernel` does there, so that a front-end error or a
wgmma serialization warning costs seconds instead of a device call. Give it the NVRTC of the
device's CUDA (13.0 for torch 2.11+cu130; 13.5 accepted what 13.0 refused, call 101):

    python3 -m pip download --no-deps --only-binary=:all: -d /tmp/nvrtc "nvidia-cuda-nvrtc==13.0.*"
    unzip -oq /tmp/nvrtc/*.whl -d /tmp/nvrtc
    PYTHONPATH=src python3 benchmarks/nvrtc_check.py --nvrtc /tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13

Prints one line a build; exits 1 if any build fails or warns of serialized wgmma (C751x), 2 if
the library cannot be loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_moe_probe import GRID, LARGE_GRID, MORE_WARPS_GRID, buffer_variants  # noqa: E402

from fp4lab.backends.moe.cuda_fused import MOE_PRESETS, MOE_STAGES, CudaMoeConfig, build  # noqa: E402

WGMMA_SERIALIZED = "C751"     # ptxas "Potential Performance Loss: wgmma ... serialized" (C7510-C7518)


def builds() -> list[CudaMoeConfig]:
    """The presets of both formats and the probe's grids, once each, presets first."""
    presets = [config for entries in MOE_PRESETS.values() for _, config in entries]
    variants = [v for preset in presets for v in buffer_variants(preset)]
    return list(dict.fromkeys(presets + list(GRID) + list(LARGE_GRID) + list(MORE_WARPS_GRID) + variants))


def compile_log(nvrtc, source: str, options: list[str], arch: str) -> tuple[int, str]:
    """(NVRTC's result code, its log) for one program."""
    program = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"k.cu", 0, None, None):
        return -1, "nvrtcCreateProgram failed"
    flags = [f"--gpu-architecture=sm_{arch}".encode()] + [o.encode() for o in options]
    result = nvrtc.nvrtcCompileProgram(program, len(flags), (ctypes.c_char_p * len(flags))(*flags))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return result, log.value.decode(errors="replace")


def problems(result: int, log: str) -> list[str]:
    """The log's errors and serialization warnings (ptxas' C7519 'warpgroup.arrive injected' is
    information, not a loss)."""
    lines = [line for line in log.splitlines()
             if "error" in line or (WGMMA_SERIALIZED in line and "C7519" not in line)]
    return lines or ([f"NVRTC result {result}"] if result else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvrtc", required=True, help="path of libnvrtc.so.N (the device's version)")
    args = parser.parse_args(argv)
    try:
        for builtins in sorted(Path(args.nvrtc).parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)   # NVRTC opens it by name
        nvrtc = ctypes.CDLL(args.nvrtc)
    except OSError as error:
        print(f"nvrtc_check: cannot load {args.nvrtc}: {error}", file=sys.stderr)
        return 2
    failed = 0
    for config in builds():
        arch = "90a" if config.mma == "async" else "90"
        for fmt, gate_up, stage in itertools.product(("nvfp4", "mxfp4"), (True, False), MOE_STAGES):
            if config.stage_reason(stage):
                continue                                  # prepare refuses it: never built
            found = problems(*compile_log(nvrtc, *build(config, fmt, gate_up, stage), arch))
            what = f"{config.label():40s} {fmt} {'gate_up' if gate_up else 'down   '} {stage:6s}"
            print(f"{what}  {'ok' if not found else found[0][:120]}", flush=True)
            failed += bool(found)
    print(f"{failed} builds failed or serialize their wgmma")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
