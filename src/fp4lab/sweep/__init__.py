"""The sweeps: the GEMM grid and the MoE grid, declared as data (`config`), planned as points
(`plan`), measured by one isolated, resumable, locked runner (`runner`, `worker`)."""

from fp4lab.sweep.config import GemmSweep, MoeSweep

__all__ = ["GemmSweep", "MoeSweep"]
