"""Strip a flashinfer-python wheel down to what `fp4_quantize` / `mxfp4_quantize` need on a GPU
with no network, and repack it as a valid wheel (RECORD rewritten), for carrying to the device.

FlashInfer JIT-compiles its kernels from the CUDA sources it ships (`flashinfer/data/csrc`, 258 MB
unpacked). The FP4 quantization module (`gen_fp4_quantization_module` in
flashinfer/quantization/fp4_quantization.py) compiles seven files under csrc/nv_internal; this
keeps those and every csrc header they include (followed through the include paths the JIT passes),
drops the rest of csrc and the CUTLASS / CCCL examples, tests and Python bindings (not on any
include path), and keeps all Python and all header trees the JIT puts on its include path.

    python benchmarks/pack_flashinfer.py WHEEL OUT_DIR     # writes OUT_DIR/<the same wheel name>

stdlib only. The device script installs it with pip --no-deps --target (see
benchmarks/h200_flashinfer_golden.sh).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repack_wheel import rewrite  # noqa: E402  (beside this script)

DATA = "flashinfer/data"
CSRC = f"{DATA}/csrc"
# the sources of gen_fp4_quantization_module (flashinfer 0.7.2.post1)
FP4_SOURCES = (
    "nv_internal/tensorrt_llm/thop/fp4Quantize.cpp",
    "nv_internal/tensorrt_llm/thop/fp4Op.cpp",
    "nv_internal/cpp/kernels/quantization.cu",
    "nv_internal/cpp/common/envUtils.cpp",
    "nv_internal/cpp/common/logger.cpp",
    "nv_internal/cpp/common/stringUtils.cpp",
    "nv_internal/cpp/common/tllmException.cpp",
)
# include roots the JIT passes (jit/env.py, jit/cpp_ext.py, the module's extra_include_paths)
INCLUDE_ROOTS = (f"{CSRC}/nv_internal", f"{CSRC}/nv_internal/include", f"{DATA}/include", CSRC,
                 f"{DATA}/cutlass/include", f"{DATA}/cutlass/tools/util/include",
                 f"{DATA}/spdlog/include", f"{DATA}/cccl/cub", f"{DATA}/cccl/libcudacxx/include",
                 f"{DATA}/cccl/thrust")
# trees that are on no include path
DROPPED_TREES = tuple(f"{DATA}/{tree}/" for tree in (
    "cutlass/examples", "cutlass/python", "cutlass/test", "cccl/python", "cccl/benchmarks",
    "cccl/ci", "cccl/docs", "cccl/cudax"))
INCLUDE = re.compile(rb'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def csrc_closure(names: set[str], read) -> set[str]:
    """The csrc files the FP4 sources include, transitively, resolved like the compiler would
    (the including file's folder first, then the JIT's include roots)."""
    wanted, todo = set(), [f"{CSRC}/{source}" for source in FP4_SOURCES]
    while todo:
        path = todo.pop()
        if path in wanted:
            continue
        wanted.add(path)
        folder = str(PurePosixPath(path).parent)
        for include in INCLUDE.findall(read(path)):
            include = include.decode()
            for root in (folder, *INCLUDE_ROOTS):
                candidate = str(PurePosixPath(root, include))
                candidate = _normalize(candidate)
                if candidate in names:
                    if candidate.startswith(CSRC + "/"):
                        todo.append(candidate)
                    break
    missing = [f"{CSRC}/{source}" for source in FP4_SOURCES if f"{CSRC}/{source}" not in names]
    if missing:
        raise SystemExit(f"pack_flashinfer: the wheel lacks the FP4 sources {missing}: another "
                         f"flashinfer version? Update FP4_SOURCES from its fp4_quantization.py")
    return wanted


def _normalize(path: str) -> str:
    parts = []
    for part in path.split("/"):
        if part == "..":
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def kept(name: str, closure: set[str]) -> bool:
    if name.startswith(CSRC + "/"):
        return name in closure
    return not name.startswith(DROPPED_TREES)


def pack(wheel: str, out_dir: str) -> str:
    source = zipfile.ZipFile(wheel)
    names = set(source.namelist())
    closure = csrc_closure(names, source.read)
    record_name = next(name for name in names if name.endswith(".dist-info/RECORD"))
    out_path = f"{out_dir.rstrip('/')}/{PurePosixPath(wheel).name}"
    kept_files, dropped, _ = rewrite(source, out_path, record_name,
                                     lambda name: kept(name, closure))
    print(f"pack_flashinfer: kept {kept_files} files ({len(closure)} of csrc), dropped {dropped}"
          f" -> {out_path}")
    return out_path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python benchmarks/pack_flashinfer.py WHEEL OUT_DIR")
    pack(sys.argv[1], sys.argv[2])
