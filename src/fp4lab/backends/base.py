"""What every GEMM backend is: a name, the formats it takes, whether it can run here and why not,
and `prepare`, which does the one-time work and hands back the call to time.

Shape legend: `M` rows of activations (tokens), `N` output features (weight rows), `K` the
reduction dimension; `a: [M, K]` bf16 activations, `w: [N, K]` FP4 weights, output `[M, N]`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from fp4lab.formats import QuantizedTensor

OPERAND_DTYPES = ("fp4", "fp8", "bf16")
OUTPUT_DTYPE = torch.bfloat16
GPU_EXTRA_HINT = "(pip install fp4lab[gpu])"

# (major, minor) compute capabilities with FP4 tensor cores: B200/GB200, B300, RTX PRO 6000 / 5090
BLACKWELL_FP4_CAPABILITIES = ((10, 0), (10, 3), (12, 0), (12, 1))


@dataclass
class Prepared:
    """One backend, ready to run one GEMM point.

    `call` is the timed work and nothing else; `make_call(args, out)` builds the same call over
    other copies of `args` (the timer rotates copies so the L2 is cold). `ref_a` / `ref_w` are the
    operands the backend really multiplies, dequantized to float32, so the gate's float64
    reference measures the kernel's error and not the quantization's.
    """

    call: Callable[[], torch.Tensor]
    args: tuple
    out: torch.Tensor | None
    ref_a: torch.Tensor
    ref_w: torch.Tensor
    make_call: Callable[[tuple, torch.Tensor | None], Callable[[], torch.Tensor]]


def prepared_from(gemm: Callable[..., torch.Tensor], args: tuple, out: torch.Tensor | None,
                  ref_a: torch.Tensor, ref_w: torch.Tensor) -> Prepared:
    """A `Prepared` whose call is `gemm(*args, out)`, rebindable to cloned args."""

    def make_call(call_args: tuple, call_out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        return lambda: gemm(*call_args, call_out)

    return Prepared(call=make_call(args, out), args=args, out=out, ref_a=ref_a, ref_w=ref_w,
                    make_call=make_call)


class Backend:
    """A GEMM implementation of activations [M, K] bf16 times FP4 weights [N, K] -> [M, N] bf16."""

    name: str = ""
    formats: tuple[str, ...] = ()
    library: str = ""
    operand_dtype: str = ""  # what the math units consume: "fp4", "fp8" or "bf16"

    def availability(self, device: str) -> tuple[bool, str]:
        """(True, what runs) or (False, a sentence saying why it cannot run on `device`)."""
        raise NotImplementedError

    def prepare(self, a: torch.Tensor, w: "QuantizedTensor", device: str) -> Prepared:
        raise NotImplementedError

    def check_inputs(self, a: torch.Tensor, w: "QuantizedTensor") -> None:
        """Raise a ValueError naming the bad input before any work is done."""
        if w.fmt not in self.formats:
            raise ValueError(f"backend {self.name!r} takes formats {list(self.formats)}, "
                             f"not fmt={w.fmt!r}")
        if a.dim() != 2:
            raise ValueError(f"activations a must be 2-D [M, K], got shape {tuple(a.shape)}")
        if len(w.shape) != 2:
            raise ValueError(f"weights w must be 2-D [N, K], got shape {tuple(w.shape)}")
        if a.shape[1] != w.shape[1]:
            raise ValueError(f"activations a have K={a.shape[1]} but weights w have "
                             f"K={w.shape[1]}")

    def __repr__(self) -> str:
        return f"<backend {self.name} ({self.library}, {'/'.join(self.formats)})>"


# --- availability helpers shared by the adapters -------------------------------------------------

def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; anything else must be cpu or cuda."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    return device


def cuda_capability(device: str) -> tuple[int, int] | None:
    """The GPU's compute capability, or None when `device` is not a usable CUDA GPU."""
    if resolve_device(device) != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def gpu_reason(device: str) -> str | None:
    """Why there is no GPU to run on, or None when there is one."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if resolve_device(device) == "cpu":
        return "runs only on a CUDA GPU; the CPU was asked for"
    return None


def describe_capability(cc: tuple[int, int]) -> str:
    arch = {9: "Hopper", 8: "Ampere/Ada", 10: "Blackwell", 12: "Blackwell"}.get(cc[0], "")
    return f"sm_{cc[0]}{cc[1]}" + (f" ({arch})" if arch else "")


def fp4_capability_reason(cc: tuple[int, int], allowed: tuple[tuple[int, int], ...]) -> str | None:
    """Why a native-FP4 backend cannot run on `cc`, or None when it can."""
    if cc in allowed:
        return None
    majors = sorted({major for major, _ in allowed})
    wanted = " or ".join(f"{major}.{min(mi for ma, mi in allowed if ma == major)}"
                         for major in majors)
    chips = "/".join(f"sm_{major}{minor}" for major, minor in sorted(allowed))
    reason = (f"needs compute capability {wanted} (FP4 tensor cores: {chips}); this GPU is "
              f"{describe_capability(cc)}")
    if cc[0] < 10:
        reason += ": FP4 runs only as weight-only kernels here"
    return reason


def missing_package_reason(module: str, pip_name: str) -> str | None:
    """Why `module` cannot be imported, or None when it is installed (checked without importing)."""
    if importlib.util.find_spec(module) is None:
        return f"{pip_name} is not installed {GPU_EXTRA_HINT}"
    return None


def fp4_tensor_core_reason(device: str, capabilities: tuple[tuple[int, int], ...],
                           module: str | None = None, pip_name: str | None = None) -> str | None:
    """Why a native-FP4 backend cannot run: no GPU, then the capability (which alone rules out
    Hopper, without importing the package), then the package; None when it can."""
    return (gpu_reason(device)
            or fp4_capability_reason(cuda_capability(device), capabilities)
            or (missing_package_reason(module, pip_name) if module else None))


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple
