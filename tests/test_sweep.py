"""The GEMM and MoE sweeps on the one runner, with fake backends that misbehave (tests/fakes):
every point one row; the gate first; a crash or a hang costs one point; unavailable points need no
worker; a rerun, a resume or a second run of the same id measures nothing twice."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from fp4lab import schema
from fp4lab.errors import ParameterError
from fp4lab.results import RunDir
from fp4lab.sweep import GemmSweep, MoeSweep
from fp4lab.sweep import gemm as gemm_sweep
from fp4lab.sweep import moe as moe_sweep

FAST = {"repeats": 3, "warmup_s": 0.0, "cold_l2": False, "use_graph": False}


def config(backends, m_values=(1, 4, 8), **overrides) -> GemmSweep:
    return GemmSweep.from_profile("smoke", "cpu", **{"backends": list(backends), "fmts": ["nvfp4"],
                                  "m_values": list(m_values), "shapes": [[32, 64]], "timer": FAST, **overrides})


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """One sweep over a good, a wrong, a crashing and an unavailable backend (module-scoped:
    worker start-up is most of its cost)."""
    mp = pytest.MonkeyPatch()
    import os

    from conftest import TESTS_DIR

    mp.setenv("FP4LAB_EXTRA_BACKENDS", "fakes.backends")
    mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    from fp4lab.sweep.registry import load_extra_backends

    load_extra_backends()
    run = RunDir.create(tmp_path_factory.mktemp("runs"), run_id="mixed")
    gemm_sweep.run_sweep(config(["fake-ok", "fake-wrong", "fake-crash", "fake-unavailable"]), run,
                         progress=False)
    yield run
    mp.undo()


def rows_of(run, backend):
    frame = run.read_table("gemm")
    return frame[frame["backend"] == backend].sort_values("m")


def test_every_point_has_one_row_with_every_declared_column(mixed_run):
    frame = mixed_run.read_table("gemm")
    assert len(frame) == 4 * 3
    assert list(frame.columns[:len(schema.GEMM.names)]) == schema.GEMM.names
    assert len({schema.GEMM.row_key(row) for row in mixed_run.read_rows("gemm")}) == 12


def test_good_backend_is_gated_then_timed(mixed_run):
    ok = rows_of(mixed_run, "fake-ok")
    assert (ok["status"] == "ok").all() and (ok["rel_err"] < 1e-2).all()
    assert (ok["median_us"] > 0).all() and (ok["p20_us"] <= ok["median_us"]).all()
    assert (ok["weight_dtype"] == "bf16").all() and (ok["device"] == "cpu").all()
    assert not ok["graph"].any() and (ok["samples"] == 3).all()


def test_wrong_result_has_rel_err_and_no_time(mixed_run):
    wrong = rows_of(mixed_run, "fake-wrong")
    assert (wrong["status"] == "wrong_result").all() and wrong["median_us"].isna().all()
    assert (wrong["rel_err"] > 0.5).all() and wrong["error"].str.contains("wrong scale").all()


def test_a_crashing_worker_costs_one_point(mixed_run):
    from fakes.backends import CRASH_AT_M

    crash = rows_of(mixed_run, "fake-crash")
    dead = crash[crash["m"] == CRASH_AT_M]
    assert dead["status"].tolist() == ["error"] and "fake-crash: dying" in dead["error"].iloc[0]
    assert (crash[crash["m"] != CRASH_AT_M]["status"] == "ok").all()     # a fresh worker went on


def test_unavailable_backend_needs_no_worker(mixed_run):
    unavailable = rows_of(mixed_run, "fake-unavailable")
    assert (unavailable["status"] == "unavailable").all()
    assert unavailable["error"].str.contains("does not exist").all()
    assert not (mixed_run.path / "logs" / "fake-unavailable.log").exists()


def test_run_json_records_the_config_the_ceilings_and_the_end(mixed_run):
    info = mixed_run.run_json()
    sweep = info["sweep"]
    assert sweep["status"] == "complete" and sweep["config"]["timer"]["repeats"] == 3
    assert sweep["ceilings"]["measured"]["bandwidth_tbps"] > 0 and "device" in info["provenance"]


def test_a_rerun_of_the_same_id_measures_nothing(mixed_run):
    before = len(mixed_run.read_rows("gemm"))
    measured = gemm_sweep.run_sweep(config(["fake-ok", "fake-wrong", "fake-crash", "fake-unavailable"]),
                                    mixed_run, progress=False)
    assert measured == 0 and len(mixed_run.read_rows("gemm")) == before


def test_retry_failed_measures_error_rows_again(tmp_path, fake_backends_env):
    from fakes.backends import CRASH_AT_M

    run = RunDir.create(tmp_path, run_id="retry")
    gemm_sweep.run_sweep(config(["fake-crash"]), run, progress=False)
    assert gemm_sweep.run_sweep(config(["fake-crash"]), run, progress=False) == 0
    assert gemm_sweep.run_sweep(config(["fake-crash"]), run, retry_failed=True, progress=False) == 1
    frame = run.read_table("gemm")
    assert len(frame) == 3 and frame[frame["m"] == CRASH_AT_M]["status"].tolist() == ["error"]


def test_a_hung_point_becomes_a_timeout_row_and_the_sweep_goes_on(tmp_path, fake_backends_env):
    from fakes.backends import CRASH_AT_M

    run = RunDir.create(tmp_path, run_id="hang")
    gemm_sweep.run_sweep(config(["fake-hang"], point_timeout_s=3.0), run, progress=False)
    frame = run.read_table("gemm").sort_values("m")
    hung = frame[frame["m"] == CRASH_AT_M]
    assert hung["status"].tolist() == ["timeout"] and "point_timeout_s" in hung["error"].iloc[0]
    assert (frame[frame["m"] != CRASH_AT_M]["status"] == "ok").all()


def test_an_interrupted_sweep_keeps_its_rows_and_a_rerun_finishes(tmp_path, fake_backends_env):
    from fakes.backends import CRASH_AT_M

    from fp4lab.sweep.runner import Interrupted

    run = RunDir.create(tmp_path, run_id="interrupt")
    with pytest.raises(KeyboardInterrupt):
        gemm_sweep.run_sweep(config(["fake-ok", "fake-interrupt"]), run, progress=False)
    assert run.run_json()["sweep"]["status"] == "interrupted"
    kept = run.read_table("gemm")
    assert len(kept) == 3 + sum(m < CRASH_AT_M for m in (1, 4, 8))
    assert issubclass(Interrupted, KeyboardInterrupt)


def test_timer_typo_is_one_line_before_any_work(tmp_path):
    with pytest.raises(ParameterError, match="timer: unknown setting 'coldl2'"):
        GemmSweep.from_profile("smoke", "cpu", timer={"coldl2": False})


@pytest.mark.parametrize("overrides, named", [
    ({"fmts": ["fp3"]}, "fmts"), ({"m_values": [0]}, "m_values"), ({"m_values": []}, "m_values"),
    ({"shapes": [[32, 30]]}, "block size"), ({"shapes": [[32]]}, "shapes"),
    ({"backends": ["magic"]}, "backends"), ({"energy_window_s": -1}, "energy_window_s"),
    ({"point_timeout_s": 0}, "point_timeout_s"), ({"telemetry_hz": float("nan")}, "telemetry_hz"),
])
def test_bad_config_names_the_field(overrides, named):
    with pytest.raises(ParameterError, match=named):
        GemmSweep.from_profile("smoke", "cpu", **overrides)


@pytest.mark.parametrize("profile", ["smoke", "full"])
def test_an_empty_shape_list_is_refused_even_where_the_profile_adds_a_presets_shapes(profile):
    """On a GPU the full profile adds GLM-5's shapes: `--shapes ''` used to run the whole grid."""
    with pytest.raises(ParameterError, match=re.escape("shapes=[]")):
        GemmSweep.from_profile(profile, "cpu", shapes=[])


