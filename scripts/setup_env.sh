#!/usr/bin/env bash
# Create or update the project's virtual environment (the Makefile's `setup`), on a CPU machine or
# a GPU box. Run from the project root; every knob is an environment variable:
#
#   PYTHON           the interpreter that builds the venv (default python3)
#   VENV             the venv folder (default .venv)
#   TORCH_SPEC       the torch requirement to install (default torch==2.13.0: on a CPU machine the
#                    local CPU wheel). TORCH_SPEC_ORIGIN is make's $(origin TORCH_SPEC): "file" means
#                    the Makefile's default, anything else that the user chose it.
#   TORCH_INDEX_URL  the index torch comes from (default: PyPI on a CPU machine; on a GPU box the
#                    PyTorch index of the newest CUDA build the driver supports, TORCH_CUDA_BUILDS)
#   SETUP_DEVICE     auto (default: a GPU box when nvidia-smi lists a GPU) | cpu | cuda
#   NVIDIA_SMI       the nvidia-smi to ask (default: the one on PATH)
#   PIP_FIND_LINKS / PIP_NO_INDEX   read by pip itself: offline installs from a wheel folder (which
#                    must hold the project's dependencies; setuptools too unless PYTHON has it)
#
# What it decides:
#   CPU machine   a plain venv, TORCH_SPEC, then the project with its test extra (as always).
#   GPU box whose PYTHON already has a CUDA torch (a container) and no TORCH_SPEC/TORCH_INDEX_URL
#                 chosen: the venv is built over it (--system-site-packages) and torch is not
#                 reinstalled.
#   other GPU box TORCH_SPEC from TORCH_INDEX_URL, or from the driver's CUDA build index.
#   On a GPU box torch must see the GPU (else exit 3, with the driver's and torch's CUDA versions),
#   and the `gpu` extra is installed package by package: a failure is one line, the rest goes on.
#   torch is pinned (a constraints file) for everything installed after it, so no package can
#   swap it for another build.
# The stamp ($VENV/.fp4lab-installed) holds the spec, the index URL, the device choice and
# pyproject.toml's hash: setup re-runs when any of them changes and is a no-op otherwise.
set -euo pipefail

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
SETUP_DEVICE=${SETUP_DEVICE:-auto}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
STAMP="$VENV/.fp4lab-installed"
CONSTRAINTS="$VENV/fp4lab-constraints.txt"
PROBE="$(cd "$(dirname "$0")" && pwd)/probe_torch.py"

# PyTorch's CUDA builds of torch 2.13 (pytorch.org "get started" matrix), newest first:
# "driver CUDA version:index tag". A driver runs a build of its own CUDA version or older.
TORCH_CUDA_BUILDS="13.0:cu130 12.8:cu128 12.6:cu126"
TORCH_INDEX_BASE="https://download.pytorch.org/whl"

say() { echo "==> $*"; }
die() { local code=$1; shift; echo "setup: error: $*" >&2; exit "$code"; }

file_hash() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -c1-16; else cksum "$1" | cut -d' ' -f1; fi
}

# "12.8" -> 1208, so CUDA versions compare as integers
cuda_number() { local major=${1%%.*} minor=${1#*.}; echo $((10#$major * 100 + 10#${minor%%.*})); }

wanted_stamp() {
    printf 'spec=%s\nindex=%s\ndevice=%s\npyproject=%s\n' \
        "$TORCH_SPEC" "$TORCH_INDEX_URL" "$SETUP_DEVICE" "$(file_hash pyproject.toml)"
}

case "$SETUP_DEVICE" in auto|cpu|cuda) ;; *) die 2 "SETUP_DEVICE=$SETUP_DEVICE: use auto, cpu or cuda" ;; esac
[ -f pyproject.toml ] || die 2 "run from the project root (no pyproject.toml in $PWD)"

