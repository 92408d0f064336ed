"""Fault drill on the GPU: do misbehaving backends, SIGTERM and kill -9 leave the GPU free and the
run folder whole? (issue 11; the CPU tests prove the same with no GPU to hold.)

    PYTHONPATH=src:tests python benchmarks/fault_drill.py            # on the H200, writes $OUT
    PYTHONPATH=src:tests python benchmarks/fault_drill.py --device cpu --out /tmp/drill   # anywhere
    (--cases A or --cases BCD runs one part; BCD alone measures its own ceilings)

Needs torch and the repository only (no carried wheels, no papermill); the fake backends come
from tests/fakes (FP4LAB_EXTRA_BACKENDS). Every step runs `python -m fp4lab sweep` as a user would,
under its own timeout; the drill stops at DEADLINE_S whatever happens. Cases:
  A  one sweep over fake-ok, fake-wrong, fake-crash (os._exit at M=4), fake-hang (M=4 never
     returns; point timeout), fake-oom (asks for twice the GPU at M=4): one row per point with
     the right status, exit 0, and afterwards no process of the sweep on the GPU, memory back;
  B  a slowed sweep; a second sweep on the same run id is refused in one line naming the holder;
     SIGTERM: exit 130, status `interrupted`, its workers gone, memory back;
  C  the same run resumed, then kill -9 of the sweep: its workers die with it (PR_SET_PDEATHSIG),
     memory back;
  D  its last row cut in half (a kill mid-write), then --resume: exactly the grid's rows, each
     once, no bad line, status `complete`.
Writes under OUT: summary.txt (the table printed last), drill.json (every check), the two run
folders' gemm.jsonl and run.json, and stderr.txt (each step's last stderr lines).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEADLINE_S = 480.0
MEMORY_SLACK_MIB = 512           # device memory "back to where it was": within this
M_VALUES = "1,2,4,8,16,32,64,128"
SLOW = {"cuda": "20000", "cpu": "3000"}     # fake-slow's GEMMs per call: about a second per point
POINT_TIMEOUT_S = {"cuda": "10", "cpu": "6"}  # fake-hang's point: CUDA start-up is not in it;
                                             # 3 s was too short for a worker of a busy 16-core box
STARTED = time.monotonic()


def left() -> float:
    return DEADLINE_S - (time.monotonic() - STARTED)


class Drill:
    def __init__(self, device: str, out: Path, work: Path):
        self.device, self.out, self.work = device, out, work
        self.checks: list[dict] = []
        self.stderr: list[str] = []
        root = Path(__file__).resolve().parents[1]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "tests")]),
                    "FP4LAB_EXTRA_BACKENDS": "fakes.backends,fakes.gpu_faults", "FP4LAB_RUNS_DIR": str(work),
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("FP4LAB_RUN_LOCK", None)
        self.grid = ["--profile", "smoke", "--device", device, "--format", "nvfp4", "--shapes", "256x512",
                     "--repeats", "3", "--quiet", "--out", str(work)]

    # -- recording --------------------------------------------------------------------------------
    def check(self, case: str, what: str, ok: bool, got) -> bool:
        self.checks.append({"case": case, "check": what, "ok": bool(ok), "got": str(got)[:300]})
        return ok

    def sweep(self, *args: str, slow: str | None = None) -> subprocess.Popen:
        env = {**self.env, **({"FAKE_SLOWDOWN": slow} if slow else {})}
        return subprocess.Popen([sys.executable, "-m", "fp4lab", "sweep", *args], cwd=self.work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, proc: subprocess.Popen, label: str, timeout: float) -> tuple[int | None, str]:
        try:
            _, err = proc.communicate(timeout=max(1.0, min(timeout, left())))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += f"\n(drill: killed after {timeout:g} s)"
            self.stderr.append(f"== {label}\n" + "\n".join(err.strip().splitlines()[-15:]))
            return None, err
        self.stderr.append(f"== {label} (exit {proc.returncode})\n" + "\n".join(err.strip().splitlines()[-15:]))
        return proc.returncode, err

    # -- the GPU -----------------------------------------------------------------------------------
    def memory_used_mib(self) -> float | None:
        if self.device == "cpu":
            return None
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                   "-i", "0"], capture_output=True, text=True, timeout=20)
            return float(done.stdout.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def gpu_pids(self) -> set[int]:
        if self.device == "cpu":
            return set()
        try:
            done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return set()
        return {int(line) for line in done.stdout.split() if line.strip().isdigit()}

    def gpu_is_free(self, case: str, baseline: float | None, pids: set[int], settle_s: float = 15.0) -> None:
        """No process of the case left on the GPU, and its memory back (within the slack)."""
        deadline = time.monotonic() + settle_s
        while True:
            used, held = self.memory_used_mib(), (self.gpu_pids() & pids) | {p for p in pids if alive(p)}
            back = used is None or baseline is None or used <= baseline + MEMORY_SLACK_MIB
            if (back and not held) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.check(case, "no process of it left (alive or on the GPU)", not held, sorted(held) or "none")
        self.check(case, f"GPU memory back within {MEMORY_SLACK_MIB} MiB", back,
                   "n/a (no GPU)" if used is None or baseline is None else f"{used:.0f} MiB, before {baseline:.0f} MiB")

    # -- the cases ---------------------------------------------------------------------------------
    def case_a(self) -> Path:
        run = self.work / "drill-a"
        baseline = self.memory_used_mib()
        proc = self.sweep(*self.grid, "--backends", "fake-ok,fake-wrong,fake-crash,fake-hang,fake-oom",
                          "--m", "1,4,16", "--point-timeout", POINT_TIMEOUT_S[self.device], "--run-id", "drill-a")
        pids = {proc.pid}
        watch = Watch(proc.pid)
        code, err = self.finish(proc, "A: misbehaving backends", 300)
        pids |= watch.stop()
        self.check("A", "exit 0", code == 0, code)
        rows = read_rows(run)
        status = {(r["backend"], r["m"]): r["status"] for r in rows}
        expected = {("fake-ok", m): "ok" for m in (1, 4, 16)}
        expected.update({("fake-wrong", m): "wrong_result" for m in (1, 4, 16)})
        for name, bad in (("fake-crash", "error"), ("fake-hang", "timeout"), ("fake-oom", "oom")):
            expected.update({(name, 1): "ok", (name, 4): bad, (name, 16): "ok"})
        self.check("A", "15 rows, one per point", len(rows) == 15 and len(status) == 15, len(rows))
        wrong = {f"{b} M={m}": f"{status.get((b, m))} (want {s})" for (b, m), s in expected.items()
                 if status.get((b, m)) != s}
        self.check("A", "each row's status", not wrong, wrong or "all as expected")
        oom = next((r for r in rows if r["backend"] == "fake-oom" and r["m"] == 4), {})
        self.check("A", "the oom row says out of memory", "out of memory" in str(oom.get("error", "")).lower(),
                   oom.get("error"))
        self.gpu_is_free("A", baseline, pids)
        return run

    def case_bcd(self, ceilings_from: Path) -> None:
        run = self.work / "drill-b"
        run.mkdir(parents=True, exist_ok=True)
        ceilings = ((json.loads((ceilings_from / "run.json").read_text()).get("sweep") or {}).get("ceilings")
                    if (ceilings_from / "run.json").exists() else None)
        if ceilings:                               # measured once, in case A
            (run / "run.json").write_text(json.dumps({"run_id": "drill-b", "created": now(),
                                                      "sweep": {"ceilings": ceilings}}))
        baseline = self.memory_used_mib()
        slow = SLOW[self.device]
        proc = self.sweep(*self.grid, "--backends", "fake-slow", "--m", M_VALUES, "--run-id", "drill-b",
                          slow=slow)
        watch = Watch(proc.pid)
        if not wait_for(lambda: rows_in(run) >= 2 or proc.poll() is not None, 240):
            self.check("B", "two rows within 240 s", False, rows_in(run))
        second = self.sweep(*self.grid, "--backends", "fake-slow", "--m", M_VALUES, "--run-id", "drill-b")
        code, err = self.finish(second, "B: a second writer", 60)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        self.check("B", "a second writer: exit 2, one line naming the holder",
                   code == 2 and len(lines) == 1 and f"pid {proc.pid}" in lines[0], lines[-1:] or code)
        workers = watch.stop()
        proc.send_signal(signal.SIGTERM)
        code, err = self.finish(proc, "B: SIGTERM", 60)
        self.check("B", "SIGTERM: exit 130, says --resume", code == 130 and "--resume" in err, code)
        self.check("B", "status interrupted", run_status(run) == "interrupted", run_status(run))
        self.check("B", "a worker was running when signalled", bool(workers), sorted(workers))
        self.gpu_is_free("B", baseline, workers | {proc.pid})

        before = rows_in(run)
        proc = self.sweep("--resume", str(run), "--quiet", slow=slow)
        watch = Watch(proc.pid)
        wait_for(lambda: rows_in(run) > before or proc.poll() is not None, 240)
        workers = watch.stop()
        proc.send_signal(signal.SIGKILL)
        self.finish(proc, "C: kill -9", 30)
        self.check("C", "a worker was running when killed", bool(workers), sorted(workers))
        self.check("C", "status left running (what kill -9 leaves)", run_status(run) == "running", run_status(run))
        self.gpu_is_free("C", baseline, workers | {proc.pid})

        log = run / "gemm.jsonl"
        lines = log.read_bytes().splitlines(keepends=True)
        log.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
        proc = self.sweep("--resume", str(run), "--quiet")
        code, err = self.finish(proc, "D: resume after a half-written line", 240)
        rows = read_rows(run)
        keys = [(r["backend"], r["fmt"], r["n"], r["k"], r["m"], r.get("gpu_index")) for r in rows]
        self.check("D", "exit 0, the partial line cut", code == 0 and "cut a partial last line" in err, code)
        self.check("D", "8 rows, each point once, none skipped",
                   len(keys) == len(set(keys)) == 8 and rows_in(run) == 8, f"{len(keys)} rows, {len(set(keys))} keys")
        self.check("D", "status complete", run_status(run) == "complete", run_status(run))

    # -- the record --------------------------------------------------------------------------------
    def write(self) -> str:
        width = max([len(c["check"]) for c in self.checks] + [10])
        lines = [f"fault drill on {self.device}: {sum(c['ok'] for c in self.checks)} of {len(self.checks)} "
                 f"checks passed in {time.monotonic() - STARTED:.0f} s",
                 f"{'case':<4} {'check':<{width}} {'result':<6} got"]
        lines += [f"{c['case']:<4} {c['check']:<{width}} {'PASS' if c['ok'] else 'FAIL':<6} {c['got'][:90]}"
                  for c in self.checks]
        summary = "\n".join(lines) + "\n"
        (self.out / "summary.txt").write_text(summary)
        (self.out / "drill.json").write_text(json.dumps(self.checks, indent=1))
        (self.out / "stderr.txt").write_text("\n".join(self.stderr)[-4_000_000:])
        for name in ("drill-a", "drill-b"):
            for table in ("gemm.jsonl", "run.json"):
                if (self.work / name / table).exists():
                    shutil.copy(self.work / name / table, self.out / f"{name}-{table}")
        return summary


class Watch:
    """Collects the sweep's worker pids while it runs (they come and go: one per backend)."""

    def __init__(self, pid: int):
        import threading

        self.pid, self.pids, self._stop = pid, set(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.pids |= set(children(self.pid))

    def stop(self) -> set[int]:
        self.pids |= set(children(self.pid))
        self._stop.set()
        self.thread.join()
        return set(self.pids)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + min(timeout, max(1.0, left()))
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def rows_in(run: Path) -> int:
    log = run / "gemm.jsonl"
    return log.read_bytes().count(b"\n") if log.exists() else 0


def read_rows(run: Path) -> list[dict]:
    log = run / "gemm.jsonl"
    rows = []
    for line in (log.read_bytes().splitlines() if log.exists() else []):
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def run_status(run: Path) -> str | None:
    try:
        return (json.loads((run / "run.json").read_text()).get("sweep") or {}).get("status")
    except (OSError, ValueError):
        return None


def now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where results go (default: $OUT)")
    parser.add_argument("--cases", default="A,BCD", help="A (misbehaving backends), BCD (signals, kill, "
                                                          "resume) or both (default)")
    args = parser.parse_args()
    if not args.out:
        parser.error("give --out or set OUT")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fp4lab-drill-"))
    drill = Drill(args.device, out, work)
    try:
        cases = {"A": drill.case_a, "BCD": lambda: drill.case_bcd(work / "drill-a")}
        for name in args.cases.split(","):
            case = cases[name]
            if left() < 60:
                drill.check("-", "time left for the next case", False, f"{left():.0f} s")
                break
            try:
                case()
            except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others' record
                drill.check("-", "the case ran to its end", False, f"{type(exc).__name__}: {exc}")
    finally:
        print(drill.write())
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(c["ok"] for c in drill.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
