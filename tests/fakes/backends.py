"""Fake backends for the sweep tests, reaching worker processes via FP4LAB_EXTRA_BACKENDS.

Nothing registers on import (so collecting this file does not change the registry other tests
see); `register()` adds them. Each misbehaves in one way the sweep must survive:
  fake-ok           a correct bf16 GEMM on the dequantized weights
  fake-wrong        twice the right answer (a wrong global scale): the gate must catch it
  fake-crash        kills its process (os._exit) at M == CRASH_AT_M, like a segfault would
  fake-interrupt    raises KeyboardInterrupt at M == CRASH_AT_M, like Ctrl-C mid-point
  fake-unavailable  cannot run here, with a reason
  fake-hang         never returns at M == CRASH_AT_M (a hung kernel): the timeout must catch it
  fake-slow         fake-ok, FAKE_SLOWDOWN times slower (a synthetic regression, from the env);
                    FAKE_POINT_DELAY_S seconds of waiting before each point
and one MoE method, fake-moe-crash (kills its worker at batch == CRASH_AT_BATCH).
Shape legend: a [M, K] bf16 activations, w [N, K] FP4 weights, out [M, N].
"""

from __future__ import annotations

import os
import sys
import time

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

    def availability(self, device: str, import_check: bool = True) -> tuple[bool, str]:
        return True, "fake backend for the sweep tests"

    def misbehave(self, m: int) -> None:
        """Hook for the crashing fakes; called in prepare."""

    def prepare(self, a, w, device):
        from fp4lab.formats import dequantize

        self.misbehave(a.shape[0])
        ref_w = dequantize(w)                                 # [N, K] float32
        w_bf16 = ref_w.to(torch.bfloat16)
        out = torch.empty(a.shape[0], ref_w.shape[0], dtype=torch.bfloat16, device=a.device)

        repeats = self.repeats()

        def gemm(a, w_bf16, out):
            for _ in range(repeats):
                torch.matmul(a, w_bf16.T, out=out)
            return out.mul_(self.scale)                                   # [M, N]

        return prepared_from(gemm, (a, w_bf16), out, a.float(), w_bf16.float())

    def repeats(self) -> int:
        return 1


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
    def availability(self, device: str, import_check: bool = True) -> tuple[bool, str]:
        return False, "fake-unavailable needs a GPU that does not exist"


class Hangs(FakeBackend):
    def misbehave(self, m: int) -> None:
        if m == CRASH_AT_M:
            print(f"fake-hang: stuck at M={m}", file=sys.stderr, flush=True)
            time.sleep(3600)


class Slow(FakeBackend):
    """fake-ok doing its GEMM FAKE_SLOWDOWN times per call: a synthetic regression. With
    FAKE_POINT_DELAY_S, each point also waits that long before it is timed: a point that lasts
    as long on a fast CPU as on a slow one, for tests that act while a sweep is mid-point."""

    def misbehave(self, m: int) -> None:
        time.sleep(float(os.environ.get("FAKE_POINT_DELAY_S", "0")))

    def repeats(self) -> int:
        return int(os.environ.get("FAKE_SLOWDOWN", "1"))


FAKES = {"fake-ok": FakeBackend, "fake-wrong": WrongScale, "fake-crash": Crashes,
         "fake-interrupt": Interrupts, "fake-unavailable": Unavailable, "fake-hang": Hangs,
         "fake-slow": Slow}
CRASH_AT_BATCH = 32      # batch 32 routes 32 x 8 = 256 rows on the scaled preset, batch 8 only 64


def fake_moe_method():
    from fp4lab.backends.moe.torch_methods import LoopBf16

    class CrashingLoop(LoopBf16):
        name = "fake-moe-crash"

        def prepare(self, problem, fmt=None):
            if int(problem.loads.sum()) > 4 * CRASH_AT_BATCH:
                print("fake-moe-crash: dying", file=sys.stderr, flush=True)
                os._exit(1)
            return super().prepare(problem, fmt)
    return CrashingLoop()


def register() -> None:
    from fp4lab import backends
    from fp4lab.backends import moe

    for name, cls in FAKES.items():
        backends.REGISTRY.setdefault(name, cls(name))
    moe.REGISTRY.setdefault("fake-moe-crash", fake_moe_method())
