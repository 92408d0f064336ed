"""Fake backends for the sweep tests, reaching worker processes via FP4LAB_EXTRA_BACKENDS.

Nothing registers on import (so collecting this file does not change the registry other tests
see); `register()` adds them. Each misbehaves in one way the sweep must survive:
  fake-ok           a correct bf16 GEMM on the dequantized weights
  fake-wrong        twice the right answer (a wrong global scale): the gate must catch it
  fake-crash        kills its process (os._exit) at M == CRASH_AT_M, like a segfault would
  fake-interrupt    raises KeyboardInterrupt at M == CRASH_AT_M, like Ctrl-C mid-point
  fake-unavailable  cannot run here, with a reason
Shape legend: a [M, K] bf16 activations, w [N, K] FP4 weights, out [M, N].
"""

from __future__ import annotations

import os
import sys

import torch

from fp4lab.backends.base import Backend, prepared_from

CRASH_AT_M = 4


class FakeBackend(Backend):
    formats = ("nvfp4", "mxfp4")
    library = "fp4lab tests"
    weight_dtype, act_dtype = "bf16", "bf16"
    scale = 1.0

    def __init__(self, name: str):
        self.name = name

    def availability(self, device: str) -> tuple[bool, str]:
        return True, "fake backend for the sweep tests"

    def misbehave(self, m: int) -> None:
        """Hook for the crashing fakes; called in prepare."""

    def prepare(self, a, w, device):
        from fp4lab.formats import dequantize

        self.misbehave(a.shape[0])
        ref_w = dequantize(w)                                 # [N, K] float32
        w_bf16 = ref_w.to(torch.bfloat16)
        out = torch.empty(a.shape[0], ref_w.shape[0], dtype=torch.bfloat16, device=a.device)

        def gemm(a, w_bf16, out):
            return torch.matmul(a, w_bf16.T, out=out).mul_(self.scale)  # [M, N]

        return prepared_from(gemm, (a, w_bf16), out, a.float(), w_bf16.float())


class WrongScale(FakeBackend):
    scale = 2.0


class Crashes(FakeBackend):
    def misbehave(self, m: int) -> None:
        if m == CRASH_AT_M:
            print(f"fake-crash: dying at M={m}", file=sys.stderr, flush=True)
            os._exit(1)


class Interrupts(FakeBackend):
    def misbehave(self, m: int) -> None:
        if m == CRASH_AT_M:
            raise KeyboardInterrupt


class Unavailable(FakeBackend):
    def availability(self, device: str) -> tuple[bool, str]:
        return False, "fake-unavailable needs a GPU that does not exist"


FAKES = {"fake-ok": FakeBackend, "fake-wrong": WrongScale, "fake-crash": Crashes,
         "fake-interrupt": Interrupts, "fake-unavailable": Unavailable}


def register() -> None:
    from fp4lab import backends

    for name, cls in FAKES.items():
        backends.REGISTRY.setdefault(name, cls(name))
