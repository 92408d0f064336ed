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


def ep_communication() -> pd.DataFrame:
    """Published expert-parallel dispatch/combine latencies at decode (docs/REFERENCES.md)."""
    return pd.DataFrame([
        {"system": "DeepEP low-latency, H800 + 400 Gb/s RDMA", "ep": 8, "tokens_per_gpu": 128,
         "dispatch_us": 77, "combine_us": 114, "source": "DeepEP README"},
        {"system": "DeepEP low-latency, H800 + 400 Gb/s RDMA", "ep": 32, "tokens_per_gpu": 128,
         "dispatch_us": 155, "combine_us": 273, "source": "DeepEP README"},
        {"system": "pplx-kernels, H100 EP8 NVLink (FP8 dispatch / BF16 combine)", "ep": 8,
         "tokens_per_gpu": 1, "dispatch_us": 41.6, "combine_us": 41.7, "source": "pplx-kernels README"},
        {"system": "pplx-kernels, H100 EP8 NVLink (FP8 dispatch / BF16 combine)", "ep": 8,
         "tokens_per_gpu": 128, "dispatch_us": 83.6, "combine_us": 102.3, "source": "pplx-kernels README"},
        {"system": "DeepEP low-latency over NVLink, H20 EP8", "ep": 8, "tokens_per_gpu": 128,
         "dispatch_us": 37, "combine_us": 59, "source": "DeepEP PR#173"},
        {"system": "FlashInfer MoE all-to-all, B200 x 8, BF16", "ep": 8, "tokens_per_gpu": 128,
         "dispatch_us": 43.9, "combine_us": 43.8, "source": "FlashInfer benchmarks/MoE_benchmarks.md"},
    ])
