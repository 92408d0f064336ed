"""scripts/setup_env.sh decides how to build the venv: CPU machine, container with a CUDA torch,
GPU box without one, a torch that cannot see the GPU. Run for real with a fake `nvidia-smi` on
PATH and a fake python (its venvs, pip and torch probe record what they were asked to do)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup_env.sh"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# A python that records what it is asked: venvs (copies of itself), pip commands, the torch probe.
venv_dir=$(cd "$(dirname "$0")/.." && pwd)
case "$1" in
  -m)
    case "$2" in
      venv)
        shift 2; dir="${@: -1}"; mkdir -p "$dir/bin"; cp "$0" "$dir/bin/python"
        touch "$dir/fake-venv"; rm -f "$dir/system-site"
        if [[ " $* " == *" --system-site-packages "* ]]; then touch "$dir/system-site"; fi
        echo "venv $*" >> "$FAKE_LOG" ;;
      pip)
        shift 2; args=()
        for arg in "$@"; do [[ "$arg" == -q || "$arg" == --disable-pip-version-check ]] || args+=("$arg"); done
        set -- "${args[@]}"; echo "pip $* [PIP_NO_INDEX=${PIP_NO_INDEX:-}]" >> "$FAKE_LOG"
        for failing in ${FAKE_PIP_FAIL:-}; do
          if [[ " $* " == *" $failing"* ]]; then
            echo "ERROR: No matching distribution found for $failing" >&2; exit 1
          fi
        done
        if [[ "$*" == *"install"*" torch"* && "$*" != *" -e "* ]]; then touch "$venv_dir/torch"; fi
        if [[ "$*" == *"uninstall -y torch"* ]]; then rm -f "$venv_dir/torch"; fi ;;
      ipykernel) echo "ipykernel" >> "$FAKE_LOG" ;;
    esac ;;
  -c) ;;   # the parent-venv probe: the fake host python is no venv
  *project_requirements.py) exec "$FAKE_REAL_PYTHON" "$@" ;;
  *probe_torch.py)
    if [ ! -f "$venv_dir/fake-venv" ] || [ -f "$venv_dir/system-site" ]; then echo "$FAKE_HOST_TORCH"
    elif [ -f "$venv_dir/torch" ]; then echo "$FAKE_VENV_TORCH"
    else echo none; fi ;;
  *) echo "fake python: unexpected $*" >&2; exit 9 ;;
esac
"""

FAKE_NVIDIA_SMI = r"""#!/usr/bin/env bash
if [ -n "${FAKE_SMI_BROKEN:-}" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9
fi
if [ "$1" = "--query-gpu=name,driver_version" ]; then echo "$FAKE_GPU, $FAKE_DRIVER"; exit 0; fi
echo "| NVIDIA-SMI $FAKE_DRIVER   Driver Version: $FAKE_DRIVER   CUDA Version: $FAKE_DRIVER_CUDA |"
"""


class Box:
    """One machine to set up: fake tools in `bin/`, the venv in `venv/`, the call log."""

    def __init__(self, tmp_path: Path, gpu: bool):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.venv = tmp_path / "venv"
        self.log = tmp_path / "calls.log"
        self.log.touch()
        self.python = self._tool("python", FAKE_PYTHON)
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "PYTHON": str(self.python),
                    "VENV": str(self.venv), "FAKE_LOG": str(self.log),
                    "FAKE_HOST_TORCH": "none", "FAKE_VENV_TORCH": "2.13.0+cpu - 0",
                    "HOME": str(tmp_path), "FAKE_REAL_PYTHON": sys.executable}
        if gpu:
            self._tool("nvidia-smi", FAKE_NVIDIA_SMI)
            self.env.update(FAKE_GPU="NVIDIA H200", FAKE_DRIVER="580.159.04", FAKE_DRIVER_CUDA="13.0")
        else:  # a machine with no nvidia-smi, even where the test itself runs on a GPU box
            self.env["NVIDIA_SMI"] = "fp4lab-test-no-such-nvidia-smi"

    def _tool(self, name: str, text: str) -> Path:
        path = self.bin / name
        path.write_text(textwrap.dedent(text))
        path.chmod(0o755)
        return path

    def setup(self, **env: str) -> subprocess.CompletedProcess:
        self.log.write_text("")
        return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env={**self.env, **env},
                              capture_output=True, text=True, timeout=60)

    @property
    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def pip_installs(self) -> list[str]:
        return [call for call in self.calls if call.startswith("pip install")]

    @property
    def stamp(self) -> str:
        return (self.venv / ".fp4lab-installed").read_text()


