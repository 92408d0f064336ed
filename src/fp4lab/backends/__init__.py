"""The backend registry: every GEMM implementation fp4lab can time, and whether it runs here.

Importing this package imports no GPU library: flashinfer, sgl_kernel and triton are imported by
a backend's `prepare`, and `availability` finds packages without importing them.
"""

from __future__ import annotations

from fp4lab.backends.base import Backend, Prepared
from fp4lab.hardware import resolve_device
from fp4lab.backends.cuda_w4a16 import CudaW4A16
from fp4lab.backends.emulated import Emulated
from fp4lab.backends.flashinfer import VARIANTS as FLASHINFER_VARIANTS, FlashInferMmFp4
from fp4lab.backends.gemlite import GemliteW4A16
from fp4lab.backends.humming import HummingW4A4, HummingW4A16
from fp4lab.backends.sglang import SglCutlass
from fp4lab.backends.tinygemm import TinygemmInt4
from fp4lab.backends.torch_native import TorchBf16, TorchFp4, TorchFp8
from fp4lab.backends.triton_w4a16 import TritonW4A16

__all__ = ["Backend", "Prepared", "REGISTRY", "get", "names", "list_backends", "where_backends_run"]

REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        TorchBf16(),
        TorchFp8(),
        Emulated(),
        TorchFp4(),
        *(FlashInferMmFp4(name) for name in FLASHINFER_VARIANTS),
        SglCutlass(),
        TritonW4A16(), CudaW4A16(),
        HummingW4A16(), HummingW4A4(), GemliteW4A16(), TinygemmInt4(),
    )
}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(REGISTRY)}") from None


def list_backends(device: str = "auto") -> list[dict]:
    """One dict per backend: name, formats, library, dtypes, available, reason (packages imported)."""
    device = resolve_device(device)
    rows = []
    for backend in REGISTRY.values():
        available, reason = backend.availability(device)
        rows.append({"name": backend.name, "formats": list(backend.formats), **backend.describe(),
                     "note": backend.note, "available": available, "reason": reason})
    return rows


def where_backends_run(capabilities: dict[str, tuple[int, int] | None]) -> list[dict]:
    """The "which backend runs where" matrix from the registry's rules alone (nothing imported):
    one row per (device label, backend) with `runs` and the reason when it does not.

    `capabilities` maps a device label ("B200", "CPU") to its compute capability (None: CPU).
    Packages are not checked: this says what the backend's rules allow on a GPU never seen.
    """
    rows = []
    for label, capability in capabilities.items():
        for backend in REGISTRY.values():
            reason = backend.capability_reason(capability)
            rows.append({"device": label, "backend": backend.name, "runs": reason is None,
                         "reason": reason or backend.what})
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width: one line per backend."""
    header = f"{'backend':<20} {'formats':<13} {'library':<11} {'available':<9}  reason"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['name']:<20} {','.join(row['formats']):<13} {row['library']:<11} "
                     f"{'yes' if row['available'] else 'no':<9}  {row['reason']}")
    return "\n".join(lines)
