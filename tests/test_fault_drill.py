"""benchmarks/fault_drill.py, the GPU fault drill, on this CPU (no GPU to hold, so its memory
checks say n/a): its case A (misbehaving backends, an OOM) passes, the summary table comes last,
the files land in OUT. Cases B-D (second writer, SIGTERM, kill -9, resume) repeat what
tests/test_faults.py proves; the whole drill passed here too (19 of 19 checks, 35 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTS_DIR

SCRIPT = TESTS_DIR.parent / "benchmarks" / "fault_drill.py"


@pytest.mark.slow
def test_the_fault_drill_passes_on_a_cpu(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "FP4LAB_RUN_LOCK"}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS_DIR.parent / "src"), str(TESTS_DIR)]), OUT=str(tmp_path / "out"))
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "A"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=400)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    checks = json.loads((tmp_path / "out" / "drill.json").read_text())
    assert len(checks) == 6 and all(check["ok"] for check in checks)
    assert {check["case"] for check in checks} == {"A"}
    assert done.stdout.rstrip().endswith(summary.rstrip().splitlines()[-1])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "drill-a-gemm.jsonl", "drill-a-run.json", "drill.json", "stderr.txt", "summary.txt"]
