"""A fake CUDA device for torch: enough of `torch.cuda` for detection, availability rules and
NVML lookups on a machine without a GPU. Install with `FakeGpu(...).install(monkeypatch)`."""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

NAMES = {(9, 0): "NVIDIA H200", (10, 0): "NVIDIA B200", (12, 0): "NVIDIA RTX PRO 6000 Blackwell",
         (8, 0): "NVIDIA A100-SXM4-80GB", (8, 9): "NVIDIA L40S"}


@dataclass
class FakeGpu:
    capability: tuple[int, int] = (9, 0)
    count: int = 1
    name: str | None = None
    sms: int = 132
    memory_bytes: int = 150_000_000_000
    l2_bytes: int = 60 * 2**20

    def properties(self, index=0) -> types.SimpleNamespace:
        index = torch.device(index).index if isinstance(index, (str, torch.device)) else index
        index = index or 0
        major, minor = self.capability
        return types.SimpleNamespace(
            name=self.name or NAMES.get(self.capability, "NVIDIA GPU"), major=major, minor=minor,
            total_memory=self.memory_bytes, multi_processor_count=self.sms,
            L2_cache_size=self.l2_bytes, pci_domain_id=0, pci_bus_id=0x18 + index, pci_device_id=0)

    def install(self, monkeypatch) -> "FakeGpu":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: self.capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.properties)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: self.properties().name)
        return self
