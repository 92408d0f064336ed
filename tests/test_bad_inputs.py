"""Bad input is one line, never a traceback, and nothing half-written (issue 11, defect 5 and the
rest of its list): a table of bad flags, corrupt run folders and bad chapter parameters.

CLI cases run as `python -m fp4lab ARGS` runs them (fp4lab.cli.main, cwd elsewhere, the runs
folder from FP4LAB_RUNS_DIR), all in one driver process (tests/fakes/cli_driver.py) so torch is
imported once; a sample also runs as real `python -m fp4lab` processes to show they agree. Each
case: a non-zero exit, exactly one `fp4lab: error:` line on stderr naming the value or the file
(cut when long), no traceback, and no file created, changed or removed. Chapter parameters go
through each chapter module's build(): a ParameterError naming the parameter, never a TypeError,
and the run folder untouched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import TESTS_DIR
from fp4lab.chapters import CHAPTERS
from fp4lab.errors import ParameterError
from fp4lab.results import RunDir

SRC = TESTS_DIR.parent / "src"
LONG = "9" * 10_000
GOOD_CONFIG = {"backends": ["torch-bf16"], "fmts": ["nvfp4"], "m_values": [1], "shapes": [[32, 64]],
               "timer": {"repeats": 3}, "energy_window_s": 0.0, "telemetry_hz": 20.0, "point_timeout_s": 60.0,
               "device": "cpu", "profile": "smoke", "seed": 0}
RUN_JSON = {   # run folders under the runs folder, by name: their run.json
    "truncated": b'{"run_id": "truncated", "created": "2026-12-01T00:0',
    "listed": b'[{"run_id": "listed"}]',
    "typed": b'{"run_id": "typed", "created": 20261201}',
    "device-list": b'{"run_id": "device-list", "provenance": {"device": ["NVIDIA H200"]}}',
    "section-string": b'{"run_id": "section-string", "sweep": "complete"}',
    "no-config": b'{"run_id": "no-config", "created": "2026-12-01T00:00:00+00:00"}',
    "config-list": json.dumps({"sweep": {"config": [1, 2]}}).encode(),
    "config-unknown": json.dumps({"sweep": {"config": {**GOOD_CONFIG, "repeats": 30}}}).encode(),
    "config-missing": json.dumps({"sweep": {"config": {"fmts": ["nvfp4"]}}}).encode(),
    "config-timer": json.dumps({"sweep": {"config": {**GOOD_CONFIG, "timer": {"min_clock_ratio": "fast"}}}}).encode(),
    "config-value": json.dumps({"sweep": {"config": {**GOOD_CONFIG, "m_values": "1,2"}}}).encode(),
    "config-number": json.dumps({"sweep": {"config": {**GOOD_CONFIG, "m_values": 8}}}).encode(),
    "config-nan": b'{"sweep": {"config": {"energy_window_s": NaN}}}',
    "locked": json.dumps({"run_id": "locked", "sweep": {"config": GOOD_CONFIG}}).encode(),
}
HOLDER = textwrap.dedent("""
    import sys, time
    from fp4lab.results import RunDir
    with RunDir(sys.argv[1]).lock("a sweep that holds it"):
        print("held", flush=True)
        time.sleep(120)