def test_fp4lab_profile_says_what_auto_stands_for_and_a_bad_one_names_the_variable(monkeypatch):
    from fp4lab import profiles

    assert profiles.resolve("auto", has_cuda=True) == "full"
    monkeypatch.setenv("FP4LAB_PROFILE", "smoke")
    assert profiles.resolve("auto", has_cuda=True) == "smoke"
    assert profiles.resolve("full", has_cuda=True) == "full"          # a profile named is kept
    assert GemmSweep.from_profile("auto", "cpu").profile == "smoke"
    monkeypatch.setenv("FP4LAB_PROFILE", "quick")
    with pytest.raises(ParameterError, match=re.escape("FP4LAB_PROFILE: profile='quick': use one of smoke, full")):
        profiles.resolve("auto", has_cuda=True)


def test_profiles_are_valid_grids():
    assert GemmSweep.from_profile("smoke", "cpu").shapes == ((256, 512), (512, 256))
    full = GemmSweep.from_profile("full", "cpu")
    assert (6144, 2048) in full.shapes and full.m_values[-1] == 16384 and full.timer.cold_l2
    stored = GemmSweep.from_dict(full.as_dict())
    assert stored == full


# -- the MoE sweep on the same runner ---------------------------------------------------------------

def moe_config(methods, **overrides) -> MoeSweep:
    values = {"batch_sizes": [8, 32], "ep_degrees": [1], "steps": 4, "timer": {"repeats": 2}, **overrides}
    return MoeSweep.from_profile("smoke", "cpu", methods=list(methods), **values)


