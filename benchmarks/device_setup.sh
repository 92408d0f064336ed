# Sourced at the start of every device call (the H200 test machine has torch but no papermill,
# Jupyter or network): install the carried wheels, make fp4lab importable, register the kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export JUPYTER_PATH=/tmp/jupyter/share/jupyter
python3 -m ipykernel install --prefix /tmp/jupyter --name fp4lab --display-name "Python (fp4lab)" >/dev/null
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv,noheader
