"""Print what torch this interpreter has, in one line, for scripts/setup_env.sh:
`VERSION CUDA AVAILABLE` (e.g. `2.11.0+cu130 13.0 1`; CUDA is `-` for a CPU build), or `none`.

Kept apart from the shell script so that the setup's decisions can be tested with a fake python.
"""

import warnings

warnings.simplefilter("ignore")   # e.g. torch's "Failed to initialize NumPy" before numpy is installed

try:
    import torch
except Exception:  # noqa: BLE001 - no torch, or one that does not import: either way, none here
    print("none")
else:
    print(torch.__version__, torch.version.cuda or "-", int(torch.cuda.is_available()))
