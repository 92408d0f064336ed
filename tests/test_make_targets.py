"""The Makefile's lab and browser-check recipes, without running JupyterLab, apt-get or pip:
`make -n` under a fake `id`, and scripts/browser_setup.sh with fake apt-get, sudo and venv python."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
FAKE_ID = "#!/bin/sh\necho {uid}\n"
# records its arguments; `apt-get install` also puts the browser where the check looks
FAKE_APT = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
case "$*" in *install*) touch "$CHROMIUM" "$CHROMEDRIVER"; chmod +x "$CHROMIUM" "$CHROMEDRIVER";; esac
"""
FAKE_SUDO = '#!/bin/sh\necho "sudo $1" >> "$FAKE_LOG"\nexec "$@"\n'
# `python -c "import selenium"` answers $FAKE_SELENIUM; anything else (pip) is recorded
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-c" ]; then exit "$FAKE_SELENIUM"; fi
echo "python $*" >> "$FAKE_LOG"
"""


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_bin(tmp_path: Path, uid: int, sudo: bool = False) -> Path:
    """A folder of fakes to put first on PATH: `id -u` says uid; apt-get (and sudo) are recorded."""
    folder = tmp_path / "bin"
    executable(folder / "id", FAKE_ID.format(uid=uid))
    executable(folder / "apt-get", FAKE_APT)
    if sudo:
        executable(folder / "sudo", FAKE_SUDO)
    return folder


# -- make lab ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("uid, allow_root", [(0, True), (1000, False)])
def test_lab_passes_allow_root_exactly_when_root(tmp_path, uid, allow_root):
    env = {**os.environ, "PATH": f"{fake_bin(tmp_path, uid)}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["make", "-n", "lab", f"VENV={tmp_path / 'venv'}"], cwd=CHECKOUT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    launch = [line for line in done.stdout.splitlines() if "jupyter lab" in line]
    assert len(launch) == 1, done.stdout
    assert ("--allow-root" in launch[0].split()) is allow_root
    assert "--notebook-dir=notebooks" in launch[0]
    assert '-e ".[lab]"' in done.stdout                      # JupyterLab comes from the lab extra


def test_setup_registers_the_fp4lab_kernel():
    setup = (CHECKOUT / "scripts" / "setup_env.sh").read_text()
    assert "ipykernel install --sys-prefix --name fp4lab" in setup


# -- make browser-check's setup ---------------------------------------------------------------------

def browser_setup(tmp_path: Path, uid: int, browser_present: bool, selenium_present: bool,
                  sudo: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run scripts/browser_setup.sh against fakes; returns the run and the commands it ran."""
    chromium, driver = tmp_path / "usr" / "chromium", tmp_path / "usr" / "chromedriver"
    chromium.parent.mkdir()
    if browser_present:
        executable(chromium, "#!/bin/sh\n")
        executable(driver, "#!/bin/sh\n")
    venv = tmp_path / "venv"
    executable(venv / "bin" / "python", FAKE_PYTHON)
    log = tmp_path / "commands.log"
    log.touch()
    env = {**os.environ, "VENV": str(venv), "CHROMIUM": str(chromium), "CHROMEDRIVER": str(driver),
           "FAKE_LOG": str(log), "FAKE_SELENIUM": "0" if selenium_present else "1",
           "PATH": f"{fake_bin(tmp_path, uid, sudo)}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(CHECKOUT / "scripts" / "browser_setup.sh")], cwd=CHECKOUT, env=env,
                          capture_output=True, text=True, timeout=30)
    return done, log.read_text().splitlines()


def test_browser_setup_installs_nothing_that_is_there(tmp_path):
    done, commands = browser_setup(tmp_path, uid=0, browser_present=True, selenium_present=True)
    assert done.returncode == 0, done.stderr
    assert commands == []
    assert "chromium and chromedriver present" in done.stdout and "selenium present" in done.stdout


def test_browser_setup_installs_chromium_when_missing_and_says_so(tmp_path):
    done, commands = browser_setup(tmp_path, uid=0, browser_present=False, selenium_present=True)
    assert done.returncode == 0, done.stderr
    assert commands == ["apt-get update -qq", "apt-get install -y -qq chromium chromium-driver"]
    assert "installing Debian's chromium and chromium-driver with apt-get" in done.stdout


def test_browser_setup_uses_sudo_when_not_root(tmp_path):
    done, commands = browser_setup(tmp_path, uid=1000, browser_present=False, selenium_present=True, sudo=True)
    assert done.returncode == 0, done.stderr
    assert commands == ["sudo apt-get", "apt-get update -qq", "sudo apt-get",
                        "apt-get install -y -qq chromium chromium-driver"]


def test_browser_setup_without_root_or_sudo_fails_with_setup_status(tmp_path):
    if shutil.which("sudo"):
        pytest.skip("this machine has a real sudo on PATH")
    done, commands = browser_setup(tmp_path, uid=1000, browser_present=False, selenium_present=True)
    assert done.returncode == 4 and commands == []
    assert "run as root (or with sudo)" in done.stderr


def test_browser_setup_installs_the_browser_extra_when_selenium_is_missing(tmp_path):
    done, commands = browser_setup(tmp_path, uid=0, browser_present=True, selenium_present=False)
    assert done.returncode == 0, done.stderr
    assert len(commands) == 1 and commands[0].endswith('install -e .[browser]')
    assert "installing the browser extra (selenium)" in done.stdout
