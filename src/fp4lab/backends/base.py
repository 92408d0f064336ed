"""What every GEMM backend is: a name, the formats it takes, whether it can run here and why not,
and `prepare`, which does the one-time work and hands back the call to time.

Shape legend: `M` rows of activations (tokens), `N` output features (weight rows), `K` the
reduction dimension; `a: [M, K]` bf16 activations, `w: [N, K]` FP4 weights, output `[M, N]`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from fp4lab.dtypes import WEIGHT_DTYPES, math_dtype
from fp4lab.hardware import NATIVE_FP4_CAPABILITIES, resolve_device

if TYPE_CHECKING:
    from fp4lab.formats import QuantizedTensor

OUTPUT_DTYPE = torch.bfloat16
GPU_EXTRA_HINT = "(pip install fp4lab[gpu])"

# Compute capabilities (major, minor) by what they bring: the FP4 tensor cores of Blackwell
# (B200/GB200, B300, RTX PRO 6000 / 5090; hardware.NATIVE_FP4_CAPABILITIES), datacenter Blackwell
# alone (sm_100/103: tcgen05), FP8 tensor cores from Ada and Hopper on, bf16 ones from Ampere on.
BLACKWELL_FP4_CAPABILITIES = tuple(sorted(NATIVE_FP4_CAPABILITIES))
DATACENTER_BLACKWELL_CAPABILITIES = ((10, 0), (10, 3))
FP8_MIN_CAPABILITY = (8, 9)
BF16_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Requirements:
    """What a backend needs to run, as data: the registry's "which backend runs where" matrix and
    `availability` read the same rules.

    `capabilities` is the exact set of GPUs it runs on (FP4 tensor cores), else `min_capability`
    the oldest; `module` is imported (once per process) to prove the package works here.
    """

    gpu: bool = True
    capabilities: tuple[tuple[int, int], ...] = ()
    min_capability: tuple[int, int] | None = None
    unit: str = ""                   # what the capability brings, for the reason: "FP4 tensor cores"
    module: str | None = None
    pip_name: str | None = None


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
    # facts about the preparation a row should keep, e.g. {"compile_s": 11.8} for a JIT backend
    info: dict = field(default_factory=dict)


def prepared_from(gemm: Callable[..., torch.Tensor], args: tuple, out: torch.Tensor | None,
                  ref_a: torch.Tensor, ref_w: torch.Tensor, info: dict | None = None) -> Prepared:
    """A `Prepared` whose call is `gemm(*args, out)`, rebindable to cloned args."""

    def make_call(call_args: tuple, call_out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        return lambda: gemm(*call_args, call_out)

    return Prepared(call=make_call(args, out), args=args, out=out, ref_a=ref_a, ref_w=ref_w,
                    make_call=make_call, info=dict(info or {}))


class Runnable:
    """Anything fp4lab can time (a GEMM backend, an MoE method): where it runs, as data.

    `weight_dtype` is what the timed call reads per weight (the roofline's bytes) and `act_dtype`
    what the activations enter the math as; together they give `math_dtype`, the peak that
    "% of peak" uses. `requires` says where it runs; `what` says what runs when it does.
    """

    name: str = ""
    library: str = ""
    weight_dtype: str = ""           # "fp4" | "int4" | "fp8" | "bf16"
    act_dtype: str = "bf16"          # "fp4" | "fp8" | "bf16"
    requires: Requirements = Requirements(gpu=False)
    what: str = ""                   # one sentence: what runs when it is available
    note: str = ""                   # shown wherever it is named, when that needs saying

    @property
    def math_dtype(self) -> str:
        return math_dtype(self.weight_dtype, self.act_dtype)

    # -- where it runs: rules first (no import), then the package, then the torch build ----------
    def capability_reason(self, capability: tuple[int, int] | None) -> str | None:
        """Why it cannot run on a GPU of `capability` (None: the CPU), by its rules alone; None
        when it can. Used for this device and for GPUs the run never saw."""
        return requirement_reason(self.requires, capability)

    def runtime_reason(self) -> str | None:
        """Why this torch build or installed package cannot run it (checked after the import)."""
        return None

    def availability(self, device: str, import_check: bool = True) -> tuple[bool, str]:
        """(True, what runs) or (False, a sentence saying why it cannot run on `device`).

        With `import_check` the package is imported (once per process), so a broken install
        is one reason here instead of an error on every point.
        """
        if device.startswith("cuda") and not torch.cuda.is_available():
            return False, "no CUDA GPU"
        device = resolve_device(device)
        if device == "cpu" and self.requires.gpu:
            return False, gpu_only_reason()
        capability = cuda_capability(device)
        reason = self.capability_reason(capability)
        if reason is None and self.requires.module:
            reason = (import_reason(self.requires.module, self.requires.pip_name) if import_check
                      else missing_package_reason(self.requires.module, self.requires.pip_name))
        if reason is None and import_check:
            reason = self.runtime_reason()
        return (False, reason) if reason else (True, self.what)

    def describe(self) -> dict:
        """The facts a row needs to be read without this registry (a removed backend's rows too)."""
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{self.name!r}: weight_dtype {self.weight_dtype!r} is not one "
                             f"of {WEIGHT_DTYPES}")
        return {"library": self.library, "weight_dtype": self.weight_dtype,
                "act_dtype": self.act_dtype, "math_dtype": self.math_dtype}


class Backend(Runnable):
    """A GEMM implementation of activations [M, K] bf16 times FP4 weights [N, K] -> [M, N] bf16."""

    formats: tuple[str, ...] = ()

    def prepare(self, a: torch.Tensor, w: "QuantizedTensor", device: str) -> Prepared:
        raise NotImplementedError

    def point_reason(self, m: int, n: int, k: int) -> str | None:
        """Why it cannot run an M x N x K point at all (a shape it does not take), or None: the
        sweep records such points as unavailable with this reason instead of an error."""
        return None

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


# --- availability rules shared by the adapters ---------------------------------------------------

def cuda_capability(device: str) -> tuple[int, int] | None:
    """The GPU's compute capability, or None when `device` is not a usable CUDA GPU."""
    if not torch.cuda.is_available() or resolve_device(device) == "cpu":
        return None
    return torch.cuda.get_device_capability(resolve_device(device))


def gpu_only_reason() -> str:
    if torch.cuda.is_available():
        return "runs only on a CUDA GPU; the CPU was asked for"
    return "no CUDA GPU"


def describe_capability(cc: tuple[int, int]) -> str:
    arch = {9: "Hopper", 8: "Ampere/Ada", 10: "Blackwell", 12: "Blackwell"}.get(cc[0], "")
    return f"sm_{cc[0]}{cc[1]}" + (f" ({arch})" if arch else "")


def requirement_reason(requires: Requirements, capability: tuple[int, int] | None) -> str | None:
    """Why `requires` rules out a device of `capability` (None: the CPU); None when it does not."""
    if capability is None:
        return gpu_only_reason() if requires.gpu else None
    if requires.capabilities and capability not in requires.capabilities:
        return fp4_capability_reason(capability, requires.capabilities, requires.unit)
    if requires.min_capability and capability < requires.min_capability:
        low = requires.min_capability
        return (f"needs compute capability {low[0]}.{low[1]} or newer ({requires.unit}); this "
                f"GPU is {describe_capability(capability)}")
    return None


def fp4_capability_reason(cc: tuple[int, int], allowed: tuple[tuple[int, int], ...],
                          unit: str = "FP4 tensor cores") -> str | None:
    """Why a backend that runs on exactly `allowed` cannot run on `cc`, or None when it can."""
    if cc in allowed:
        return None
    majors = sorted({major for major, _ in allowed})
    wanted = " or ".join(f"{major}.{min(mi for ma, mi in allowed if ma == major)}"
                         for major in majors)
    chips = "/".join(f"sm_{major}{minor}" for major, minor in sorted(allowed))
    reason = f"needs compute capability {wanted} ({unit}: {chips}); this GPU is {describe_capability(cc)}"
    if cc[0] < 10 and "FP4" in unit:
        reason += ": FP4 runs only as weight-only kernels here"
    return reason


def missing_package_reason(module: str, pip_name: str | None) -> str | None:
    """Why `module` cannot be imported, or None when it is installed (found without importing)."""
    import importlib.util

    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"{pip_name or module} is not installed {GPU_EXTRA_HINT}"
    return None


@functools.lru_cache(maxsize=None)
def import_reason(module: str, pip_name: str | None) -> str | None:
    """Why `module` does not import here (missing, or a broken install: the error's first line),
    or None when it does. Imported once per process."""
    missing = missing_package_reason(module, pip_name)
    if missing:
        return missing
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason, in one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"{pip_name or module} is installed but does not import: {type(exc).__name__}: {first}"
    return None


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple
