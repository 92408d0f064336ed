"""Whether `triton-w4a16`'s tensor-core path keeps its wgmma in flight: each point's preset build
compiled for sm_90 by the installed Triton (no GPU needed: the same constants and TMA boxes the
backend launches with), its SASS read for the wgmma instructions (HGMMA) and the full waits for
them (`WARPGROUP.DEPBAR.LE gsb0, 0x0`) that follow one before the next HGMMA is issued.

    PYTHONPATH=src python3 benchmarks/triton_sass.py --points nvfp4:8192x8192:64,nvfp4:8192x8192:256

Why: with the decoded weights as wgmma's register operand (`swap_ab`), a wgmma may run while the
warpgroup decodes the next k16 step only if ptxas gives each step its own A registers; where it
reuses one set, every HGMMA is followed by a wait for it, and decode and tensor cores take turns.
Prints one fixed-width line a point: its preset, the HGMMA count, how many of them are waited for
before the next one issues, after the Triton version that compiled them. `--out DIR` also writes
DIR/sass.jsonl (a row a point) and DIR/run.json (the compiler, the machine, FP4LAB_GIT_SHA), the
folder `fp4lab.analysis.sass` reads for chapter 01 (the run's builds joined by their labels).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fp4lab.backends import triton_w4a16
from fp4lab.backends.triton_w4a16_kernel import Launch, w4a16_kernel, w4a16_stream_kernel

HGMMA = re.compile(r"\bHGMMA\.")
FULL_WAIT = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b")
POINTER_ARGS = {"a_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32", "c_ptr": "*bf16",
                "ws_ptr": "*fp32", "count_ptr": "*i32", "salt_ptr": "*i32"}
INT_ARGS = ("M", "N", "K", "blocks_per_split", "splits", "steps_per_program", "stride_am", "stride_wn",
            "stride_sn", "stride_cm")
LAUNCH_OPTIONS = ("num_warps", "num_stages")


def parse_points(text: str) -> list[tuple[str, int, int, int]]:
    """"fmt:NxK:M,..." -> [(fmt, N, K, M)]; a ValueError naming the entry that does not parse."""
    points = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(nvfp4|mxfp4):(\d+)x(\d+):(\d+)", entry)
        if not match:
            raise ValueError(f"a point is fmt:NxK:M with fmt nvfp4 or mxfp4, got {entry!r}")
        points.append((match[1], int(match[2]), int(match[3]), int(match[4])))
    return points


def signature(launch: Launch) -> dict[str, str]:
    """The kernel's argument types as the backend passes them: tensor descriptors where it
    loads by TMA (boxes as `Launch.boxes`), else pointers."""
    types = dict(POINTER_ARGS)
    if launch.tma:
        a_box, w_box, s_box = launch.boxes
        types["a_ptr"] = f"tensordesc<bf16[{a_box[0]}, {a_box[1]}]>"
        types["w_ptr"] = f"tensordesc<u8[{w_box[0]}, {w_box[1]}]>"
        if s_box:
            types["s_ptr"] = f"tensordesc<u8[{s_box[0]}, {s_box[1]}]>"
    return {**types, **{name: "i32" for name in INT_ARGS}}


def compile_preset(fmt: str, n: int, k: int, m: int):
    """(config, compiled kernel) of the preset build at one point, for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config = triton_w4a16.choose_config(m, n, k)
    if config.math != "dot":
        raise ValueError(f"the preset at {fmt} {n}x{k} M={m} is {config.label()!r}: no tensor cores")
    launch = Launch(m, n, k, fmt, config, "full", "cpu")
    constants = {name: value for name, value in launch.constants.items() if name not in LAUNCH_OPTIONS}
    types = signature(launch) | {name: "constexpr" for name in constants}
    kernel = w4a16_stream_kernel if config.stream_k else w4a16_kernel
    names = list(kernel.arg_names)
    source = ASTSource(fn=kernel, signature={name: types[name] for name in names},
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    options = {name: launch.constants[name] for name in LAUNCH_OPTIONS}
    return config, triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = str(bundled) if bundled.exists() else shutil.which("cuobjdump")
    if not found:
        raise FileNotFoundError("no cuobjdump: neither Triton's bundled one nor one on PATH")
    return found


def sass_of(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([cuobjdump(), "-sass", str(path)], capture_output=True, text=True,
                              check=True).stdout


def waited_wgmma(sass: str) -> tuple[int, int]:
    """(HGMMA instructions, those followed by a full wait for them before the next HGMMA)."""
    issued = waited = 0
    pending = False
    for line in sass.splitlines():
        if HGMMA.search(line):
            issued += 1
            pending = True
        elif pending and FULL_WAIT.search(line):
            waited += 1
            pending = False
    return issued, waited


def machine() -> str:
    """The GPU's name where nvidia-smi answers (the compile needs none), else the processor's."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        names = []
    return names[0].strip() if names and names[0].strip() else f"no GPU ({os.uname().machine})"


def write_folder(out: Path, rows: list[dict], triton_version: str, argv: list[str]) -> None:
    """sass.jsonl and run.json under `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sass.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    info = {"run_id": out.name, "read": "triton-sass", "what": __doc__.split("\n\n")[0].replace("\n", " "),
            "provenance": {"machine": machine(), "triton": triton_version, "target": "sm_90",
                           "fp4lab_git_sha": os.environ.get("FP4LAB_GIT_SHA", "unknown"),
                           "command": " ".join(["python3", "benchmarks/triton_sass.py", *argv])}}
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default="nvfp4:8192x8192:64,nvfp4:4096x6144:64,nvfp4:8192x8192:256",
                        help="fmt:NxK:M, comma-separated")
    parser.add_argument("--out", type=Path, help="folder for sass.jsonl and run.json")
    args = parser.parse_args(argv)
    try:
        points = parse_points(args.points)
    except ValueError as exc:
        parser.error(str(exc))
    import triton

    print(f"Triton {triton.__version__}; SASS by {cuobjdump()}")
    print(f"{'fmt':6} {'N x K':>10} {'M':>4} {'preset':42} {'HGMMA':>5} {'waited':>6}")
    rows = []
    for fmt, n, k, m in points:
        config, compiled = compile_preset(fmt, n, k, m)
        issued, waited = waited_wgmma(sass_of(compiled.asm["cubin"]))
        print(f"{fmt:6} {f'{n}x{k}':>10} {m:>4} {config.label():42} {issued:>5} {waited:>6}")
        rows.append({"fmt": fmt, "n": n, "k": k, "m": m, "build": config.label(), "hgmma": issued,
                     "waited": waited})
    if args.out:
        write_folder(args.out, rows, triton.__version__, sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