def project_requirements(*extras: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]
    return [r for r in wanted if not r.startswith("torch")]


def gpu_extra() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]


@pytest.fixture
def cpu_box(tmp_path):
    return Box(tmp_path, gpu=False)


@pytest.fixture
def gpu_box(tmp_path):
    return Box(tmp_path, gpu=True)


def test_a_cpu_machine_sets_up_as_before_from_the_pinned_cpu_wheel(cpu_box):
    result = cpu_box.setup(TORCH_SPEC_ORIGIN="file")
    assert result.returncode == 0, result.stderr
    venv_calls = [call for call in cpu_box.calls if call.startswith("venv")]
    assert venv_calls == [f"venv {cpu_box.venv}"]                      # no --system-site-packages
    installs = cpu_box.pip_installs()
    assert installs[0].startswith("pip install --upgrade pip")
    assert installs[1].startswith("pip install torch==2.13.0 [")        # no --index-url
    assert all(dep in installs[2] for dep in project_requirements("test"))   # torch left out
    assert " torch" not in installs[2]
    assert installs[3].startswith("pip install --no-deps -e . [") and len(installs) == 4  # no gpu extra
    assert "ipykernel" in cpu_box.calls
    assert "spec=torch==2.13.0\nindex=\ndevice=auto\npyproject=" in cpu_box.stamp


def test_a_container_with_a_cuda_torch_is_reused_not_reinstalled(gpu_box):
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_HOST_TORCH="2.11.0+cu130 13.0 1")
    assert result.returncode == 0, result.stderr
    assert f"venv --system-site-packages {gpu_box.venv}" in gpu_box.calls
    installs = gpu_box.pip_installs()
    assert not any(re.match(r"pip install torch", call) for call in installs)
    constraints = gpu_box.venv / "fp4lab-constraints.txt"
    assert constraints.read_text().strip() == "torch==2.11.0+cu130"
    # the project's requirements (never torch itself) and each gpu package are installed under
    # the torch pin, one package per call; the project itself without resolving anything
    assert f"-c {constraints}" in installs[1] and " torch" not in installs[1]
    assert installs[2].startswith("pip install --no-deps -e .")
    gpu_calls = installs[3:]
    assert all(f"-c {constraints}" in call for call in gpu_calls)
    assert [call.split(f"-c {constraints} ")[1].split(" [")[0] for call in gpu_calls] == gpu_extra()
    assert "reusing" in result.stdout and "2.11.0+cu130" in result.stdout


def test_each_failing_gpu_package_is_one_line_and_the_rest_goes_on(gpu_box):
    failing = gpu_extra()[0].split(">")[0]
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_HOST_TORCH="2.11.0+cu130 13.0 1",
                           FAKE_PIP_FAIL=failing)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "gpu extra" in line]
    assert len(lines) == 1 and failing in lines[0] and "No matching distribution" in lines[0]
    for other in gpu_extra()[1:]:
        assert f"gpu extra: {other} installed" in result.stdout
    assert gpu_box.stamp                                               # setup still succeeded


def test_a_gpu_box_without_a_cuda_torch_takes_the_build_its_driver_supports(gpu_box):
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_DRIVER_CUDA="12.9",
                           FAKE_VENV_TORCH="2.13.0+cu128 12.8 1")
    assert result.returncode == 0, result.stderr
    assert f"venv {gpu_box.venv}" in gpu_box.calls
    torch_install = [call for call in gpu_box.pip_installs() if call.startswith("pip install torch")]
    assert torch_install == ["pip install torch==2.13.0 --index-url "
                             "https://download.pytorch.org/whl/cu128 [PIP_NO_INDEX=]"]


def test_a_chosen_spec_wins_over_the_containers_torch(gpu_box):
    result = gpu_box.setup(TORCH_SPEC="torch==2.12.0", TORCH_SPEC_ORIGIN="command line",
                           FAKE_HOST_TORCH="2.11.0+cu130 13.0 1", FAKE_VENV_TORCH="2.12.0+cu130 13.0 1")
    assert result.returncode == 0, result.stderr
    assert f"venv {gpu_box.venv}" in gpu_box.calls                       # not over the container
    assert any(call.startswith("pip install torch==2.12.0 --index-url "
                               "https://download.pytorch.org/whl/cu130") for call in gpu_box.calls)


