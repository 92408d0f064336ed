"""Figures shared by the notebooks: one module per chapter's subject (gemm, power, moe, history)."""
