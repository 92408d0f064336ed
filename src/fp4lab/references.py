"""Published figures the book shows beside its own measurements, each with its source
(docs/REFERENCES.md holds them all, with the wording of the sources)."""

from __future__ import annotations

import pandas as pd

SEED_SOURCE = ("the seed investigation (docs/REFERENCES.md, \"The seed's SM120 table\"): FlashInfer "
               "CUTLASS FP4 GEMMs on an RTX PRO 6000 Blackwell (sm_120), shapes about M x 2048 x 6144 "
               "and larger; % of an estimated ~2000 TOPS dense FP4 peak")


def seed_sm120_table() -> pd.DataFrame:
    """The seed's benchmark table as published: M, TFLOP/s, % of ~2000 TOPS, the regime read."""
    return pd.DataFrame({
        "M": ["1", "64", "256", "512", "1024", "4096+"],
        "TFLOP/s": ["0.3-0.8", "15-55", "81-219", "161-437", "849", "1190-1313"],
        "% of ~2000 TOPS": ["<0.1%", "1-3%", "4-11%", "8-22%", "42%", "60-66%"],
        "regime (as the seed read it)": ["launch overhead / memory", "launch overhead", "starting to compute",
                                         None, None, "saturating near 1300"]})


SEED_POWER = {"watts": 235, "tdp_w": 600, "gpus": 8, "gpu": "RTX PRO 6000 Blackwell",
              "source": "the seed investigation (docs/REFERENCES.md)"}
