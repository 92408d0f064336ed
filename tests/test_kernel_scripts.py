"""benchmarks/tune_w4a16.py (the dense grid), benchmarks/h200_kernels.py (the H200 call) and
benchmarks/gemv_probe.py (a probe between tuning runs): the grid's shape, the presets they
write, bad input, and one whole --smoke run of the device script on the CPU (TRITON_INTERPRET=1:
the same phases, gates and files on tiny shapes)."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fp4lab.backends import triton_w4a16
from fp4lab.backends.moe.triton_fused import CALL_PARTS, MoeTileConfig, moe_presets_from_json
from fp4lab.backends.triton_w4a16 import TileConfig, choose_config

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
H200_SMS = 132


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_interpreted(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """benchmarks/`script`.py under TRITON_INTERPRET=1 with the package on the path."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "src")}
    return subprocess.run([sys.executable, os.path.join(BENCH, f"{script}.py"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tune():
    return load("tune_w4a16")


@pytest.mark.parametrize("m", [1, 4, 16, 64, 256])
@pytest.mark.parametrize("n,k", [(8192, 8192), (4096, 6144), (6144, 2048)])
def test_grid_starts_with_the_pick_and_fills_the_gpu(tune, n, k, m):
    point = tune.Point("nvfp4", n, k, m)
    grid = tune.candidates(point, H200_SMS)
    assert grid[0] == choose_config(m, n, k, H200_SMS)
    assert len(grid) == len(set(grid)) and len(grid) <= (64 if m == 1 else 56)
    assert grid[1] == dataclasses.replace(grid[0], loads={"pointer": "tma", "tma": "pointer"}[
        grid[0].loads]) or grid[0].math == "gemv"               # the pick's twin next
    ptx = [c for c in grid if c.decode == "ptx" and c.math == "dot"]
    plain = {c for c in ptx if c.loads == "pointer" and c.layout == "rows"}
    for loads, layout in (("tma", "rows"), ("pointer", "tiles"), ("tma", "tiles")):
        # every tensor-core config on both load paths and both layouts
        assert {dataclasses.replace(c, loads="pointer", layout="rows") for c in ptx
                if (c.loads, c.layout) == (loads, layout)} == plain
    if (n, k) in triton_w4a16.SHAPE_PRESETS:   # the measured winner is the yardstick
        assert grid[0] == triton_w4a16.preset_for(m, triton_w4a16.SHAPE_PRESETS[(n, k)])
    if m <= 16:   # decode: the MMA's M side is the weight tile, and the plain decode is measured
        assert all(c.swap_ab or c.math == "gemv" for c in grid)
        assert any(c.math == "gemv" for c in grid) == (m <= 4)
        assert any(c.decode == "bits" for c in grid)
    for config in grid[1:]:
        if config.split_k > 1:   # split only where the tiles alone leave SMs idle
            assert config.ctas(m, n, k) <= 5 * H200_SMS, config.label()
            assert config.blocks_per_split(k) >= triton_w4a16.MIN_K_BLOCKS_PER_SPLIT


def test_the_whole_grid_compiles_few_kernels(tune):
    """M and the split count are runtime: a compile is a (tile shape, split or not) pair. Each
    preset adds its own variants (both load paths, both layouts): 134 with call 88's M = 256
    presets, a few minutes of compiles on the H200."""
    compiled = {dataclasses.replace(c, split_k=min(c.split_k, 2))
                for p in tune.plan(tune.parse_shapes(tune.DEFAULT_SHAPES),
                                   tune.parse_m(tune.DEFAULT_M), ["nvfp4"])
                for c in tune.candidates(p, H200_SMS)}
    assert len(compiled) <= 144


def test_presets_rows_load_back_as_shape_presets(tune):
    small = TileConfig(block_m=16, block_n=128, block_k=256, split_k=4, swap_ab=True)
    large = TileConfig(block_m=64, block_n=128, block_k=128)
    winners = [{"fmt": "nvfp4", "n": 6144, "k": 2048, "m": m, "config": dataclasses.asdict(c),
                "median_us": 5.0} for m, c in ((256, large), (1, small), (16, small))]
    winners.append({**winners[0], "fmt": "mxfp4"})
    rows = json.loads(json.dumps(tune.presets_rows(winners, "nvfp4")))
    assert [r["m_max"] for r in rows] == [1, 16, 256]
    presets = triton_w4a16.presets_from_json(rows)
    assert presets == {(6144, 2048): ((1, small), (16, small), (256, large))}


@pytest.fixture(scope="module")
def device_script(tune):
    return load("h200_kernels")


@pytest.mark.parametrize("pairs", [64 * 8, 512 * 8])
def test_moe_candidates_start_with_the_preset_and_vary_one_thing_each(device_script, pairs):
    from fp4lab.backends.moe.triton_fused import choose_moe_config

    pick = choose_moe_config(pairs, 256)
    grid = device_script.moe_candidates(pairs, 256)
    assert grid[0] == pick and len(set(grid)) == len(grid) == 18
    for config in grid[1:]:
        changed = {f.name for f in dataclasses.fields(config)
                   if getattr(config, f.name) != getattr(pick, f.name)} - {"loads"}
        assert changed in (set(), {"block_m"}, {"num_stages"}, {"block_k", "num_warps"},
                           {"layout"}, {"num_warps"}, {"num_warps", "block_n_gate_up"},
                           {"num_warps", "block_n_down"},
                           {"num_warps", "block_n_gate_up", "block_n_down"},
                           {"block_n_gate_up"}, {"block_k", "num_stages"}), changed
    wide = [c for c in grid if c.num_warps == 8 and c.block_k == pick.block_k]
    assert {(c.block_n_gate_up, c.block_n_down) for c in wide} == {
        (g * pick.block_n_gate_up, d * pick.block_n_down) for g in (1, 2) for d in (1, 2)}
    assert all(c.loads == pick.loads for c in wide)      # on the preset's load path
    assert sorted(c.loads for c in grid) == sorted(["pointer"] * 5 + ["tma"] * 5
                                                   + [pick.loads] * 8)
    narrow = grid[-6:-2]      # 2 warps, half gate_up's tile, a stage fewer, BK 64 a stage deeper
    assert [(c.num_warps, c.block_n_gate_up, c.num_stages, c.block_k) for c in narrow] == [
        (2, pick.block_n_gate_up, pick.num_stages, pick.block_k),
        (pick.num_warps, pick.block_n_gate_up // 2, pick.num_stages, pick.block_k),
        (pick.num_warps, pick.block_n_gate_up, pick.num_stages - 1, pick.block_k),
        (pick.num_warps, pick.block_n_gate_up, pick.num_stages + 1, 64)]
    assert [c.layout for c in grid[-2:]] == ["tiles", "tiles"]   # the preset in tiles, both paths
    assert {grid[1].loads, grid[0].loads} == {"pointer", "tma"}    # the pick's twin next


def test_moe_candidates_add_taller_pair_tiles_where_an_expert_sees_many_pairs(device_script):
    """At 128 pairs an expert (GLM-5 at B = 4096) the decode grid ends with 64- and 128-pair
    tiles on 8 warps; at 16 pairs (B = 512) it has none of them."""
    pick = device_script.choose_moe_config(4096 * 8, 256)
    tall = device_script.moe_candidates(4096 * 8, 256, ("tma",), ("rows",))[-3:]
    assert [(c.block_m, c.num_warps) for c in tall] == [(64, 8), (64, 8), (128, 8)]
    assert tall[1].block_n_gate_up == 2 * pick.block_n_gate_up and tall[0].loads == pick.loads
    assert not [c for c in device_script.moe_candidates(512 * 8, 256) if c.block_m > 32]
    assert device_script.PLANS["moe-wide"].moe_points == (("glm-5", 4096), ("glm-5", 2048))


@pytest.mark.parametrize("bad", ["8192", "8192x16", "axb"])
def test_bad_shapes_are_named(tune, bad):
    with pytest.raises(SystemExit, match="--shapes"):
        tune.parse_shapes(bad)


def test_configs_file_times_the_pick_then_its_configs_at_its_shape(tune):
    """The committed M = 64 probe file loads; `tune_point` with it runs the pick then those."""
    probe = tune.parse_configs(os.path.join(BENCH, "configs", "m64_probe.json"))
    assert set(probe) == {(8192, 8192), (4096, 6144), (6144, 2048)}
    assert all(c.block_m == 64 and c.swap_ab for configs in probe.values() for c in configs)
    timed = []
    point = tune.Point("nvfp4", 8192, 8192, 64)
    tune.tune_point(point, "cpu", None, {(point.fmt, point.n, point.k): None},
                    timed.append, deadline=-1.0, sms=H200_SMS, extra=probe)
    skipped = timed[0]["skipped"]   # the deadline has passed: every config is named, none run
    assert skipped[0] == choose_config(64, 8192, 8192, H200_SMS).label()
    assert skipped[1:] == [c.label() for c in probe[(8192, 8192)]]


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(BENCH, "configs"))
                                         if f.startswith("m") and f.endswith(".json")))
def test_every_committed_shape_probe_file_loads(tune, name):
    """Each committed {"NxK": [configs]} probe file gives valid TileConfigs at the issue's shapes
    (occupancy_probe.json is a flat list for every shape and loads on another path)."""
    probe = tune.parse_configs(os.path.join(BENCH, "configs", name))
    assert set(probe) <= {(8192, 8192), (4096, 6144), (6144, 2048)} and all(probe.values())


@pytest.mark.parametrize("text, match", [("[1, 2]", "AttributeError"),
                                         ('{"64x64": [{"block_n": 64}]}', "block_m"),
                                         ('{"64x64": [{"block_m": 3, "block_n": 64, '
                                          '"block_k": 64}]}', "power of two"),
                                         ("{not json", "JSONDecodeError")])
def test_bad_configs_file_is_named(tune, tmp_path, text, match):
    path = tmp_path / "configs.json"
    path.write_text(text)
    with pytest.raises(SystemExit, match=f"--configs {path}.*{match}"):
        tune.parse_configs(str(path))


def test_cuda_probe_grid_is_every_valid_build_and_without_a_gpu_it_says_so(tmp_path):
    from fp4lab.backends.cuda_w4a16 import choose_config as cuda_choose

    probe = load("cuda_probe")
    # 6 builds (the 3 presets', 3 of teams in 16-warp CTAs) x 2 launches, and 4 over M = 16
    assert len(set(probe.GRID)) == len(probe.GRID) == 12
    assert len(set(probe.WIDE_GRID)) == len(probe.WIDE_GRID) == 8
    assert {c.min_ctas for c in probe.GRID} == {1, 2} and {c.cluster for c in probe.GRID} == {1}
    assert {c.kwarps for c in probe.GRID if c.warps == 16} == {1, 2, 4}
    for n, k in probe.SHAPES:      # the preset of every point is one of the builds it times
        for m in (*probe.M_VALUES, 64):
            builds = probe.builds_at(m, n, k)
            assert len(set(builds)) == len(builds) and cuda_choose(m, n, k) in builds
    # cluster twins only where a grid is under one CTA an SM: at 6144x2048 8 k-groups a warp (96
    # CTAs, 4 splits) and 16 (48, 2), and the teams of 2 (96, 2); none on 8192x8192's 256 CTAs
    twins = [c for c in probe.builds_at(16, 6144, 2048) if c.cluster > 1]
    assert {(c.groups, c.kwarps, c.cluster) for c in twins} == {(8, 1, 4), (16, 1, 2), (8, 2, 2)}
    assert not [c for c in probe.builds_at(16, 8192, 8192) if c.cluster > 1]
    # --every-twin: each build's twin with its column's splits in one cluster on any grid
    every = probe.builds_at(64, 8192, 8192, every_twin=True)
    assert sorted(c.cluster for c in every if c.cluster > 1) == [8, 8, 8, 8, 16, 16, 16, 16]
    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, os.path.join(BENCH, "cuda_probe.py"), "--out",
                              str(tmp_path)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": os.path.join(BENCH, "..", "src")})
        assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def test_cuda_probe_times_each_build_with_both_split_k_reductions_where_they_differ():
    """Over M = 8, each build whose splits add into the workspace is followed by its twin with the
    other reduction; at M <= 8 (one n8 tile), without split-K, or where a cluster covers K, the
    two are one code, so no twin. --preset-only: the preset and its twin."""
    from fp4lab.backends.cuda_w4a16 import choose_config as cuda_choose

    probe = load("cuda_probe")
    builds = probe.builds_at(16, 8192, 8192)
    scalar = [c for c in builds if c.reduce == "scalar"]
    assert [c for c in builds if c.reduce == "vector"] == [dataclasses.replace(c, reduce="vector") for c in scalar]
    assert all(builds[builds.index(c) + 1] == dataclasses.replace(c, reduce="vector") for c in scalar)
    assert {c.reduce for c in probe.builds_at(8, 8192, 8192)} == {"scalar"}
    preset = cuda_choose(16, 4096, 6144)                       # the vector preset: its twin is scalar
    assert probe.builds_at(16, 4096, 6144, grid=()) == [preset, dataclasses.replace(preset, reduce="scalar")]
    assert preset.reduce == "vector"
    assert probe.builds_at(16, 6144, 2048, grid=()) == [cuda_choose(16, 6144, 2048)]      # one split
    assert probe.builds_at(4, 4096, 6144, grid=()) == [cuda_choose(4, 4096, 6144)]
    assert all(c.reduce == "scalar" for c in probe.builds_at(16, 6144, 2048) if c.cluster > 1)


def test_cuda_probe_builds_option_times_the_preset_then_the_listed_builds():
    from fp4lab.backends.cuda_w4a16 import CudaTileConfig, choose_config as cuda_choose

    probe = load("cuda_probe")
    listed = probe.parse_builds("4,4,8,8,1; 2,2,16,16,none")
    assert listed == ((4, 4, 8, 8, 1), (2, 2, 16, 16, None))
    builds = probe.builds_at(1, 4096, 6144, grid=probe.grid_of(listed))
    assert builds[0] == cuda_choose(1, 4096, 6144) and len(set(builds)) == len(builds)
    assert {(c.groups, c.warps, c.kwarps, c.min_ctas, c.overlap) for c in builds[1:]
            if c.cluster == 1} == {(4, 8, 8, 1, "tail"), (4, 8, 8, 1, "all"),
                                  (2, 16, 16, None, "tail"), (2, 16, 16, None, "all")}
    assert all(isinstance(c, CudaTileConfig) for c in builds)


@pytest.mark.parametrize("bad, match", [("4,4,8", "needs 5 fields"), ("4,4,8,3,1", "kwarps"),
                                        ("4,8,8,8,1", "depth"), ("a,4,8,8,1", "invalid literal"),
                                        (" ; ", "takes g,d,w,kw,b")])
def test_cuda_probe_bad_builds_are_named(bad, match):
    probe = load("cuda_probe")
    with pytest.raises(SystemExit, match=match):
        probe.parse_builds(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter run (CPU-only machines)")
def test_device_script_smoke_run_gates_every_row_and_writes_its_files(tmp_path):
    run = run_interpreted("h200_kernels", "--smoke", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "measurements.jsonl").read_text().splitlines()]
    kinds = {row["kind"] for row in rows}
    assert kinds == {"ceilings", "cublas", "dense", "anatomy", "read_floor", "moe_weights", "moe",
                     "moe_part"}
    assert all(row["status"] == "ok" for row in rows), [r for r in rows if r["status"] != "ok"]
    timed = [row for row in rows if row["kind"] in ("dense", "cublas", "anatomy", "moe",
                                                    "moe_part")]
    assert all(row["median_us"] > 0 and row["samples"] == 2 for row in timed)
    assert {r["stage"] for r in rows if r["kind"] == "anatomy"} == set(
        triton_w4a16.ANATOMY_STAGES)
    loads = {r["label"].endswith(" tma") for r in rows if r["kind"] == "anatomy"
             and r["stage"] == "load"}
    assert loads == {True, False}           # the anatomy of both load paths
    layouts = {r["config"]["layout"] for r in rows if r["kind"] == "dense"}
    assert layouts == {"rows", "tiles"}     # and of both weight layouts
    assert {" tiles" in r["label"] for r in rows if r["kind"] == "anatomy"
            and r["stage"] == "load"} == {True, False}
    parts = [r for r in rows if r["kind"] == "moe_part"]   # the best MoE call's launches apart
    assert sorted({r["until"] for r in parts}) == sorted(CALL_PARTS[:-1])
    assert "moe parts" in run.stdout
    assert {r["config"]["loads"] for r in rows if r["kind"] == "moe"} == {"pointer", "tma"}
    assert all(r["predicted_us"] > 0 for r in rows if r["kind"] == "dense")
    floor, = [r for r in rows if r["kind"] == "read_floor"]   # every shape checked, best kept
    assert floor["median_us"] == min(s["median_us"] for s in floor["shapes"])
    assert {s["status"] for s in floor["shapes"]} == {"ok"} and floor["bytes"] % 4 == 0
    presets = json.loads((tmp_path / "presets.json").read_text())
    assert triton_w4a16.presets_from_json(presets["dense"]["nvfp4"])
    assert {(r["model"], r["fmt"]) for r in presets["moe"]} == {("glm-5-scaled", "nvfp4"),
                                                                  ("glm-5-scaled", "mxfp4")}
    assert all(MoeTileConfig(**r["config"]) for r in presets["moe"])
    assert moe_presets_from_json(presets["moe"])[-1][0] is None       # the largest covers all
    namespace = {"TileConfig": TileConfig, "MoeTileConfig": MoeTileConfig}
    exec((tmp_path / "presets_snippet.py").read_text(), namespace)
    assert namespace["SHAPE_PRESETS"] == triton_w4a16.presets_from_json(presets["dense"]["nvfp4"])
    assert namespace["MOE_PRESETS"] == moe_presets_from_json(presets["moe"])
    assert run.stdout.strip().endswith((tmp_path / "summary.txt").read_text().strip())
    assert "rows by status: ok" in run.stdout


def test_device_script_without_a_gpu_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    run = subprocess.run([sys.executable, os.path.join(BENCH, "h200_kernels.py"), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.join(BENCH, "..", "src")})
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def run_probe(tmp_path, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, "gemv_probe.py"), "--out",
                           str(tmp_path), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.path.join(BENCH, "..", "src")})


