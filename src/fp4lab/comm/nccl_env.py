"""The environment every comm rank runs in: NVLink multicast (NVLS) off, whatever the caller set.

The lent multi-GPU machines must not create multicast objects (`cuMulticastCreate`): NCCL's NVLS
algorithms, torch's symmetric memory and NVSHMEM would. The launcher puts these in torchrun's
environment and every rank sets them again before NCCL starts, so a bare `torchrun` run is covered.
"""

from __future__ import annotations

import os

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def apply(environ=os.environ) -> dict[str, str]:
    """Set the multicast switches off in `environ`; returns them (recorded in run.json)."""
    environ.update(MULTICAST_OFF)
    return dict(MULTICAST_OFF)
