"""The points of a sweep, in the order they are measured, and the worker group each runs in.

Point legend (GEMM): `fmt` FP4 format, `n` output features, `k` reduction dim, `m` tokens; the
GEMM is a[m, k] @ w[n, k]^T. (MoE): `gemm` gate_up, down or layer; `batch` the decode batch B;
`ep` the expert-parallel degree; `m` a dense-curve point's tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fp4lab import schema

DENSE_METHOD = "dense-bf16"   # one expert's GEMM at M = dense_m_values: the layer model's curve


@dataclass(frozen=True)
class GemmPoint:
    backend: str
    fmt: str
    n: int
    k: int
    m: int

    table = "gemm"

    @property
    def group(self) -> str:
        return self.backend

    def key(self, gpu_index: int | None) -> tuple:
        return schema.GEMM.row_key({**dataclasses.asdict(self), "gpu_index": gpu_index})

    def identity(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        return f"{self.backend} {self.fmt} M={self.m} {self.n}x{self.k}"


@dataclass(frozen=True)
class AnatomyPoint:
    """One stage variant of one of fp4lab's FP4 kernels at one GEMM point."""

    backend: str
    stage: str
    fmt: str
    n: int
    k: int
    m: int

    table = "anatomy"

    @property
    def group(self) -> str:
        return f"{self.backend}-anatomy"

    def key(self, gpu_index: int | None) -> tuple:
        return schema.ANATOMY.row_key({**dataclasses.asdict(self), "gpu_index": gpu_index})

    def identity(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        return f"anatomy {self.backend} {self.stage} {self.fmt} M={self.m} {self.n}x{self.k}"


@dataclass(frozen=True)
class MoePoint:
    method: str
    gemm: str                  # gate_up | down | layer
    fmt: str | None            # FP4 methods' weight format; None for bf16/fp8 methods
    batch: int | None          # None for a dense-curve point
    ep: int
    m: int | None              # a dense-curve point's tokens

    table = "moe"

    @property
    def group(self) -> str:
        return self.method

    def key(self, gpu_index: int | None, preset: str, routing: str) -> tuple:
        return schema.MOE.row_key({**dataclasses.asdict(self), "gpu_index": gpu_index,
                                   "preset": preset, "routing": routing})

    def identity(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        where = f"B={self.batch}" if self.batch is not None else f"m={self.m}"
        return f"{self.method} {self.gemm} {self.fmt or ''} {where} ep={self.ep}".replace("  ", " ")


@dataclass(frozen=True)
class MoeAnatomyPoint:
    """One anatomy build of one of fp4lab's fused MoE kernels at one routed layer (EP 1)."""

    method: str
    stage: str
    fmt: str
    batch: int
    ep: int = 1

    table = "moe_anatomy"

    @property
    def group(self) -> str:
        return f"{self.method}-anatomy"

    def key(self, gpu_index: int | None, preset: str, routing: str) -> tuple:
        return schema.MOE_ANATOMY.row_key({**dataclasses.asdict(self), "gpu_index": gpu_index,
                                           "preset": preset, "routing": routing})

    def identity(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        return f"anatomy {self.method} {self.stage} {self.fmt} B={self.batch}"


def gemm_points(config) -> list[GemmPoint]:
    """Per backend, per format, per shape, M ascending (weights quantized once per shape)."""
    return [GemmPoint(backend, fmt, n, k, m)
            for backend in config.backend_names for fmt in config.fmts
            for (n, k) in config.shapes for m in sorted(config.m_values)]


def anatomy_points(config) -> list[AnatomyPoint]:
    """Per dissected kernel the sweep runs (schema.ANATOMY_KERNELS), every one of its stages at
    the anatomy's Ms on every shape of the GEMM grid, in the anatomy's formats."""
    return [AnatomyPoint(backend, stage, fmt, n, k, m)
            for backend, stages in schema.ANATOMY_KERNELS.items() if backend in config.backend_names
            for fmt in config.anatomy_formats for (n, k) in config.shapes
            for m in config.anatomy_m for stage in stages]


def moe_points(config, method_kinds: dict[str, tuple[str, str]]) -> list[MoePoint]:
    """Per method: GEMM methods over (gemm, batch, ep), FP4 ones per format; layer methods over
    (format, batch, ep); then one expert's dense curve per gemm.

    `method_kinds` maps a method name to (kind, weight_dtype)."""
    points = []
    for method in config.method_names:
        kind, weight_dtype = method_kinds[method]
        fmts = config.fmts if weight_dtype in ("fp4", "int4") or kind == "layer" else (None,)
        if kind == "layer":
            # EP outside the batch: one set of weights (E or E/P experts) serves a run of points
            points += [MoePoint(method, "layer", fmt, batch, ep, None)
                       for fmt in fmts for ep in config.ep_degrees for batch in config.batch_sizes]
        else:
            points += [MoePoint(method, gemm, fmt, batch, ep, None)
                       for gemm in config.gemms for fmt in fmts
                       for batch in config.batch_sizes for ep in config.ep_degrees]
    points += [MoePoint(DENSE_METHOD, gemm, None, None, 1, m)
               for gemm in config.gemms for m in config.dense_m_values]
    return points


def moe_anatomy_points(config) -> list[MoeAnatomyPoint]:
    """Per fused MoE the sweep runs that has anatomy builds (schema.MOE_ANATOMY_METHODS), each
    format at each anatomy batch, the full build first (the gate the other builds rely on)."""
    return [MoeAnatomyPoint(method, stage, fmt, batch)
            for method, stages in schema.MOE_ANATOMY_METHODS.items() if method in config.method_names
            for fmt in config.fmts for batch in config.anatomy_batches
            for stage in ("full", *(s for s in stages if s != "full"))]
