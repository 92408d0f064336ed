"""gemlite (PyPI `gemlite`, pure Python Triton kernels): FP4 weight-only GEMMs, bf16 activations.

fp4lab's packed nibbles go to gemlite as they are: gemlite packs element 2i in the low nibble and
numbers the e2m1 codes as fp4lab does (sign in bit 3), so
- MXFP4: `helper.A16W4_MXFP(...).from_packed_weights(packed uint8 [N, K/2],
  scales float8_e8m0fnu [N, K/32])`;
- NVFP4: `helper.A16W4_NVFP(...).from_packed_weights(packed, scales=float8_e4m3fn [N, K/16],
  meta_scale=global_scale)`: gemlite's meta_scale is the ENCODE scale, as fp4lab's.
The timed call is `gemlite.forward_functional(a, None, tensor_args, meta_args)`, what
`GemLiteLinearTriton.forward` runs, with the weights passed in so the timer can rotate copies.

The first call per shape compiles and autotunes (13-21 s on the H200); `prepare` makes it and
reports its seconds as `Prepared.info["compile_s"]`. Where a format does not compile here
(gemlite 0.6.0.post2's NVFP4 kernel on sm_90 with triton 3.6: `tl.dot_scaled` with e4m3 scales
fails in TritonGPUAccelerateMatmul), `prepare` raises `LibraryCompileError` whose first line is
the compiler's own cause, so the point becomes an `error` row saying why.
Shape legend: `M` activation rows, `N` weight rows (output features), `K` reduction dimension.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import torch

from fp4lab.backends.base import (
    BF16_MIN_CAPABILITY, Backend, Requirements, prepared_from, resolve_device,
)
from fp4lab.backends.humming import timed_first_call
from fp4lab.text import package_relative

PROCESSORS = {"mxfp4": "A16W4_MXFP", "nvfp4": "A16W4_NVFP"}   # gemlite.helper class per format
MAX_CAUSE_CHARS = 300


class LibraryCompileError(RuntimeError):
    """A library's kernel does not compile here; the first line of the message is the cause."""


@contextlib.contextmanager
def captured_stderr():
    """Collect what native code writes to file descriptor 2 (MLIR prints its diagnostics there,
    not into the exception), then pass it on to the real stderr. Yields a list that holds the
    text once the block has finished."""
    sys.stderr.flush()
    saved = os.dup(2)
    captured: list[str] = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            os.write(2, text.encode())
            captured.append(text)


def compile_cause(exc: BaseException, diagnostics: str) -> str:
    """One line: the exception's first line, with the compiler's first `error:` diagnostic."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
    errors = [line.strip() for line in diagnostics.splitlines() if "error:" in line]
    if errors:
        cause += f" ({errors[0]})"
    return package_relative(cause)[:MAX_CAUSE_CHARS]


class GemliteW4A16(Backend):
    name = "gemlite-w4a16"
    formats = ("mxfp4", "nvfp4")
    library = "gemlite"
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = Requirements(min_capability=BF16_MIN_CAPABILITY, unit="bf16 tensor cores",
                            module="gemlite", pip_name="gemlite")
    what = "gemlite A16W4 (Triton): FP4 weights decoded in registers, bf16 math; autotuned in prepare"
    note = "NVFP4 does not compile on sm_90 with gemlite 0.6.0.post2 and triton 3.6 (an error row says why)"

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        import gemlite
        from gemlite import helper

        device = resolve_device(device)
        w = w.to(device)
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()            # [M, K]
        linear = packed_linear(helper, w, device)
        meta_args = linear.get_meta_args()

        def gemm(a_arg, w_q, scales, zeros, meta_scale, out):
            return gemlite.forward_functional(a_arg, None, [w_q, scales, zeros, meta_scale],
                                              meta_args)

        # gemlite allocates its own output: nothing to poison, the gate checks what it returns
        prepared = prepared_from(gemm, (a_bf16, *linear.get_tensor_args()), None,
                                 ref_a=a_bf16.float(), ref_w=formats.dequantize(w))
        prepared.info["compile_s"] = round(first_call_or_cause(prepared.call, w.fmt), 3)
        return prepared


def packed_linear(helper, w, device: str):
    """A GemLiteLinearTriton over fp4lab's packed weights, for w.fmt."""
    processor = getattr(helper, PROCESSORS[w.fmt])(device=device, dtype=torch.bfloat16)
    if w.fmt == "nvfp4":
        return processor.from_packed_weights(w.packed, scales=w.scales,
                                             meta_scale=w.global_scale.float())
    return processor.from_packed_weights(w.packed, w.scales.view(torch.float8_e8m0fnu))


def first_call_or_cause(call, fmt: str) -> float:
    """Seconds of the first call (compile + autotune); a compile failure becomes one line."""
    with captured_stderr() as diagnostics:
        try:
            return timed_first_call(call)
        except Exception as exc:  # noqa: BLE001 - any failure here is the compiler's verdict
            failure = exc
    raise LibraryCompileError(f"gemlite {PROCESSORS[fmt]} does not compile here: "
                              f"{compile_cause(failure, ''.join(diagnostics))}") from failure
