"""The GPUs' interconnect as `nvidia-smi topo -m` prints it (NVLink, PCIe switch, CPU), for run.json."""

from __future__ import annotations

import shutil
import subprocess

TOPOLOGY_TIMEOUT_S = 15


def nvidia_smi_topology() -> dict[str, str | None]:
    """{"matrix": the printed matrix or None, "note": why it is missing ("" when present)}."""
    if shutil.which("nvidia-smi") is None:
        return {"matrix": None, "note": "nvidia-smi not on PATH"}
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=TOPOLOGY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"matrix": None, "note": f"nvidia-smi topo -m failed: {type(exc).__name__}"}
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        return {"matrix": None, "note": f"nvidia-smi topo -m exited {done.returncode}: "
                                        f"{first[0] if first else ''}"}
    return {"matrix": done.stdout.rstrip(), "note": ""}