def test_moe_sweep_rows_rerun_and_crash_isolation(tmp_path, fake_backends_env):
    from fakes.backends import CRASH_AT_BATCH

    run = RunDir.create(tmp_path, run_id="moe")
    cfg = dataclasses.replace(moe_config(["loop-bf16", "layer-loop-bf16", "fake-moe-crash"]),
                              dense_m_values=(1, 8))
    measured = moe_sweep.run_sweep(cfg, run, progress=False)
    frame = run.read_table("moe")
    assert measured == len(frame) and frame["scaled"].all()
    loop = frame[frame["method"] == "loop-bf16"]
    assert len(loop) == 2 * 2 and (loop["status"] == "ok").all()          # 2 gemms x 2 batches
    layer = frame[frame["method"] == "layer-loop-bf16"]
    assert set(layer["gemm"]) == {"layer"} and (layer["status"] == "ok").all() and set(layer["fmt"]) == {"nvfp4"}
    crash = frame[frame["method"] == "fake-moe-crash"]
    assert (crash[crash["batch"] == CRASH_AT_BATCH]["status"] == "error").all()
    assert (crash[crash["batch"] != CRASH_AT_BATCH]["status"] == "ok").all()
    assert len(frame[frame["method"] == "dense-bf16"]) == 2 * 2
    assert moe_sweep.run_sweep(cfg, run, progress=False) == 0             # a rerun appends nothing
    assert len(run.read_table("moe")) == len(frame)


