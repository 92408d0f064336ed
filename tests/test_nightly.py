"""scripts/nightly.sh: the report's exit status reaches the caller (not make's 2), setup failures are
4, the runs folder is the one given, and the book and share file are published when a book exists.

Runs in a copy of the checkout's scripts and Makefile whose venv is set up already (a matching
stamp) and whose python is a fake that plays `fp4lab report` / `fp4lab share`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$3" in
  report) mkdir -p book/_build/html && echo book > book/_build/html/index.html; exit "$FAKE_REPORT_STATUS" ;;
  share)  [ "$FAKE_SHARE_STATUS" = 0 ] || exit "$FAKE_SHARE_STATUS"
          mkdir -p share && echo diagnosis > "share/$5-diagnosis.html" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of what nightly.sh uses, with a venv that setup_env.sh finds set up."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "scripts/setup_env.sh", "scripts/nightly.sh"):
        shutil.copy2(CHECKOUT / name, root / name)
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".fp4lab-installed").write_text(f"spec=torch==2.13.0\nindex=\ndevice=auto\npyproject={digest}\n")
    return root


def nightly(checkout: Path, report_status: int = 0, share_status: int = 0, **env: str):
    log = checkout / "calls.log"
    environment = {**{k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "TORCH_INDEX_URL", "SETUP_DEVICE")},
                   "FAKE_LOG": str(log), "FAKE_REPORT_STATUS": str(report_status),
                   "FAKE_SHARE_STATUS": str(share_status), "RUN_ID": "20260101T020000Z-nightly", **env}
    done = subprocess.run(["bash", "scripts/nightly.sh"], cwd=checkout, env=environment, capture_output=True,
                          text=True, timeout=60)
    return done, (log.read_text().splitlines() if log.exists() else [])


@pytest.mark.parametrize("report_status", [0, 1, 3])
def test_the_report_status_is_the_exit_status_and_the_book_is_published(checkout, tmp_path, report_status):
    publish = tmp_path / "www"
    done, calls = nightly(checkout, report_status, RUNS_DIR="/srv/fp4lab/runs", PUBLISH_DIR=str(publish))
    assert done.returncode == report_status, done.stdout + done.stderr
    assert calls == [
        "-m fp4lab report --profile auto --runs-dir /srv/fp4lab/runs --run-id 20260101T020000Z-nightly",
        "-m fp4lab share --run-id 20260101T020000Z-nightly --runs-dir /srv/fp4lab/runs --out-dir share"]
    assert (publish / "book" / "index.html").read_text() == "book\n"
    assert (publish / "share" / "20260101T020000Z-nightly-diagnosis.html").exists()


def test_bad_arguments_publish_nothing(checkout, tmp_path):
    done, calls = nightly(checkout, report_status=2, PUBLISH_DIR=str(tmp_path / "www"))
    assert done.returncode == 2
    assert len(calls) == 1 and not (tmp_path / "www").exists()


def test_a_failed_share_file_fails_a_good_night(checkout, tmp_path):
    done, _ = nightly(checkout, report_status=0, share_status=1, PUBLISH_DIR=str(tmp_path / "www"))
    assert done.returncode == 1
    assert "publishing the book or the share file failed" in done.stderr


def test_setup_failure_is_4_and_runs_nothing(checkout):
    done, calls = nightly(checkout, SETUP_DEVICE="tpu")
    assert done.returncode == 4 and calls == []
    assert "SETUP_DEVICE=tpu" in done.stderr and "setup failed: exit status 4" in done.stderr