@pytest.mark.parametrize("bad", ["8192x8192:1", "nvfp4:8192by8192:1", "nvfp4:8192x8192:one"])
def test_probe_names_a_bad_point(tmp_path, bad):
    run = run_probe(tmp_path, "--point", bad)
    assert run.returncode == 2 and "--point wants fmt:NxK:M" in run.stderr, run.stderr


def test_probe_grid_is_valid_gemv_configs_and_without_a_gpu_it_says_so(tmp_path):
    probe = load("gemv_probe")
    grid = [TileConfig(**fields) for fields in probe.PROBE_GRID]
    assert len(set(grid)) == len(grid) and all(c.math == "gemv" for c in grid)
    assert {c.num_stages for c in grid} == set(triton_w4a16.GEMV_DEPTHS)
    if not torch.cuda.is_available():
        run = run_probe(tmp_path)
        assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter run (CPU-only machines)")
def test_layout_probe_smoke_checks_every_variant_exactly(tmp_path):
    run = run_interpreted("layout_probe", "--smoke", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "measurements.jsonl").read_text().splitlines()]
    assert {r["layout"] for r in rows} == {"stream", "rows", "tiles"}
    assert all(r["ok"] and r["median_us"] > 0 for r in rows)
    assert run.stdout.count("exact") == len(rows)