def test_layer_methods_at_ep_time_the_busiest_ranks_own_pairs(tmp_path):
    """A layer method at EP 2 runs the busiest rank's routed (token, expert) pairs on its E/2
    experts: the same rank, loads and tokens as the GEMM methods' rows at that point."""
    cfg = moe_config(["loop-bf16", "layer-loop-bf16"], ep_degrees=[1, 2], batch_sizes=[16])
    model = cfg.model()
    ids, rank, per_rank = moe_sweep.rank_routes(cfg, model, 16, 2)              # [R, 1]
    loads, same_rank, step_ids = moe_sweep.step_routing(cfg, model, 16, 2)
    assert rank == same_rank and per_rank == model.experts // 2 and ids.shape[1] == 1
    assert ids.min() >= 0 and ids.max() < per_rank
    assert np.array_equal(np.bincount(ids.ravel(), minlength=per_rank), loads)
    whole, _, _ = moe_sweep.rank_routes(cfg, model, 16, 1)
    assert np.array_equal(whole, step_ids)                                       # EP 1: the step itself

    run = RunDir.create(tmp_path, run_id="moe-ep")
    moe_sweep.run_sweep(dataclasses.replace(cfg, dense_m_values=(1,)), run, progress=False)
    frame = run.read_table("moe")
    layer = frame[(frame["method"] == "layer-loop-bf16") & (frame["ep"] == 2)]
    gemm = frame[(frame["method"] == "loop-bf16") & (frame["ep"] == 2) & (frame["gemm"] == "gate_up")]
    assert len(layer) == 1 and (layer["status"] == "ok").all()
    assert layer["ep_rank"].iloc[0] == gemm["ep_rank"].iloc[0] == rank
    assert layer["experts"].iloc[0] == per_rank
    assert layer["tokens"].iloc[0] == gemm["tokens"].iloc[0] == loads.sum()
    whole_layer = frame[(frame["method"] == "layer-loop-bf16") & (frame["ep"] == 1)]
    assert layer["flops"].iloc[0] < whole_layer["flops"].iloc[0]               # half the pairs' work


def test_layer_points_keep_one_weight_set_per_run_of_points():
    """A worker holds one set of layer weights (E experts at EP 1, E/P on a rank): the plan orders
    a layer method's points so each (format, EP) set is built once, not once per batch."""
    from fp4lab.sweep.plan import moe_points

    cfg = moe_config(["layer-loop-bf16"], ep_degrees=[1, 2], batch_sizes=[8, 16, 32])
    sets = [(p.fmt, p.ep) for p in moe_points(cfg, moe_sweep.method_kinds()) if p.gemm == "layer"]
    changes = sum(1 for a, b in zip(sets, sets[1:]) if a != b)
    assert len(sets) == len(cfg.fmts) * 2 * 3 and changes == len(set(sets)) - 1


def test_a_second_model_swept_into_a_run_keeps_the_first_ones_record():
    first = moe_config(["loop-bf16"], preset="glm-5")
    second = moe_config(["loop-bf16"], preset="deepseek-v3")
    glm = moe_sweep.sweep_record({}, first, first.model())
    done = {**glm, "ended": "2026-12-03T17:00:00+00:00", "status": "complete"}
    assert moe_sweep.sweep_record(done, first, first.model())["started"] == glm["started"]
    both = moe_sweep.sweep_record(done, second, second.model())
    assert both["model"]["key"] == second.model().key and both["ended"] is None
    assert both["earlier"] == [done]                    # GLM-5's conditions, whole
    again = moe_sweep.sweep_record({**both, "status": "complete"}, first, first.model())
    assert [entry["model"]["key"] for entry in again["earlier"]] == [
        first.model().key, second.model().key]          # every record, in the order they ran
    assert again["earlier"][0] == done and "earlier" not in again["earlier"][1]


def test_another_sweep_of_the_same_model_keeps_the_first_ones_record():
    first = moe_config(["loop-bf16"], preset="glm-5")
    other = moe_config(["layer-loop-bf16"], preset="glm-5")        # other methods, same model
    done = {**moe_sweep.sweep_record({}, first, first.model()), "status": "complete"}
    resumed = moe_sweep.sweep_record(done, first, first.model())
    assert "earlier" not in resumed and resumed["started"] == done["started"]
    second = moe_sweep.sweep_record(done, other, other.model())
    assert second["earlier"] == [done] and second["config"] == other.as_dict()


