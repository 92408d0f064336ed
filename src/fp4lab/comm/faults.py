"""Injected faults, for testing that a rank which exits or hangs ends the run cleanly."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

FAULT_MODES = ("exit", "hang")
FAULT_EXIT_CODE = 13


@dataclass(frozen=True)
class Fault:
    """`rank` exits (status FAULT_EXIT_CODE) or hangs when it reaches point `point`."""

    rank: int
    point: int
    mode: str

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """"RANK:POINT:exit" or "RANK:POINT:hang"."""
        try:
            rank, point, mode = text.split(":")
            fault = cls(int(rank), int(point), mode)
        except ValueError:
            raise ValueError(f"{text!r}: expected RANK:POINT:exit or RANK:POINT:hang") from None
        if fault.mode not in FAULT_MODES or fault.rank < 0 or fault.point < 0:
            raise ValueError(f"{text!r}: expected RANK:POINT:exit or RANK:POINT:hang")
        return fault

    def strikes(self, rank: int, point: int) -> bool:
        return (rank, point) == (self.rank, self.point)

    def strike(self) -> None:
        if self.mode == "exit":
            os._exit(FAULT_EXIT_CODE)
        while True:  # hang: the watchdogs must end the run
            time.sleep(3600)