def test_layout_probe_expected_xor_is_per_program():
    probe = load("layout_probe")
    words = np.arange(8 * 8, dtype=np.int32).reshape(8, 8)       # [N, W]
    want = probe.expected(words, bn=2, bkw=2, steps=2)            # programs [4 bands, 2 chunks]
    assert want.shape == (4, 2)
    assert want[1, 1] == np.bitwise_xor.reduce(words[2:4, 4:8], axis=None)


def test_moe_parts_are_differences_of_the_timed_prefixes(device_script):
    what = {"model": "m", "batch": 1, "fmt": "nvfp4", "label": "L"}
    rows = [{"kind": "moe", "median_us": 100.0, **what}] + [
        {"kind": "moe_part", "until": until, "median_us": us, **what}
        for until, us in (("route", 10.0), ("gate_up", 60.0), ("down", 95.0))]
    line = device_script.moe_parts_lines(rows)[-1]
    assert line.split()[3:8] == ["10.0", "50.0", "35.0", "5.0", "L"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter run (CPU-only machines)")
def test_ncu_driver_gates_and_runs_every_launch_it_profiles(tmp_path):
    run = run_interpreted("ncu_profile", "--smoke", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    labels = [line for line in run.stdout.splitlines() if line.startswith("profiled: ")]
    assert [label.split()[4] for label in labels[:4]] == ["full", "load", "stream", "full"]
    assert labels[-1].startswith("profiled: triton-w4a16-moe glm-5-scaled")
    metrics = run_interpreted("ncu_profile", "--metrics", timeout=120).stdout.strip()
    assert metrics.startswith("gpu__time_duration.sum,") and " " not in metrics


def test_gate_map_tells_a_lost_split_from_a_wrong_tile():
    """benchmarks/gate_map.py fits each failing tile as a*first + b*rest: a split that never
    arrived reads (1, 0), a right tile is not listed, and a config string it cannot read is named."""
    gate_map = load("gate_map")
    generator = torch.Generator().manual_seed(0)
    first, rest = torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)
    out = first + rest
    out[:4, :4] = first[:4, :4]                                     # tile (0, 0) lost its second split
    lines = gate_map.tile_map(out, first, rest, 4, 4, 0.02)
    assert len(lines) == 1 and "tokens     0-3" in lines[0]
    fit = dict(part.split("=") for part in lines[0].split("fit ")[1].split())
    assert float(fit["a"]) == pytest.approx(1.0, abs=1e-3) and float(fit["b"]) == pytest.approx(0.0, abs=1e-3)
    config = gate_map.parse_config("m256n128k128 s2 w8 st2 tma")
    assert (config.block_m, config.split_k, config.num_stages, config.loads) == (256, 2, 2, "tma")
    with pytest.raises(SystemExit, match="expected"):
        gate_map.parse_config("m256 s2")
    done = run_interpreted("gate_map", "--shape", "256x512", "--m", "64", "--device", "cpu",
                           "--configs", "m64n128k128 s2 w4 st2 pointer", "--calls", "1")
    assert done.returncode == 0, done.stderr
    assert "0 of 2 tiles over tol" in done.stdout


def test_the_moe_probe_times_the_presets_first_then_sync_and_async_builds():
    from fp4lab.backends.moe.cuda_fused import choose_moe_config

    probe = load("cuda_moe_probe")
    for fmt in ("nvfp4", "mxfp4"):
        assert probe.GRID[0] == choose_moe_config(512 * 8, 256, fmt)  # GLM-5 at B = 512
    assert len(set(probe.GRID)) == len(probe.GRID)
    assert {c.mma for c in probe.GRID} == {"sync", "async"}
    assert {(c.mma, c.weights) for c in probe.GRID} == {("sync", "registers"), ("sync", "shared"),
                                                        ("async", "registers"), ("async", "shared")}
    assert {c.row_tiles for c in probe.GRID} == {1, 2}
    assert all(c.warps % 4 == 0 for c in probe.GRID if c.mma == "async")
    # the first point times its own preset first: the few-pair preset at B = 64, 64-pair items
    # beside the 32-pair preset over 32 pairs an expert
    few = choose_moe_config(64 * 8, 256, "nvfp4")
    assert probe.first_point_builds(few, 2.0) == [few, *probe.GRID]
    many = choose_moe_config(2048 * 8, 256, "nvfp4")
    builds = probe.first_point_builds(many, 64.0)
    assert builds[0] == many and len(set(builds)) == len(builds)
    assert set(builds) == set(probe.LARGE_GRID) | {probe.GRID[0]}      # the 32-pair preset too
    assert {c.rows for c in probe.LARGE_GRID} == {64}
    # --grid more-warps: the preset, then four CTAs of 8 warps with the ring (their shared memory
    # fits four an SM) and the 16-warp register build they are set against
    preset = choose_moe_config(512 * 8, 256, "nvfp4")
    assert probe.first_point_builds(preset, 16.0, "more-warps") == [preset, *probe.MORE_WARPS_GRID]
    four = [c for c in probe.MORE_WARPS_GRID if c.min_ctas == 4]
    assert len(four) == 2 and all(4 * c.shared_bytes <= 228 * 1024 and c.register_cap == 64 for c in four)
    assert all(c.reason(4096, 6144, "gate_up") is None for c in probe.MORE_WARPS_GRID)
    # --grid buffers: the preset, then it with three staged buffers, twice the chunk, and both
    variants = probe.first_point_builds(preset, 16.0, "buffers")
    assert variants[0] == preset and len(set(variants)) == 4
    assert [(c.chunk, c.buffers) for c in variants] == [(4, 2), (4, 3), (8, 2), (8, 3)]
    assert all(dataclasses.replace(c, chunk=4, buffers=2) == preset for c in variants)
    assert probe.first_point_builds(preset, 16.0, "preset") == [preset]     # --grid preset


def test_the_moe_probe_builds_a_baseline_kernel_file_only_inside_its_block(tmp_path, tune):
    """--baseline-kernel: inside `kernel_source_from` every build is another file's text; the
    package's own file after; a missing file is refused before any GPU work."""
    from fp4lab.backends.moe import cuda_fused

    probe = load("cuda_moe_probe")
    old = tmp_path / "old_kernel.cu"
    old.write_text("// an earlier kernel\n")
    config = cuda_fused.CudaMoeConfig()
    own, _ = cuda_fused.build(config, "nvfp4", True)
    with tune.kernel_source_from(cuda_fused, old):
        source, _ = cuda_fused.build(config, "nvfp4", True)
        assert source.endswith("// an earlier kernel\n")
    assert cuda_fused.build(config, "nvfp4", True)[0] == own
    with pytest.raises(SystemExit, match="no file"):
        probe.main(["--out", str(tmp_path / "out"), "--baseline-kernel", str(tmp_path / "none.cu")])


@pytest.mark.parametrize("backend", ["dense", "moe"])
def test_a_baseline_kernel_file_swapped_in_twice_compiles_each_file_once(
        backend, tmp_path, monkeypatch, tune):
    """A probe with --baseline-kernel enters `kernel_source_from` once for the baseline's timed
    row and again for the alternated one: the builds are cached by kernel file, so each file's
    build compiles once, and each call gets its own file's build (a fake NVRTC that returns the
    source it was given)."""
    from fp4lab.backends import cuda_w4a16
    from fp4lab.backends.moe import cuda_fused

    sources = []
    monkeypatch.setattr(torch.cuda, "_compile_kernel",
                        lambda source, name, **options: sources.append(source) or source,
                        raising=False)
    if backend == "dense":
        module, build = cuda_w4a16, lambda: cuda_w4a16.compiled(
            cuda_w4a16.CudaTileConfig(), "nvfp4", 2, (9, 0))
    else:
        module, build = cuda_fused, lambda: cuda_fused.compiled(
            cuda_fused.CudaMoeConfig(), "nvfp4", True, (9, 0))
    module._compiled.cache_clear()
    old = tmp_path / "old_kernel.cu"
    old.write_text("// an earlier kernel\n")
    own = build()
    for _ in range(2):
        with tune.kernel_source_from(module, old):
            assert build().endswith("// an earlier kernel\n")
        assert build() == own
    assert len(sources) == 2
    module._compiled.cache_clear()


def scripted_timer(monkeypatch, medians: dict[str, list[float]]) -> list[str]:
    """bench.time_call answering each call's next scripted median; returns the labels in the
    order the calls were timed (a call's `args` is its label)."""
    from fp4lab import bench

    order, left = [], {label: list(times) for label, times in medians.items()}

    def time_call(make_call, args, out, config=None, device="auto"):
        order.append(args)
        median = left[args].pop(0)
        return bench.summarize([median], graph=False, cold_l2=False, sm_clock_mhz=None)

    monkeypatch.setattr(bench, "time_call", time_call)
    return order


def test_alternate_times_the_calls_in_turn_and_its_ratio_cancels_a_drift(monkeypatch, tune):
    """A clock that drifts 30% over the rounds moves both calls alike: the per-round ratio is the
    change (0.95), where one median each, A then B at the ends, would read 1.235."""
    order = scripted_timer(monkeypatch, {"old": [100.0, 110.0, 120.0, 130.0],
                                         "new": [95.0, 104.5, 114.0, 123.5]})
    calls = {"old": (None, "old", None), "new": (None, "new", None)}
    result = tune.alternate(calls, timer=None, device="cpu", rounds=4)
    assert order == ["old", "new"] * 4
    assert result["round_us"] == {"old": [100.0, 110.0, 120.0, 130.0], "new": [95.0, 104.5, 114.0, 123.5]}
    assert result["ratio"] == {"new": pytest.approx(0.95)} and result["rounds"] == 4
    with pytest.raises(ValueError, match="2\\+ calls and 1\\+ rounds"):
        tune.alternate({"old": calls["old"]}, None, "cpu")
    with pytest.raises(ValueError, match="got 2 and 0"):
        tune.alternate(calls, None, "cpu", rounds=0)


def test_the_moe_probe_alternates_the_baseline_build_with_the_packages_after_gating_both(
        monkeypatch, tmp_path, tune):
    """--baseline-kernel's alternated row: the baseline call prepared inside its kernel file, the
    package's outside, both gated before either is timed; a gate that fails stops the row."""
    from fp4lab.backends.moe import cuda_fused

    probe = load("cuda_moe_probe")
    old_file = tmp_path / "old_kernel.cu"
    old_file.write_text("// an earlier kernel\n")
    prepared_from, gated = [], []

    class Call:
        def __init__(self, source):
            self.make_call, self.args, self.out = None, source, None

    class Method:
        def prepare(self, problem, config=None):
            prepared_from.append(cuda_fused.KERNEL_SOURCE)
            return Call(cuda_fused.KERNEL_SOURCE.name)

    class Gate:
        def __init__(self, ok):
            self.ok, self.status, self.rel_err = ok, "ok" if ok else "wrong", 0.5
            self.message = "fine" if ok else "rel_err 5e-01 > tol"

    monkeypatch.setattr(probe, "get_moe", lambda name: Method())
    monkeypatch.setattr(probe.moe_base, "check_call", lambda call, problem: gated.append(call.args) or Gate(True))
    package = cuda_fused.KERNEL_SOURCE.name
    order = scripted_timer(monkeypatch, {"old_kernel.cu": [200.0] * 4, package: [190.0] * 4})
    run = type("Run", (), {"timer": None, "device": "cpu"})()
    row = probe.alternated_row(run, problem=None, config=cuda_fused.CudaMoeConfig(), baseline=old_file)
    assert [path.name for path in prepared_from] == ["old_kernel.cu", package]
    assert gated == ["old_kernel.cu", package] and order == ["old_kernel.cu", package] * 4
    assert row["status"] == "ok" and row["ratio"] == {"current": pytest.approx(0.95)}
    assert "current / baseline 0.950 (median of 4 alternated rounds)" == row["message"]
    monkeypatch.setattr(probe.moe_base, "check_call", lambda call, problem: Gate(call.args == package))
    failed = probe.alternated_row(run, problem=None, config=cuda_fused.CudaMoeConfig(), baseline=old_file)
    assert failed["status"] == "wrong" and "round_us" not in failed


def test_the_dense_probe_alternates_its_baseline_and_says_why_when_a_build_fails(monkeypatch,
                                                                                 tmp_path, tune):
    """cuda_probe's alternated row: gated calls timed in turn, the ratio in its message; a build
    that cannot compile is an error row naming why, not a crash of the probe."""
    from fp4lab import correctness
    from fp4lab.backends import cuda_w4a16

    probe = load("cuda_probe")
    old_file = tmp_path / "old_kernel.cu"
    old_file.write_text("// an earlier kernel\n")
    package = cuda_w4a16.KERNEL_SOURCE.name

    class Backend:
        def prepare(self, a, w, device, config=None):
            if cuda_w4a16.KERNEL_SOURCE.read_text().startswith("// broken"):
                raise RuntimeError("NVRTC: error: expected a ;")
            source = cuda_w4a16.KERNEL_SOURCE.name
            return type("Prepared", (), {"make_call": None, "args": source, "out": None})()

    passed = type("Gate", (), {"ok": True})()
    monkeypatch.setattr(probe, "get", lambda name: Backend())
    monkeypatch.setattr(correctness, "check_backend", lambda prepared, tolerance: passed)
    scripted_timer(monkeypatch, {"old_kernel.cu": [10.0] * 4, package: [11.0] * 4})
    point, config = tune.Point("nvfp4", 8192, 8192, 16), cuda_w4a16.choose_config(16, 8192, 8192)
    row = probe.alternated_row(old_file, config, point, None, None, "cpu", None)
    assert row["status"] == "ok" and row["ratio"] == {"current": pytest.approx(1.1)}
    old_file.write_text("// broken kernel\n")
    row = probe.alternated_row(old_file, config, point, None, None, "cpu", None)
    assert row == {"status": "error", "message": "RuntimeError: NVRTC: error: expected a ;"}


def test_the_moe_probe_goes_on_when_its_budget_ends_inside_a_point(monkeypatch, capsys):
    """A step the deadline leaves out is None: the point says so and ranks no build (call 107
    stopped with a TypeError there)."""
    probe = load("cuda_moe_probe")
    monkeypatch.setattr(probe.moe_base, "make_layer_problem", lambda *args, **kwargs: None)

    class SpentRun:
        device = "cpu"

        def step(self, kind, what, work):
            return None

    model = probe.kernels.moe_model("glm-5", True)
    assert probe.probe_point(SpentRun(), model, 16, "nvfp4", None, probe.GRID, anatomy=True) == []
    assert capsys.readouterr().out.count("(skipped: the budget is spent)") == 2 + len(probe.GRID)


def test_the_moe_clock_probe_groups_replays_by_the_nearest_sm_clock_and_needs_a_gpu():
    """Each replay is joined to the telemetry sample nearest in time: two clocks give two groups
    with their own times, and the window's power and clock-event reasons are named."""
    import numpy as np
    import pandas as pd

    probe = load("moe_clock_probe")
    t = 1e9 + np.arange(0, 2, 0.01)
    slow = t >= 1e9 + 1
    samples = pd.DataFrame({"t": t, "sm_clock_mhz": np.where(slow, 1700, 1980),
                            "power_instant_w": np.where(slow, 690.0, 640.0), "power_limit_w": 700.0,
                            "throttle_reasons": np.where(slow, "sw_power_cap;hw_slowdown", "none")})
    replays = [{"t": x, "us": 2050.0 if x >= 1e9 + 1 else 1790.0, "calls": 10}
               for x in 1e9 + np.arange(0.005, 2, 0.02)]
    lines = probe.summary("cuda-w4a16-moe", replays, samples)
    assert len(lines) == 4
    assert "[0, 1800)" in lines[0] and "median   2050.0 us" in lines[0] and "50 replays" in lines[0]
    assert "[1950, 10000)" in lines[1] and "median   1790.0 us" in lines[1]
    # the fall's onset, counted from when the load began (the first replay's start), and the
    # calls' time before it and once the clock settled
    assert lines[2].endswith("SM clock fell under 97% of 1980 MHz 1.013 s into the load; calls before "
                             "1790.0 us (50 replays), from 0.5 s after 2050.0 us at 1700 MHz")
    assert "690 W max (limit 700)" in lines[3] and "SM clock 1700-1980 MHz" in lines[3]
    assert "clock-event reasons: hw_slowdown, none, sw_power_cap" in lines[3]
    held = probe.summary("cuda-w4a16-moe", replays, samples.assign(sm_clock_mhz=1980))
    assert held[1].endswith("SM clock held 1980 MHz throughout")
    if not torch.cuda.is_available():
        assert probe.main(["--out", "unused"]) == 2


def test_the_wgmma_probe_runs_the_async_builds_own_code_and_needs_a_gpu():
    """Its device code is the async build's (the generated wgmma_step, the kernel's descriptor)
    followed by the probe kernel; without a GPU it says so and exits 2."""
    from fp4lab.backends.moe.cuda_fused import KERNEL_SOURCE, generated_source

    probe = load("wgmma_probe")
    source = probe.probe_source()
    assert generated_source(probe.NTILES, asynchronous=True) in source
    assert KERNEL_SOURCE.read_text() in source
    assert source.index("staged_descriptor(u32 address)") < source.index("wgmma_probe(")
    assert "-DMMA_ASYNC=1" in probe.DEFINES and probe.ROWS == 8 * probe.NTILES
    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, os.path.join(BENCH, "wgmma_probe.py")], capture_output=True,
                             text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "src")})
        assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def test_the_nvrtc_check_compiles_the_presets_and_the_probe_grid_and_says_when_it_cannot(capsys):
    """Its builds are both formats' presets then the probe's grids, once each; without the
    library it says which path failed and exits 2 before compiling anything."""
    from fp4lab.backends.moe.cuda_fused import MOE_PRESETS

    check = load("nvrtc_check")
    builds = check.builds()
    presets = [config for entries in MOE_PRESETS.values() for _, config in entries]
    assert builds[:len(set(presets))] == list(dict.fromkeys(presets))
    probe = load("cuda_moe_probe")
    variants = {v for preset in presets for v in probe.buffer_variants(preset)}
    assert set(builds) == (set(presets) | set(probe.GRID) | set(probe.LARGE_GRID) | set(probe.MORE_WARPS_GRID)
                           | variants)
    assert len(set(builds)) == len(builds)
    assert check.problems(0, "ptxas info    : (C7519) warpgroup.arrive is injected") == []
    assert check.problems(0, "ptxas info : (C7515) Potential Performance Loss: wgmma serialized")
    assert check.problems(6, "") == ["NVRTC result 6"]
    assert check.main(["--nvrtc", "/nonexistent/libnvrtc.so.13"]) == 2
    assert "cannot load /nonexistent/libnvrtc.so.13" in capsys.readouterr().err