def test_moe_config_checks():
    with pytest.raises(ParameterError, match="ep_degrees"):
        moe_config(["loop-bf16"], ep_degrees=[3], preset="glm-5")
    with pytest.raises(ParameterError, match="methods"):
        moe_config(["magic"])
    with pytest.raises(ParameterError, match="batch_sizes"):
        moe_config(["loop-bf16"], batch_sizes=[0])
    with pytest.raises(ParameterError, match="energy_window_s"):
        moe_config(["loop-bf16"], energy_window_s=-1)
    with pytest.raises(ParameterError, match=re.escape("energy_batches[0]")):
        moe_config(["loop-bf16"], energy_batches=[0])


def test_the_energy_window_replays_the_call_eagerly_only_where_no_graph_can_hold_it():
    """On a GPU a graph-capturable call is replayed as a graph (the timer's way); a call the method
    says cannot be captured, or any call on the CPU, is called as it is."""
    from types import SimpleNamespace

    from fp4lab.sweep.moe import window_call

    def run():
        return None

    assert window_call(SimpleNamespace(call=run, graph=True), "cpu") is run
    assert window_call(SimpleNamespace(call=run, graph=False), "cuda:0") is run


def test_the_full_moe_sweep_takes_an_energy_window_at_the_decode_batch_and_the_smoke_none():
    """The fused layer kernels reach the board's power cap within 0.1-0.2 s of back-to-back calls
    (calls 109-110): the full profile's points at the decode batch also run an energy window,
    which the moe table keeps in the GEMM table's energy columns."""
    full = MoeSweep.from_profile("full", "cpu")
    assert full.energy_batches == full.anatomy_batches == (512,) and full.energy_window_s == 0.5
    assert MoeSweep.from_profile("smoke", "cpu").energy_window_s == 0
    assert MoeSweep.from_dict(full.as_dict()) == full
    energy = [name for name, *_ in schema.ENERGY]
    assert set(energy) <= set(schema.table("moe").names) and set(energy) <= set(schema.table("gemm").names)


# -- the kernels' anatomy ---------------------------------------------------------------------------

def test_the_anatomy_dissects_each_kernel_the_grid_runs_in_its_formats():
    from fp4lab.sweep.plan import anatomy_points

    both = config(["triton-w4a16", "cuda-w4a16"], fmts=["nvfp4", "mxfp4"], anatomy_m=[1, 16],
                  anatomy_fmts=["nvfp4"])
    points = anatomy_points(both)
    for backend, stages in schema.ANATOMY_KERNELS.items():
        mine = [p for p in points if p.backend == backend]
        assert {p.stage for p in mine} == set(stages) and {p.m for p in mine} == {1, 16}
        assert {p.group for p in mine} == {f"{backend}-anatomy"}      # one worker per kernel
    assert {p.fmt for p in points} == {"nvfp4"}
    assert len({p.key(0) for p in points}) == len(points) == 2 * (6 + 4)
    assert {p.backend for p in anatomy_points(config(["cuda-w4a16"], anatomy_m=[1]))} == {"cuda-w4a16"}
    assert anatomy_points(config(["torch-bf16"], anatomy_m=[1])) == []           # no dissected kernel
    assert anatomy_points(config(["cuda-w4a16"], anatomy_m=[1], anatomy_fmts=["mxfp4"])) == []  # not in fmts
    assert {p.fmt for p in anatomy_points(config(["cuda-w4a16"], fmts=["nvfp4", "mxfp4"],
                                                 anatomy_m=[1]))} == {"nvfp4", "mxfp4"}   # default: every one
    with pytest.raises(ParameterError, match=re.escape("anatomy_fmts[0]")):
        config(["cuda-w4a16"], anatomy_fmts=["fp3"])