def test_a_torch_that_cannot_see_the_gpu_fails_loudly_with_both_cuda_versions(gpu_box):
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_DRIVER_CUDA="12.8",
                           TORCH_INDEX_URL="https://download.pytorch.org/whl/cu130",
                           FAKE_VENV_TORCH="2.13.0+cu130 13.0 0")
    assert result.returncode == 3
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    for fact in ("NVIDIA H200", "580.159.04", "CUDA 12.8", "2.13.0+cu130", "CUDA 13.0",
                 "is_available", "smoke profile", "upgrade the driver"):
        assert fact in message, fact
    assert not (gpu_box.venv / ".fp4lab-installed").exists()           # retried next time


def test_a_driver_older_than_every_cuda_build_names_the_knobs(gpu_box):
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_DRIVER_CUDA="12.2")
    assert result.returncode == 4
    assert "CUDA 12.2" in result.stderr and "TORCH_INDEX_URL" in result.stderr
    assert not gpu_box.pip_installs()


def test_a_broken_driver_is_an_error_not_a_cpu_setup(gpu_box):
    result = gpu_box.setup(TORCH_SPEC_ORIGIN="file", FAKE_SMI_BROKEN="1")
    assert result.returncode == 4
    assert "couldn't communicate" in result.stderr and "SETUP_DEVICE=cpu" in result.stderr
    forced = gpu_box.setup(TORCH_SPEC_ORIGIN="file", SETUP_DEVICE="cpu")
    assert forced.returncode == 0 and "for the CPU" in forced.stdout


def test_the_stamp_reruns_setup_only_when_spec_index_or_pyproject_change(cpu_box):
    assert cpu_box.setup(TORCH_SPEC_ORIGIN="file").returncode == 0
    again = cpu_box.setup(TORCH_SPEC_ORIGIN="file")
    assert again.returncode == 0 and cpu_box.calls == []                # nothing to do
    index = "https://download.pytorch.org/whl/cpu"
    changed = cpu_box.setup(TORCH_SPEC_ORIGIN="file", TORCH_INDEX_URL=index)
    assert changed.returncode == 0
    # the torch of the old settings is taken out so that the new index decides its build
    assert "pip uninstall -y torch [PIP_NO_INDEX=]" in cpu_box.calls
    assert f"pip install torch==2.13.0 --index-url {index} [PIP_NO_INDEX=]" in cpu_box.calls
    assert f"index={index}" in cpu_box.stamp
    respec = cpu_box.setup(TORCH_SPEC_ORIGIN="file", TORCH_INDEX_URL=index, TORCH_SPEC="torch==2.12.0")
    assert respec.returncode == 0 and any("torch==2.12.0" in call for call in cpu_box.calls)


def test_offline_installs_reach_pip_through_its_own_variables(cpu_box):
    result = cpu_box.setup(TORCH_SPEC_ORIGIN="file", PIP_NO_INDEX="1", PIP_FIND_LINKS="/wheels")
    assert result.returncode == 0, result.stderr
    installs = cpu_box.pip_installs()
    assert all(call.endswith("[PIP_NO_INDEX=1]") for call in installs)
    # no index for an isolated build environment: the editable install builds with the venv's
    setuptools = next(i for i, call in enumerate(installs) if "setuptools>=68" in call)
    project = next(i for i, call in enumerate(installs) if "-e ." in call)
    assert setuptools < project and "--no-build-isolation" in installs[project]


def test_bad_setup_device_is_one_line_naming_it(cpu_box):
    result = cpu_box.setup(SETUP_DEVICE="tpu")
    assert result.returncode == 2 and "SETUP_DEVICE=tpu" in result.stderr


def test_the_probe_reports_this_interpreters_torch():
    line = subprocess.run([os.sys.executable, str(ROOT / "scripts" / "probe_torch.py")],
                          capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert line == [torch.__version__, torch.version.cuda or "-", str(int(torch.cuda.is_available()))]


def test_the_makefile_passes_every_setup_knob_to_the_script():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(STAMP): FORCE"):makefile.index("FORCE:\n")]
    for knob in ("PYTHON", "VENV", "TORCH_SPEC", "TORCH_SPEC_ORIGIN", "TORCH_INDEX_URL", "SETUP_DEVICE"):
        assert f'{knob}="$(' in recipe, knob
    assert '$(origin TORCH_SPEC)' in recipe