def test_the_moe_ncu_script_labels_each_launch_and_summarizes_ncus_rows(tmp_path):
    """Its launches are each build's stages' gate_up and down, in order; the summary joins ncu's
    raw rows with them (stall reasons largest first) and says when the counts differ."""
    script = load("ncu_cuda_moe")
    names = script.labels()
    assert len(names) == 2 * sum(len(stages) for _, stages in script.BUILDS) == len(set(names))
    assert names[0].endswith("stage full gate_up") and names[1].endswith("stage full down")
    metrics = ["gpu__time_duration.sum", "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
               "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
               "smsp__average_warps_issue_stalled_not_issued_per_issue_active.ratio",
               "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"]
    raw = tmp_path / "raw.csv"
    raw.write_text("==PROF== Connected\n" + ",".join(f'"{m}"' for m in metrics) + "\n"
                   + ",".join('"x"' for _ in metrics) + "\n"
                   + '"1,400.5","0.50","3.25","9.0","12.50"\n' + '"700.0","2.00","0.10","9.0","55"\n')
    text = script.summary(script.ncu_rows(raw), ["a gate_up", "a down"])
    first, second = text.split("a down")
    assert "time" in first and "1,400.5" in first and "not_issued" not in text
    assert "pipe tensor_op_hmma" in first and "12.50 % busy" in first
    assert first.index("long_scoreboard") < first.index("math_pipe_throttle")
    assert second.index("math_pipe_throttle") < second.index("long_scoreboard")
    assert "not joined" in script.summary(script.ncu_rows(raw), ["only one"])


