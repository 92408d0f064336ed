"""A fake backend that runs out of device memory, for the sweep's OOM path (benchmarks/fault_drill.py
on a GPU; the CPU tests of that script). Registered by `register()` through FP4LAB_EXTRA_BACKENDS,
like tests/fakes/backends.py:
  fake-oom   asks for twice the GPU's memory at M == OOM_AT_M (a real torch.cuda.OutOfMemoryError
             on a GPU; on a CPU, where no such allocation fails cleanly, the same error is raised
             and says it is simulated), then answers correctly at every other M.
"""

from __future__ import annotations

import torch

from fakes.backends import FakeBackend

OOM_AT_M = 4


class OutOfMemory(FakeBackend):
    def misbehave(self, m: int) -> None:
        if m != OOM_AT_M:
            return
        if torch.cuda.is_available():
            _, total = torch.cuda.mem_get_info()
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        raise torch.cuda.OutOfMemoryError("fake-oom: out of memory (simulated on a CPU)")


def register() -> None:
    from fp4lab import backends

    backends.REGISTRY.setdefault("fake-oom", OutOfMemory("fake-oom"))