if [ -f "$STAMP" ] && [ "$(grep -v '^#' "$STAMP")" = "$(wanted_stamp)" ]; then
    exit 0   # set up already, with these settings
fi

# -- the machine: a GPU box or not, and what its driver supports ----------------------------------
gpu_name="" driver="" driver_cuda=""
if [ "$SETUP_DEVICE" != cpu ] && command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    if ! smi=$("$NVIDIA_SMI" --query-gpu=name,driver_version --format=csv,noheader 2>&1); then
        die 4 "$NVIDIA_SMI is installed but failed ($(echo "$smi" | head -n1)): fix the driver, or set" \
              "SETUP_DEVICE=cpu to set up for the CPU"
    fi
    first=$(echo "$smi" | head -n1)
    gpu_name=${first%%,*}
    driver=$(echo "${first#*,}" | tr -d ' ')
    driver_cuda=$("$NVIDIA_SMI" 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)
fi
if [ "$SETUP_DEVICE" = cuda ] && [ -z "$gpu_name" ]; then
    die 4 "SETUP_DEVICE=cuda but $NVIDIA_SMI lists no GPU here"
fi

torch_chosen=0
case "${TORCH_SPEC_ORIGIN:-file}" in file|default|undefined) ;; *) torch_chosen=1 ;; esac
[ -n "$TORCH_INDEX_URL" ] && torch_chosen=1

mode=cpu index=$TORCH_INDEX_URL
if [ -n "$gpu_name" ]; then
    read -r host_torch host_cuda _ <<<"$("$PYTHON" "$PROBE")" || host_torch=none
    if [ "$torch_chosen" = 0 ] && [ "$host_torch" != none ] && [ "${host_cuda:--}" != - ]; then
        mode=reuse
    else
        mode=gpu
        if [ -z "$index" ]; then
            [ -n "$driver_cuda" ] || die 4 "cannot read the driver's CUDA version from $NVIDIA_SMI: set" \
                                          "TORCH_INDEX_URL (e.g. $TORCH_INDEX_BASE/cu128)"
            for build in $TORCH_CUDA_BUILDS; do
                if [ "$(cuda_number "${build%%:*}")" -le "$(cuda_number "$driver_cuda")" ]; then
                    index="$TORCH_INDEX_BASE/${build#*:}"
                    break
                fi
            done
            [ -n "$index" ] || die 4 "driver $driver supports CUDA $driver_cuda, older than every torch" \
                                    "CUDA build known here ($TORCH_CUDA_BUILDS): upgrade the driver, or" \
                                    "set TORCH_SPEC and TORCH_INDEX_URL to a torch built for CUDA $driver_cuda"
        fi
    fi
fi

case "$mode" in
    cpu)   say "setting up $VENV for the CPU: $TORCH_SPEC${index:+ from $index}" ;;
    reuse) say "setting up $VENV on a GPU box ($gpu_name, driver $driver): reusing $PYTHON's torch" \
               "$host_torch (CUDA $host_cuda), venv over its site-packages" ;;
    gpu)   say "setting up $VENV on a GPU box ($gpu_name, driver $driver, CUDA ${driver_cuda:-?}):" \
               "$TORCH_SPEC from $index" ;;
esac