def test_the_anatomy_worker_builds_each_point_once_and_stores_a_failed_check_untimed(monkeypatch):
    """measure_job in this process with a fake kernel: the kernel's module is the one named for its
    backend, all of a point's stages are built in one call, a stage whose check fails becomes a
    wrong_result row with no time, the others are timed with their config."""
    import fakes.anatomy_kernel as fake

    from fp4lab.sweep import anatomy, registry

    class Available:
        def availability(self, device, import_check=True):
            return True, ""

    monkeypatch.setitem(anatomy.KERNEL_MODULES, "cuda-w4a16", "fakes.anatomy_kernel")
    monkeypatch.setattr(registry, "backend", lambda name: Available())
    fake.CALLS.clear()
    points = [{"backend": "cuda-w4a16", "stage": stage, "fmt": "nvfp4", "n": 32, "k": 64, "m": m}
              for m in (1, 3) for stage in schema.ANATOMY_KERNELS["cuda-w4a16"]]
    sent = []
    anatomy.measure_job({"points": points, "device": "cpu", "timer": FAST, "seed": 0, "run_id": "r"},
                        lambda kind, **values: sent.append((kind, values)))
    rows = [values["row"] for kind, values in sent if kind == "row"]
    assert [kind for kind, _ in sent][0] == "ready" and len(rows) == len(points)
    assert [c["m"] for c in fake.CALLS] == [1, 3]                       # once per point, every stage
    assert fake.CALLS[0]["stages"] == schema.ANATOMY_KERNELS["cuda-w4a16"]
    for row in rows:
        assert row["backend"] == "cuda-w4a16" and row["config"] == f"cuda fake {row['stage']}"
        if row["stage"] == "mma":
            assert row["status"] == "wrong_result" and row["median_us"] is None
            assert row["error"] == "mma: partial tiles do not add up"
        else:
            assert row["status"] == "ok" and row["median_us"] > 0 and row["rel_err"] < 1e-2


def test_the_cli_counts_the_anatomy_rows_beside_the_gemm_rows(tmp_path, capsys):
    """A GEMM sweep also times the kernels' stages: its closing line says how many rows of each."""
    from fp4lab import cli

    assert cli.main(["sweep", "--profile", "smoke", "--backends", "cuda-w4a16", "--format", "nvfp4",
                     "--m", "1", "--shapes", "32x64", "--device", "cpu", "--gpus", "one",
                     "--out", str(tmp_path), "--run-id", "count", "--quiet"]) == 0
    assert ("the run holds 1 gemm rows (1 unavailable) and 8 anatomy rows (8 unavailable)"
            in capsys.readouterr().err)            # 4 stages at the smoke profile's M = 1 and 16


# -- the fused MoE's anatomy --------------------------------------------------------------------------

def test_the_moe_anatomy_dissects_the_fused_kernel_at_its_batches_whole_build_first():
    from fp4lab.sweep.plan import moe_anatomy_points

    cfg = moe_config(["loop-bf16", "cuda-w4a16-moe"], fmts=["nvfp4", "mxfp4"], anatomy_batches=[64, 512])
    points = moe_anatomy_points(cfg)
    stages = schema.MOE_ANATOMY_METHODS["cuda-w4a16-moe"]
    assert len(points) == 2 * 2 * len(stages) == len({p.key(0, "glm-5", "uniform") for p in points})
    assert {p.group for p in points} == {"cuda-w4a16-moe-anatomy"}          # one worker
    for at in range(0, len(points), len(stages)):                            # per (fmt, batch):
        point = points[at:at + len(stages)]
        assert [p.stage for p in point][0] == "full" and {p.stage for p in point} == set(stages)
        assert len({(p.fmt, p.batch, p.ep) for p in point}) == 1 and point[0].ep == 1
    assert moe_anatomy_points(moe_config(["loop-bf16"], anatomy_batches=[512])) == []
    assert moe_anatomy_points(moe_config(["cuda-w4a16-moe"], anatomy_batches=[])) == []
    with pytest.raises(ParameterError, match=re.escape("anatomy_batches[0]")):
        moe_config(["cuda-w4a16-moe"], anatomy_batches=[0])