# -- benchmarks/triton_sass.py: whether the tensor-core presets keep their wgmma in flight ---------

SASS_SERIALIZED = """
        /*1c60*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0 ;
        /*1cf0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*1ed0*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0 ;
        /*1f40*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""
SASS_IN_FLIGHT = """
        /*1c60*/                   HGMMA.64x16x16.F32.BF16 R24, R88, gdesc[UR12], R24 ;
        /*1c70*/                   HGMMA.64x16x16.F32.BF16 R24, R92, gdesc[UR14], R24 ;
        /*1c80*/                   HGMMA.64x16x16.F32.BF16 R24, R96, gdesc[UR16], R24, gsb0 ;
        /*1cf0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*1d00*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""


def test_the_sass_reader_counts_each_wgmma_waited_for_before_the_next():
    sass = load("triton_sass")
    assert sass.waited_wgmma(SASS_SERIALIZED) == (2, 2)
    assert sass.waited_wgmma(SASS_IN_FLIGHT) == (3, 1)   # one full wait, after the last


def test_the_sass_reader_names_a_point_it_cannot_parse():
    sass = load("triton_sass")
    assert sass.parse_points("nvfp4:8192x8192:64, mxfp4:4096x6144:256") == [
        ("nvfp4", 8192, 8192, 64), ("mxfp4", 4096, 6144, 256)]
    with pytest.raises(ValueError, match="'fp8:8192x8192:64'"):
        sass.parse_points("nvfp4:8192x8192:64,fp8:8192x8192:64")


def test_the_sass_reader_compiles_a_preset_for_sm90_without_a_gpu(capsys):
    """The M = 16 preset built as the backend launches it, by the installed Triton's own ptxas:
    its wgmma are found (how many are waited for is what the script reports, per compiler)."""
    sass = load("triton_sass")
    assert sass.main(["--points", "nvfp4:8192x8192:16"]) == 0
    line = capsys.readouterr().out.splitlines()[-1].split()
    assert line[:3] == ["nvfp4", "8192x8192", "16"] and "swap" in line
    issued, waited = int(line[-2]), int(line[-1])
    assert issued > 0 and 0 <= waited <= issued


# -- benchmarks/moe_kernel_dense_probe.py: the fused MoE kernel as a dense GEMM -------------------

@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_the_k_slice_experts_hold_the_weights_bytes_in_order(fmt):
    """The emulated split-K: expert s is W's s-th K slice, with W's own scales and global scale,
    so the summed partials are W's product exactly as the gate's reference computes it."""
    from fp4lab import formats
    from fp4lab.backends.moe.base import _expert

    probe = load("moe_kernel_dense_probe")
    w = formats.quantize(torch.randn(32, 512), fmt)
    stacked = probe.split_weights(w, 4)
    assert stacked.shape == (4, 32, 128)
    parts = [formats.dequantize(_expert(stacked, s)) for s in range(4)]
    assert torch.equal(torch.cat(parts, dim=1), formats.dequantize(w))


def test_the_dense_work_items_cover_every_token_of_every_split_once():
    probe = load("moe_kernel_dense_probe")
    tables = probe.work_tables(130, 2, "cpu")          # 64 + 64 + 2 tokens a split
    assert tables.work_expert.tolist() == [0, 0, 0, 1, 1, 1]
    assert tables.work_start.tolist() == [0, 64, 128, 130, 194, 258]
    assert tables.work_rows.tolist() == [64, 64, 2, 64, 64, 2]
    assert tables.sorted_pairs.tolist() == list(range(260))


def test_the_dense_probe_without_a_gpu_says_so(tmp_path):
    done = run_interpreted("moe_kernel_dense_probe", "--out", str(tmp_path), "--m", "64")
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


# -- benchmarks/humming_sass.py: humming's tensor-core instructions --------------------------------

def test_the_humming_reader_splits_a_listing_by_function():
    reader = load("humming_sass")
    listing = ("\n\tcode for sm_90\n\t\tFunction : _Z7hummingI64\n" + SASS_SERIALIZED
               + "\t\tFunction : _Z7hummingI16\n        /*0100*/  HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n")
    found = dict(reader.functions(listing))
    assert list(found) == ["_Z7hummingI64", "_Z7hummingI16"]
    assert reader.waited_wgmma(found["_Z7hummingI64"]) == (2, 2)
    assert len(reader.HMMA.findall(found["_Z7hummingI16"])) == 1