# -- the venv and torch ----------------------------------------------------------------------------
if [ "$mode" = reuse ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # --system-site-packages reaches the base interpreter's packages only: when PYTHON is itself a
    # venv (a container's /opt/.../.venv holding its CUDA torch), a .pth file adds that venv's.
    parent_site=$("$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
    if [ -n "$parent_site" ]; then
        own_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$parent_site" > "$own_site/fp4lab-parent-venv.pth"
    fi
else
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip() { "$PY" -m pip -q --disable-pip-version-check "$@"; }
pip install --upgrade pip

venv_torch() { "$PY" "$PROBE"; }
if [ "$mode" != reuse ]; then
    # A torch left by other settings (or a failed setup) would satisfy the spec by version alone,
    # whatever its build: take it out so the chosen index decides.
    previous=$(grep -v '^#' "$STAMP" 2>/dev/null | grep -E '^(spec|index)=' || true)
    wanted=$(wanted_stamp | grep -E '^(spec|index)=')
    if [ "$previous" != "$wanted" ] && [ "$(venv_torch)" != none ]; then
        pip uninstall -y torch
    fi
    pip install "$TORCH_SPEC" ${index:+--index-url "$index"}
fi
read -r torch_version torch_cuda torch_sees_gpu <<<"$(venv_torch)"
[ "$torch_version" != none ] || die 3 "torch ($TORCH_SPEC) does not import in $VENV"

if [ -n "$gpu_name" ] && [ "$torch_sees_gpu" != 1 ]; then
    if [ "$torch_cuda" = - ]; then
        hint="it is a CPU build: set TORCH_INDEX_URL to a CUDA build index ($TORCH_INDEX_BASE/cuXXX)"
    elif [ -n "$driver_cuda" ] && [ "$(cuda_number "$torch_cuda")" -gt "$(cuda_number "$driver_cuda")" ]; then
        hint="it needs a driver for CUDA $torch_cuda: upgrade the driver, or set TORCH_INDEX_URL to an older CUDA build"
    else
        hint="check that this process may use the GPU (CUDA_VISIBLE_DEVICES, the container's --gpus)"
    fi
    die 3 "this machine has a GPU ($gpu_name, driver $driver supporting CUDA ${driver_cuda:-?}) but" \
          "torch $torch_version in $VENV (CUDA $torch_cuda) does not see it (torch.cuda.is_available()" \
          "is False), so make report would run the CPU smoke profile: $hint"
fi
echo "torch==$torch_version" > "$CONSTRAINTS"

# -- the project, then the GPU extra one package at a time ------------------------------------------
# pyproject.toml's requirements (dependencies plus the named extras) without torch: torch is set up
# above and is never handed to pip's resolver again (a container's CUDA torch can carry metadata
# pip will not re-resolve offline: "ResolutionImpossible ... torch==2.11.0+cu130").
requirements() { "$PY" "$(dirname "$PROBE")/project_requirements.py" "$@"; }
mapfile -t project_requirements < <(requirements test)
pip install -c "$CONSTRAINTS" "${project_requirements[@]}"
if [ -n "${PIP_NO_INDEX:-}" ]; then
    # Offline, pip's isolated build environment could find no setuptools: build the editable
    # install with the venv's own (the system's over a container, else one from PIP_FIND_LINKS).
    pip install -c "$CONSTRAINTS" "setuptools>=68"
    pip install --no-deps --no-build-isolation -e .
else
    pip install --no-deps -e .
fi
if [ -n "$gpu_name" ]; then
    mapfile -t gpu_packages < <(requirements --extra gpu)
    for package in "${gpu_packages[@]}"; do
        log="$VENV/fp4lab-gpu-${package%%[<>=!~ ]*}.log"
        if pip install -c "$CONSTRAINTS" "$package" >"$log" 2>&1; then
            say "gpu extra: $package installed"
        elif pip install --no-deps "$package" >>"$log" 2>&1; then
            # its requirements could not be resolved against the installed torch (often torch
            # itself): installed alone, it imports against what is here or says why at import
            say "gpu extra: $package installed without its requirements (see $log)"
        else
            reason=$(grep -m1 '^ERROR' "$log" || tail -n1 "$log")
            echo "setup: gpu extra: $package not installed: ${reason:-pip failed} (log: $log)" >&2
        fi
    done
fi
"$PY" -m ipykernel install --sys-prefix --name fp4lab --display-name "Python (fp4lab)" >/dev/null

{ wanted_stamp
  echo "# torch $torch_version (CUDA $torch_cuda), mode $mode${gpu_name:+, $gpu_name driver $driver}"; } > "$STAMP"
say "$VENV ready (torch $torch_version)"
