"""Which GEMM backend and MoE method runs on which GPU of the spec sheet, by their rules alone
(capability, nothing imported): the "which backend runs where" table for GPUs a run never saw."""

from __future__ import annotations

from fp4lab import backends
from fp4lab.backends import moe


def where_rows(specs) -> list[dict]:
    """One row per (GPU, backend or MoE method): kind ("gemm", "moe-gemm", "moe-layer"), `runs`,
    and the reason it does not (or what runs when it does). `specs`: hardware.GpuSpec objects."""
    capabilities = {spec.key: spec.compute_capability for spec in specs}
    rows = [{"kind": "gemm", **row} for row in backends.where_backends_run(capabilities)]
    for label, capability in capabilities.items():
        for method in moe.REGISTRY.values():
            reason = method.capability_reason(capability)
            rows.append({"kind": f"moe-{method.kind}", "device": label, "backend": method.name,
                         "runs": reason is None, "reason": reason or method.what})
    return rows


def format_rows(rows: list[dict]) -> str:
    """Fixed-width: one line per (GPU, backend)."""
    header = f"{'gpu':<13} {'kind':<9} {'backend':<24} {'runs':<4}  why / what"
    lines = [header, "-" * len(header)]
    lines += [f"{row['device']:<13} {row['kind']:<9} {row['backend']:<24} "
              f"{'yes' if row['runs'] else 'no':<4}  {row['reason']}" for row in rows]
    return "\n".join(lines)