class DissectedLayer:
    """A fused method's anatomy on the CPU: every build is the torch layer loop, the whole one
    gated (or made wrong: its reference doubled), each build named in its note."""

    def __init__(self, wrong: bool = False):
        from fp4lab.backends.moe.torch_methods import LayerLoopBf16

        self.layer, self.wrong, self.prepared = LayerLoopBf16(), wrong, []

    def availability(self, device, import_check=True):
        return True, ""

    def prepare(self, problem, fmt=None, stage="full"):
        self.prepared.append(stage)
        call = self.layer.prepare(problem, fmt)
        wrong = (lambda part, tensor: 2 * tensor) if self.wrong else None
        return dataclasses.replace(call, note=f"fake build {stage}", reference_transform=wrong)


def anatomy_job(method, monkeypatch, batches=(8,)):
    from fp4lab.sweep import moe_anatomy, registry
    from fp4lab.sweep.plan import moe_anatomy_points

    monkeypatch.setattr(registry, "moe_method", lambda name: method)
    cfg = moe_config(["cuda-w4a16-moe"], anatomy_batches=list(batches))
    points = [p.identity() for p in moe_anatomy_points(cfg)]
    sent = []
    moe_anatomy.measure_job({"group": "cuda-w4a16-moe-anatomy", "points": points, "device": "cpu",
                             "run_id": "r", "config": cfg.as_dict()},
                            lambda kind, **values: sent.append((kind, values)))
    assert [kind for kind, _ in sent][0] == "ready"
    return [values["row"] for kind, values in sent if kind == "row"]


def test_the_moe_anatomy_worker_gates_the_whole_build_once_then_times_every_build(monkeypatch):
    method = DissectedLayer()
    rows = anatomy_job(method, monkeypatch, batches=(8, 32))
    stages = ("full", "load", "decode", "compute")
    assert [(r["batch"], r["stage"]) for r in rows] == [(b, s) for b in (8, 32) for s in stages]
    assert method.prepared == list(stages) * 2                             # the whole build gated once
    for row in rows:
        assert row["status"] == "ok" and row["median_us"] > 0 and row["rel_err"] < 1e-2
        assert row["what"] == f"fake build {row['stage']}" and row["weight_bytes"] > 0
        assert row["preset"] == "glm-5-scaled" and row["scaled"] and row["experts"] > 0
        assert set(row) == set(schema.MOE_ANATOMY.names)


def test_a_whole_build_that_fails_the_gate_leaves_its_point_untimed(monkeypatch):
    method = DissectedLayer(wrong=True)
    rows = anatomy_job(method, monkeypatch)
    assert [r["status"] for r in rows] == ["wrong_result"] * 4 and method.prepared == ["full"]
    assert all(r["median_us"] is None and r["rel_err"] > 0.1 for r in rows)
    assert not rows[0]["error"].startswith("the full build")
    assert all(r["error"].startswith("the full build at this point failed the gate: ") for r in rows[1:])


def test_a_cpu_moe_sweep_stores_the_anatomy_unavailable_and_the_cli_counts_it(tmp_path, capsys):
    from fp4lab import cli

    assert cli.main(["moe-sweep", "--profile", "smoke", "--device", "cpu", "--methods", "cuda-w4a16-moe",
                     "--batch", "8", "--ep", "1", "--anatomy-batch", "8", "16", "--runs-dir", str(tmp_path),
                     "--run-id", "anat", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "8 moe_anatomy rows (8 unavailable)" in err
    rows = RunDir(tmp_path / "anat").read_table("moe_anatomy")
    assert set(rows["stage"]) == {"full", "load", "decode", "compute"} and set(rows["batch"]) == {8, 16}
    assert cli.main(["moe-sweep", "--profile", "smoke", "--device", "cpu", "--methods", "cuda-w4a16-moe",
                     "--batch", "8", "--ep", "1", "--anatomy-batch", "--runs-dir", str(tmp_path),
                     "--run-id", "none", "--quiet"]) == 0
    assert not RunDir(tmp_path / "none").has_table("moe_anatomy")          # none asked for: none