""")

# (id, argv, exit status, a fragment the one error line must hold); {runs} and {tmp} are folders
CLI_CASES = [
    # sweep: every flag, up front
    ("m zero", "sweep --m 0", 2, "--m[0]=0"),
    ("m text", "sweep --m abc", 2, "--m='abc'"),
    ("m empty", ["sweep", "--m", ""], 2, "--m=[]"),
    ("m fraction", "sweep --m 1.5", 2, "--m='1.5'"),
    ("m huge value cut", ["sweep", "--m", LONG], 2, "--m='99999"),
    ("shapes half", "sweep --shapes 4x", 2, "--shapes='4x'"),
    ("shapes K not a block", "sweep --shapes 32x30", 2, "K=30"),
    ("shapes zero", "sweep --shapes 0x64", 2, "shapes[0][0]=0"),
    ("shapes empty", ["sweep", "--shapes", ""], 2, "shapes=[]"),
    ("format unknown", "sweep --format fp3", 2, "fmts[0]='fp3'"),
    ("format empty", ["sweep", "--format", ""], 2, "--format=''"),
    ("backend unknown", "sweep --backends nope", 2, "backends[0]='nope'"),
    ("backend markup", ["sweep", "--backends", "<svg onload=alert(1)>"], 2, "backends[0]='<svg onload"),
    ("backends empty", ["sweep", "--backends", " , "], 2, "--backends=' , '"),
    ("repeats zero", "sweep --repeats 0", 2, "--repeats=0"),
    ("repeats text", "sweep --repeats x", 2, "invalid int value: 'x'"),
    ("burst zero", "sweep --max-burst-ms 0", 2, "--max-burst-ms=0"),
    ("burst nan", "sweep --max-burst-ms nan", 2, "--max-burst-ms=nan"),
    ("energy nan", "sweep --energy-window nan", 2, "energy_window_s=nan"),
    ("energy negative", "sweep --energy-window -1", 2, "energy_window_s=-1.0"),
    ("energy infinite", "sweep --energy-window inf", 2, "energy_window_s=inf"),
    ("timeout zero", "sweep --point-timeout 0", 2, "point_timeout_s=0.0"),
    ("timeout absurd", "sweep --point-timeout 1e9", 2, "point_timeout_s=1000000000.0"),
    ("profile unknown", "sweep --profile bogus", 2, "profile='bogus'"),
    ("device unknown", "sweep --device tpu", 2, "device 'tpu'"),
    ("device absent", "sweep --device cuda:99", 2, "cuda:99"),
    ("preset unknown", "sweep --preset nope", 2, "preset 'nope'"),
    ("run id newline", ["sweep", "--run-id", "ok\n"], 2, "--run-id='ok\\n'"),
    ("run id escapes", "sweep --run-id ../escape", 2, "--run-id='../escape'"),
    ("run id empty", ["sweep", "--run-id", ""], 2, "--run-id=''"),
    ("out empty", ["sweep", "--out", ""], 2, "--out=''"),
    ("out a file", "sweep --backends torch-bf16 --m 1 --shapes 32x64 --out {tmp}/a-file", 2, "a-file"),
    ("unknown flag", "sweep --bogus", 2, "unrecognized arguments: --bogus"),
    # sweep --resume: the run folder checked when opened, naming the file
    ("resume a file", "sweep --resume {tmp}/a-file", 2, "a-file is not a run folder"),
    ("resume no folder", "sweep --resume {tmp}/missing", 2, "missing is not a run folder"),
    ("resume truncated", "sweep --resume {runs}/truncated", 2, "truncated/run.json: not readable JSON"),
    ("resume a list", "sweep --resume {runs}/listed", 2, "listed/run.json: expected a JSON object, found list"),
    ("resume created typed", "sweep --resume {runs}/typed", 2, "typed/run.json: field 'created' must be a string"),
    ("resume device a list", "sweep --resume {runs}/device-list", 2, "field 'provenance.device' must be an object"),
    ("resume section typed", "sweep --resume {runs}/section-string", 2, "field 'sweep' must be an object"),
    ("resume no config", "sweep --resume {runs}/no-config", 2, "no-config has no stored sweep configuration"),
    ("resume config a list", "sweep --resume {runs}/config-list", 2, "field 'sweep.config' must be an object"),
    ("resume config unknown", "sweep --resume {runs}/config-unknown", 2, "unknown setting 'repeats'"),
    ("resume config missing", "sweep --resume {runs}/config-missing", 2, "missing setting 'backends'"),
    ("resume timer typed", "sweep --resume {runs}/config-timer", 2, "timer:"),
    ("resume m a string", "sweep --resume {runs}/config-value", 2, "m_values='1,2': expected a list"),
    ("resume m a number", "sweep --resume {runs}/config-number", 2, "m_values=8: expected a list"),
    ("resume NaN", "sweep --resume {runs}/config-nan", 2, "config-nan/run.json: not readable JSON (ValueError: NaN"),
    ("resume locked", "sweep --resume {runs}/locked", 2, "run locked is being written by pid"),
    ("resume and a grid flag", "sweep --resume {runs}/locked --m 1", 2, "it takes no --m"),
    ("resume and a device", "sweep --resume {runs}/locked --device cpu", 2, "it takes no --device"),
    # moe-sweep
    ("moe profile", "moe-sweep --profile bogus", 2, "profile='bogus'"),
    ("moe batch zero", "moe-sweep --batch 0", 2, "batch_sizes[0]=0"),
    ("moe batch text", "moe-sweep --batch x", 2, "invalid int value: 'x'"),
    ("moe ep uneven", "moe-sweep --ep 3", 2, "do not split evenly over 3 ranks"),
    ("moe routing", "moe-sweep --routing zipf:x", 2, "zipf:x"),
    ("moe trace missing", "moe-sweep --routing trace:{tmp}/missing.npy", 2, "missing.npy: no such file"),
    ("moe trace garbage", "moe-sweep --routing trace:{tmp}/a-file", 2, "a-file: not a readable .npy"),
    ("moe method", "moe-sweep --methods nope", 2, "methods[0]='nope'"),
    ("moe format", "moe-sweep --fmts fp3", 2, "fmts[0]='fp3'"),
    ("moe steps", "moe-sweep --steps 0", 2, "steps=0"),
    ("moe repeats", "moe-sweep --repeats 0", 2, "repeats"),
    ("moe burst negative", "moe-sweep --max-burst-ms -5", 2, "--max-burst-ms=-5"),
    ("moe timeout nan", "moe-sweep --point-timeout nan", 2, "point_timeout_s=nan"),
    ("moe preset", "moe-sweep --preset nope", 2, "preset 'nope'"),
    ("moe run id", "moe-sweep --run-id bad/id", 2, "--run-id='bad/id'"),
    ("moe into a corrupt run", "moe-sweep --run-id truncated", 2, "truncated/run.json: not readable JSON"),
    # moe-stats
    ("stats experts zero", "moe-stats --experts 0 --top-k 1 --batch 1", 2, "--experts=0"),
    ("stats top-k too big", "moe-stats --experts 8 --top-k 9 --batch 1", 2, "top_k=9 exceeds experts=8"),
    ("stats seed negative", "moe-stats --experts 8 --top-k 2 --batch 4 --seed -1", 2, "--seed=-1"),
    ("stats steps zero", "moe-stats --experts 8 --top-k 2 --batch 4 --steps 0", 2, "--steps=0"),
    ("stats trace garbage", "moe-stats --experts 8 --top-k 2 --batch 4 --routing trace:{tmp}/a-file", 2, "a-file"),
    ("stats batch text", "moe-stats --experts 8 --top-k 2 --batch many", 2, "invalid int value: 'many'"),
    # report
    ("report profile", "report --profile bogus", 2, "profile='bogus'"),
    ("report run id", ["report", "--run-id", "x y"], 2, "--run-id='x y'"),
    ("report run id empty", ["report", "--run-id", ""], 2, "--run-id=''"),
    ("report device", "report --device tpu", 2, "device 'tpu'"),
    ("report reference missing", "report --reference-dir {tmp}/missing", 2, "missing is not a run folder"),
    ("report reference corrupt", "report --reference-dir {runs}/truncated", 2, "truncated/run.json"),
    ("report reference no gemm", "report --reference-dir {runs}/no-config", 2, "has no gemm table"),
    ("report notebook missing", "report --notebooks {tmp}/missing.ipynb", 2, "missing.ipynb"),
    ("report runs dir a file", "report --runs-dir {tmp}/a-file", 2, "a-file"),
    ("report run locked", "report --run-id locked", 2, "run locked is being written by pid"),
    # share, runs, the rest
    ("share run id escapes", "share --run-id ../x", 2, "run_id='../x'"),
    ("share run id unknown", "share --run-id nope", 2, "run_id='nope': no such run"),
    ("share run corrupt", "share --run-id truncated", 2, "truncated/run.json"),
    ("share out-dir a file", "share --run-id no-config --out-dir {tmp}/a-file", 1, "a-file: File exists"),
    ("runs missing root", "runs {tmp}/missing", 2, "missing' is not a folder"),
    ("runs a file", "runs {tmp}/a-file", 2, "a-file' is not a folder"),
    ("backends device", "backends --device tpu", 2, "device 'tpu'"),
    ("smem-fit gpu", "smem-fit --gpu nope", 2, "unknown GPU nope"),
    ("project gpu", "project --preset glm-5 --batch 64 --gpu nope", 2, "unknown GPU nope"),
    ("comm ops", "comm --ops nope", 2, "--ops: unknown nope"),
    ("comm profile", "comm --profile bogus", 2, "--profile must be one of"),
    ("comm tokens", "comm --tokens 0", 2, "--tokens"),
    ("no command", [], 2, "the following arguments are required: command"),
    ("unknown command", "explode", 2, "invalid choice: 'explode'"),
]
REAL_PROCESS = ["m zero", "resume truncated", "resume locked", "moe profile", "share run corrupt", "no command"]


def argv_of(spec, folders: dict[str, Path]) -> list[str]:
    if isinstance(spec, list):
        return spec
    return [part.format(**folders) for part in spec.split()]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The runs folder with corrupt and locked run folders, a file where folders go, an
    elsewhere to start from, and the holder of the locked run."""
    tmp = tmp_path_factory.mktemp("bad-inputs")
    runs = tmp / "runs"
    for name, content in RUN_JSON.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "run.json").write_bytes(content)
    (tmp / "a-file").write_text("not a folder, not a trace\n")
    (tmp / "elsewhere").mkdir()
    env = {key: value for key, value in os.environ.items() if key != "FP4LAB_RUN_LOCK"}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(SRC)]), FP4LAB_RUNS_DIR=str(runs))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(runs / "locked")], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    yield {"tmp": tmp, "runs": runs, "env": env, "holder": holder}
    holder.kill()
    holder.wait()