def _moe_row(method, batch, ep=1, gemm="layer", fmt="nvfp4", median_us=1500.0, samples=30, calls=2,
             clock=1980.0, status="ok", preset="glm-5", stage=None):
    row = {"method": method, "preset": preset, "fmt": fmt, "batch": batch, "ep": ep, "gemm": gemm,
           "median_us": median_us, "samples": samples, "calls_per_sample": calls, "sm_clock_mhz": clock,
           "status": status}
    return {**row, "stage": stage} if stage else row


def test_the_burst_re_sweep_takes_capped_long_bursts_and_plans_sweeps_that_add_no_point():
    """The rows the burst cut would change: a burst past 45 ms whose clock fell, or fp4lab's fused
    MoE's; short bursts and failed rows stay. The sweeps give each method only its own batches,
    share a sweep only between methods with the same batches, and start with the largest; the dense
    curve needs none (every sweep of the preset measures it)."""
    burst_rows = load("moe_burst_rows")
    rows = [_moe_row("cuda-w4a16-moe", b) for b in (64, 512, 2048)]                # always, when long
    rows += [_moe_row("cuda-w4a16-moe", 64, ep=8, median_us=200.0, calls=4)]         # 24 ms: kept
    rows += [_moe_row("humming-moe-indexed", 2048, clock=1912.5, calls=1, median_us=4200.0),
             _moe_row("triton-w4a16-moe", 2048, clock=1912.5, calls=1, median_us=5500.0),
             _moe_row("humming-moe-indexed", 512, clock=1980.0)]                     # held its clock
    rows += [_moe_row("grouped-bf16", 64, gemm="down", fmt=None, clock=1897.5),
             _moe_row("grouped-bf16", 2048, gemm="gate_up", fmt=None, clock=1875.0, calls=1, median_us=3800.0),
             _moe_row("dense-bf16", None, gemm="gate_up", fmt=None, clock=1777.5, calls=45, median_us=39.0),
             _moe_row("padded-bf16", 512, clock=1700.0, status="error", median_us=None)]
    chosen = burst_rows.capped_rows(rows, 1980.0)
    assert [(r["method"], r["batch"]) for r in chosen] == [
        ("cuda-w4a16-moe", 64), ("cuda-w4a16-moe", 512), ("cuda-w4a16-moe", 2048),
        ("humming-moe-indexed", 2048), ("triton-w4a16-moe", 2048), ("grouped-bf16", 64),
        ("grouped-bf16", 2048), ("dense-bf16", None)]
    assert burst_rows.sweeps(chosen) == [
        ("glm-5", 1, (64, 512, 2048), ("cuda-w4a16-moe",)),
        ("glm-5", 1, (64, 2048), ("grouped-bf16",)),                  # ties in name order
        ("glm-5", 1, (2048,), ("humming-moe-indexed", "triton-w4a16-moe"))]
    assert "cuda-w4a16-moe" in burst_rows.describe({**chosen[0], "stage": "load"})