@pytest.fixture(scope="module")
def cli_results(world):
    folders = {"tmp": world["tmp"], "runs": world["runs"]}
    request = {"cases": [argv_of(spec, folders) for _, spec, _, _ in CLI_CASES],
               "watched": [str(world["tmp"])]}
    done = subprocess.run([sys.executable, "-m", "fakes.cli_driver"], input=json.dumps(request), text=True,
                          capture_output=True, cwd=world["tmp"] / "elsewhere", env=world["env"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip([case[0] for case in CLI_CASES], json.loads(done.stdout)))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("name, spec, status, fragment", CLI_CASES, ids=[case[0] for case in CLI_CASES])
def test_a_bad_flag_or_file_is_one_line_and_nothing_written(cli_results, world, name, spec, status, fragment):
    result = cli_results[name]
    assert result["traceback"] is None, result["traceback"]
    assert "Traceback" not in result["stderr"]
    lines = error_lines(result["stderr"])
    assert result["code"] == status and len(lines) == 1, result["stderr"]
    assert lines[0].startswith("fp4lab: error: ") and len(lines[0]) <= 520
    assert fragment in lines[0]
    assert result["changed"] == [], result["changed"]


@pytest.mark.parametrize("name", REAL_PROCESS)
def test_real_processes_say_the_same(cli_results, world, name):
    spec = next(case[1] for case in CLI_CASES if case[0] == name)
    argv = argv_of(spec, {"tmp": world["tmp"], "runs": world["runs"]})
    done = subprocess.run([sys.executable, "-m", "fp4lab", *argv], capture_output=True, text=True,
                          cwd=world["tmp"] / "elsewhere", env=world["env"], timeout=120)
    assert (done.returncode, done.stderr) == (cli_results[name]["code"], cli_results[name]["stderr"])


def test_runs_skips_corrupt_folders_naming_each_and_lists_the_rest(world):
    """Defect 5: one corrupt run folder broke `fp4lab runs` and chapter 05; the message never
    named the file. Started from elsewhere (the default roots do not depend on the cwd)."""
    RunDir.create(world["runs"], run_id="20261201T000000Z-fine")
    done = subprocess.run([sys.executable, "-m", "fp4lab", "runs"], capture_output=True, text=True,
                          cwd=world["tmp"] / "elsewhere", env=world["env"], timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "20261201T000000Z-fine" in done.stdout and "20261130T092010Z-h200-full" in done.stdout
    for name in ("truncated", "listed", "typed", "device-list", "section-string", "config-list", "config-nan"):
        assert f"skipped run folder: {world['runs'] / name / 'run.json'}:" in done.stderr, name


def test_chapter_06_reads_its_siblings_and_skips_the_corrupt_ones(world):
    """Defect 5: the history chapter (06) read every sibling, so one corrupt run folder failed it on every later
    report. Now each is skipped with a note naming its run.json."""
    run = RunDir.create(world["runs"], run_id="20261202T000000Z-ch05")
    page = CHAPTERS["06_history"].build(str(run.path), "none", "smoke", "cpu")
    notes = " ".join(page.notes)
    for name in ("truncated", "listed", "typed", "config-list"):
        assert f"skipped run folder: {world['runs'] / name / 'run.json'}:" in notes, name
    assert "index" in page.sections and "findings" in page.sections


def test_nothing_from_a_run_folder_reaches_the_terminal_as_control_characters(tmp_path, world):
    """A device name or a folder name holding escape sequences (clear the screen, set the title,
    write the clipboard with OSC 52) is printed with them shown, never sent."""
    roots = tmp_path / "escapes"
    run = RunDir.create(roots, run_id="20261203T000000Z-escape")
    run.update_run_json(None, {"provenance": {"device": {"kind": "cuda", "name": "\x1b[2J\x1b]52;c;ZXZpbA==\x07H200"}}})
    (roots / "bad\x1b]0;pwned\x07").mkdir()
    (roots / "bad\x1b]0;pwned\x07" / "run.json").write_text("{")
    done = subprocess.run([sys.executable, "-m", "fp4lab", "runs", str(roots)], capture_output=True, text=True,
                          cwd=world["tmp"] / "elsewhere", env=world["env"], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert "\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07H200" in done.stdout
    assert "bad\\x1b]0;pwned\\x07" in done.stderr


# -- chapter parameters ---------------------------------------------------------------------------

CHAPTER_CASES = [
    ("00_environment", {"run_dir": 5}, "run_dir=5"),
    ("00_environment", {"reference_dir": ["x"]}, "reference_dir=['x']"),
    ("00_environment", {"profile": "bogus"}, "profile='bogus'"),
    ("00_environment", {"profile": 3}, "profile=3"),
    ("00_environment", {"device": "tpu"}, "device 'tpu'"),
    ("00_environment", {"device": "cuda:99"}, "cuda:99"),
    ("00_environment", {"reference_dir": "/nonexistent/run"}, "is not a run folder"),
    ("00_environment", {"reference_dir": "{runs}/truncated"}, "truncated/run.json"),
    ("00_environment", {"run_dir": "{runs}/listed"}, "listed/run.json"),
    ("01_fp4_gemm_sweep", {"backends": "torch-bf16"}, "backends='torch-bf16': expected a list"),
    ("01_fp4_gemm_sweep", {"backends": ["nope"]}, "backends[0]='nope'"),
    ("01_fp4_gemm_sweep", {"fmts": "nvfp4"}, "fmts='nvfp4': expected a list"),
    ("01_fp4_gemm_sweep", {"m_values": 5}, "m_values=5: expected a list"),
    ("01_fp4_gemm_sweep", {"m_values": [0]}, "m_values[0]=0"),
    ("01_fp4_gemm_sweep", {"m_values": ["1"]}, "m_values[0]='1'"),
    ("01_fp4_gemm_sweep", {"m_values": [1.5]}, "m_values[0]=1.5"),
    ("01_fp4_gemm_sweep", {"shapes": [[32]]}, "shapes[0]=[32]"),
    ("01_fp4_gemm_sweep", {"shapes": "32x64"}, "shapes='32x64': expected a list"),
    ("01_fp4_gemm_sweep", {"shapes": 7}, "shapes=7: expected a list"),
    ("01_fp4_gemm_sweep", {"repeats": "3"}, "repeats must be an integer"),
    ("01_fp4_gemm_sweep", {"repeats": True}, "repeats must be an integer"),
    ("01_fp4_gemm_sweep", {"energy_window_s": "1"}, "energy_window_s='1'"),
    ("01_fp4_gemm_sweep", {"energy_window_s": float("nan")}, "energy_window_s=nan"),
    ("01_fp4_gemm_sweep", {"energy_window_s": [1]}, "energy_window_s=[1]"),
    ("01_fp4_gemm_sweep", {"preset": 5}, "preset=5"),
    ("01_fp4_gemm_sweep", {"preset": "nope"}, "preset 'nope'"),
    ("01_fp4_gemm_sweep", {"measure": "no"}, "measure='no'"),
    ("02_power_clocks", {"sample_rate_hz": "x"}, "sample_rate_hz='x'"),
    ("02_power_clocks", {"sample_rate_hz": 0}, "sample_rate_hz=0"),
    ("02_power_clocks", {"duration_s": float("inf")}, "duration_s=inf"),
    ("02_power_clocks", {"duration_s": 1e9}, "duration_s=1000000000.0"),
    ("02_power_clocks", {"duration_s": [1]}, "duration_s=[1]"),
    ("03_moe_expert_scatter", {"preset": "nope"}, "preset 'nope'"),
    ("03_moe_expert_scatter", {"routing": "zipf:x"}, "zipf:x"),
    ("03_moe_expert_scatter", {"routing": 5}, "routing=5"),
    ("03_moe_expert_scatter", {"batch_sizes": 8}, "batch_sizes=8: expected a list"),
    ("03_moe_expert_scatter", {"batch_sizes": [0]}, "batch_sizes[0]=0"),
    ("03_moe_expert_scatter", {"ep_degrees": [3]}, "do not split evenly over 3 ranks"),
    ("03_moe_expert_scatter", {"fmts": ["fp3"]}, "fmts[0]='fp3'"),
    ("03_moe_expert_scatter", {"methods": ["nope"]}, "methods[0]='nope'"),
    ("03_moe_expert_scatter", {"steps": "10"}, "steps='10'"),
    ("03_moe_expert_scatter", {"steps": 0}, "steps=0"),
    ("03_moe_expert_scatter", {"repeats": -1}, "repeats must be an integer"),
    ("03_moe_expert_scatter", {"target_utilization": 2}, "target_utilization=2"),
    ("03_moe_expert_scatter", {"decode_batch": "512"}, "decode_batch='512'"),
    ("03_moe_expert_scatter", {"measure": "yes"}, "measure='yes'"),
    ("04_diagnosis", {"preset": "nope"}, "preset 'nope'"),
    ("04_diagnosis", {"decode_batch": -1}, "decode_batch=-1"),
    ("04_diagnosis", {"decode_batch": "x"}, "decode_batch='x'"),
    ("04_diagnosis", {"backend": 5}, "backend=5"),
    ("04_diagnosis", {"backend": ""}, "backend=''"),
    ("04_diagnosis", {"routing": "zipf:"}, "zipf:"),
    ("04_diagnosis", {"routing": "trace:{runs}/missing.npy"}, "missing.npy: no such file"),
    ("04_diagnosis", {"steps": 1.5}, "steps=1.5"),
    ("04_diagnosis", {"steps": True}, "steps=True"),
    ("05_comm_layouts", {"batches": 8}, "batches=8: expected a list"),
    ("05_comm_layouts", {"nproc": 0}, "nproc=0"),
    ("06_history", {"regression_threshold": -1}, "regression_threshold=-1"),
    ("06_history", {"regression_threshold": "x"}, "regression_threshold='x'"),
    ("06_history", {"regression_threshold": float("nan")}, "regression_threshold=nan"),
    ("06_history", {"runs_dir": 5}, "runs_dir=5"),
    ("06_history", {"runs_dir": "a\nb"}, "runs_dir='a\\nb'"),
    ("06_history", {"runs_dir": LONG}, "runs_dir='99999"),
]


@pytest.fixture(scope="module")
def target(world):
    """An existing run folder the chapters open: a bad parameter must leave it as it was."""
    return RunDir.create(world["tmp"] / "chapter-runs", run_id="target")


def folder_state(path: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("chapter, knobs, fragment", CHAPTER_CASES,
                         ids=[f"{c}-{next(iter(k))}-{i}" for i, (c, k, _) in enumerate(CHAPTER_CASES)])
def test_a_bad_chapter_parameter_is_a_parameter_error(world, target, chapter, knobs, fragment):
    knobs = {name: value.format(runs=world["runs"]) if isinstance(value, str) and "{runs}" in value else value
             for name, value in knobs.items()}
    common = {"run_dir": str(target.path), "reference_dir": "none", "profile": "smoke", "device": "cpu"}
    common.update({name: knobs.pop(name) for name in list(knobs) if name in common})
    before = folder_state(target.path)
    started = time.monotonic()
    with pytest.raises(ParameterError) as caught:
        CHAPTERS[chapter].build(**common, **knobs)
    message = str(caught.value)
    assert fragment in message and "\n" not in message and len(message) <= 600, message
    assert folder_state(target.path) == before
    assert time.monotonic() - started < 10              # refused before any work


NEW_FOLDER_CASES = [case for case in CHAPTER_CASES if "run_dir" not in case[1]]


@pytest.mark.parametrize("chapter, knobs, fragment", NEW_FOLDER_CASES,
                         ids=[f"{c}-{next(iter(k))}-{i}" for i, (c, k, _) in enumerate(NEW_FOLDER_CASES)])
def test_a_bad_chapter_parameter_leaves_no_new_run_folder(world, tmp_path, chapter, knobs, fragment):
    """The chapter's own parameters are checked before its run folder is created."""
    knobs = {name: value.format(runs=world["runs"]) if isinstance(value, str) and "{runs}" in value else value
             for name, value in knobs.items()}
    common = {"reference_dir": "none", "profile": "smoke", "device": "cpu"}
    common.update({name: knobs.pop(name) for name in list(knobs) if name in common})
    new = tmp_path / "runs" / "new-run"
    with pytest.raises(ParameterError, match=re.escape(fragment)):
        CHAPTERS[chapter].build(str(new), **common, **knobs)
    assert not (tmp_path / "runs").exists()


def test_the_table_has_at_least_sixty_cases():
    assert len(CLI_CASES) + len(CHAPTER_CASES) >= 60 and len(CLI_CASES) >= 60
