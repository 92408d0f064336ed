"""triton-w4a16-moe: the routing tables (pure torch), the config, and both fused kernels under the
Triton interpreter (CPU) on tiny layers with idle experts and one very busy expert, gated by
`check_call` against the float64 layer reference."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fp4lab.backends import moe
from fp4lab.backends.moe.triton_fused import (
    CALL_PARTS, MoeTileConfig, TritonW4A16Moe, choose_moe_config, max_work_items,
)

REPO = os.path.join(os.path.dirname(__file__), "..")


def skewed_ids(tokens: int, experts: int, top_k: int, busy: int, seed: int = 0) -> np.ndarray:
    """[T, k] distinct experts per token; expert `busy` in every token, the last two idle."""
    rng = np.random.default_rng(seed)
    others = [e for e in range(experts - 2) if e != busy]
    return np.stack([[busy, *rng.choice(others, top_k - 1, replace=False)]
                     for _ in range(tokens)])


def test_registered_as_a_layer_method_for_both_formats():
    method = moe.get("triton-w4a16-moe")
    assert isinstance(method, TritonW4A16Moe) and "triton-w4a16-moe" in moe.names("layer")
    assert method.formats == ("nvfp4", "mxfp4") and method.weight_dtype == "fp4"
    assert "timed" in method.note


def test_work_item_bound_holds_for_any_loads():
    for pairs, experts, block_m in [(64, 256, 16), (4096, 256, 32), (300, 8, 16), (1, 4, 64)]:
        # the worst case: as many experts as possible with a partial tile
        loads = np.full(min(pairs, experts), pairs // min(pairs, experts))
        loads[: pairs - loads.sum()] += 1
        needed = int(np.ceil(loads / block_m).sum())
        assert needed <= max_work_items(pairs, experts, block_m)


@pytest.mark.parametrize("pairs,block_m", [(64 * 8, 16), (512 * 8, 32), (2048 * 8, 32)])
def test_presets_cover_the_busiest_uniform_expert_at_glm5_batches(pairs, block_m):
    assert choose_moe_config(pairs, 256).block_m == block_m


@pytest.mark.parametrize("field,value", [("block_m", 8), ("block_n_down", 96), ("block_k", 32),
                                         ("num_warps", 3), ("num_stages", 0), ("decode", "x"),
                                         ("loads", "bulk")])
def test_bad_moe_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"MoeTileConfig.{field}"):
        MoeTileConfig(**{field: value})


MOE_SCRIPT = r"""
import json, sys, numpy as np, torch
from fp4lab.backends.moe import base, get, triton_fused_kernel
from fp4lab.backends.moe.triton_fused import CALL_PARTS, MoeTileConfig, RouteTables
sys.path.insert(0, sys.argv[2])
from test_triton_moe import skewed_ids

# the route kernel alone, twice on the same tables (its cursor must be back at zero)
ids = torch.tensor(skewed_ids(40, 8, 2, busy=5), dtype=torch.int32)
tables = RouteTables.empty(ids.numel(), 8, 16, "cpu")
for _ in range(2):
    tables.sorted_pairs.fill_(-1)
    triton_fused_kernel.launch_route(ids, 8, 16, tables)
routing = {name: getattr(tables, name).tolist()
           for name in ("sorted_pairs", "work_expert", "work_start", "work_rows", "cursor")}
routing["ids"] = ids.reshape(-1).tolist()

results = []
for case in json.loads(sys.argv[1]):
    ids = skewed_ids(case["tokens"], case["experts"], case["top_k"], busy=1, seed=case["seed"])
    problem = base.make_layer_problem(ids, case["experts"], case["hidden"], case["inter"],
                                      case["fmt"], "cpu", seed=case["seed"])
    call = get("triton-w4a16-moe").prepare(problem, config=MoeTileConfig(**case["config"]))
    gates = [base.check_call(call, problem) for _ in range(2)]
    results.append({"ok": [g.ok for g in gates], "message": gates[0].message,
                    "loads": problem.loads.tolist(), "weight_bytes": call.weight_bytes})

# the call stopped after each launch (timed apart on the GPU): the output is left alone until
# the top-k sum writes it, and the whole call is the gated one
parts = {}
for until in CALL_PARTS:
    call = get("triton-w4a16-moe").prepare(problem, config=MoeTileConfig(**case["config"]), until=until)
    call.out.fill_(float("nan"))
    parts[until] = bool(torch.isnan(call.call()).all())
try:
    get("triton-w4a16-moe").prepare(problem, until="gate")
except ValueError as exc:
    parts["refused"] = str(exc)
try:   # an N tile that does not divide I: a tile would span the gate and up halves
    get("triton-w4a16-moe").prepare(problem, config=MoeTileConfig(block_n_gate_up=128, layout="tiles"))
except ValueError as exc:
    parts["tiles_refused"] = str(exc)
print(json.dumps({"routing": routing, "layers": results, "parts": parts}))
"""

# both formats; H and I tails shorter than BLOCK_K (EVEN_K off) and exact multiples; a busy expert
# with more pairs than BLOCK_M (several work items), idle experts (no work item); TMA weight
# loads with the scales by pointer (BK/S < 16) and, at BK 256 in nvfp4, by descriptor too, with
# weight tiles that run past an expert's rows (N 160 and 96 in tiles of 64); the tiled weight
# layout over all experts' rows by pointer and by TMA (with K tails: H 160 and I 96 in BK 256)
MOE_CASES = [
    {"fmt": fmt, "tokens": tokens, "experts": 8, "top_k": 2, "hidden": hidden, "inter": inter,
     "seed": seed, "config": config}
    for fmt in ("nvfp4", "mxfp4")
    for tokens, hidden, inter, seed, config in [
        (20, 128, 64, 0, {"block_m": 16, "block_n_gate_up": 16, "block_n_down": 32,
                          "block_k": 64}),
        (9, 160, 96, 1, {"block_m": 16, "block_n_gate_up": 32, "block_n_down": 64,
                         "block_k": 128}),
        (20, 128, 64, 2, {"block_m": 16, "block_n_gate_up": 16, "block_n_down": 32,
                          "block_k": 64, "loads": "tma"}),
        (9, 96, 160, 3, {"block_m": 16, "block_n_gate_up": 64, "block_n_down": 64,
                         "block_k": 256, "loads": "tma"}),
        (20, 128, 64, 4, {"block_m": 16, "block_n_gate_up": 16, "block_n_down": 32,
                          "block_k": 64, "layout": "tiles"}),
        (9, 160, 96, 5, {"block_m": 16, "block_n_gate_up": 32, "block_n_down": 32,
                         "block_k": 256, "loads": "tma", "layout": "tiles"}),
    ]
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CPU-only machines)")
def test_fused_moe_passes_the_layer_gate_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(REPO, "src")}
    run = subprocess.run([sys.executable, "-c", MOE_SCRIPT, json.dumps(MOE_CASES),
                          os.path.dirname(__file__)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for spec, result in zip(MOE_CASES, report["layers"]):
        assert result["ok"] == [True, True], (spec, result)
        loads = result["loads"]
        assert loads[-2:] == [0, 0] and max(loads) == spec["tokens"]
        active = sum(1 for load in loads if load)
        per_expert = 3 * spec["hidden"] * spec["inter"] * (0.5 + (1 / 16 if spec["fmt"] == "nvfp4"
                                                                    else 1 / 32))
        assert result["weight_bytes"] == pytest.approx(active * per_expert)
    assert max(r["loads"][1] for r in report["layers"]) > 16   # a case with several work items
    check_routing(report["routing"], experts=8, block_m=16, busy=5)
    parts = report["parts"]
    assert [parts[p] for p in CALL_PARTS] == [True, True, True, False]   # only the sum writes out
    assert "until must be one of" in parts["refused"] and "'gate_up'" in parts["refused"]
    assert "needs I (gate_up) = 96 to be a multiple of its N tile, 128" in parts["tiles_refused"]


def check_routing(routing: dict, experts: int, block_m: int, busy: int) -> None:
    """Every pair once, grouped by expert; work items cover each expert's pairs in tiles of at
    most block_m, busiest expert first; idle experts have none; the cursor is back at zero."""
    ids = routing["ids"]
    order = routing["sorted_pairs"]
    assert sorted(order) == list(range(len(ids)))                       # a permutation
    grouped = [ids[p] for p in order]
    assert grouped == sorted(grouped)                                   # by expert
    items = [(e, s, r) for e, s, r in zip(routing["work_expert"], routing["work_start"],
                                          routing["work_rows"]) if e >= 0]
    assert all(e == -1 for e in routing["work_expert"][len(items):])    # padding at the end
    covered = []
    for e, start, rows in items:
        assert 1 <= rows <= block_m and set(grouped[start:start + rows]) == {e}
        covered.extend(range(start, start + rows))
    assert sorted(covered) == list(range(len(ids)))                     # each pair once
    loads = [ids.count(e) for e in range(experts)]
    assert [e for e, _, _ in items][:3] == [busy] * 3                   # 40 pairs: 3 tiles, first
    firsts = [e for i, (e, _, _) in enumerate(items) if i == 0 or items[i - 1][0] != e]
    assert [loads[e] for e in firsts] == sorted((loads[e] for e in firsts), reverse=True)
    assert not {e for e, _, _ in items} & {e for e in range(experts) if loads[e] == 0}
    assert set(routing["cursor"]) == {0}


def test_moe_presets_from_json_orders_by_mean_and_covers_every_batch():
    from fp4lab.backends.moe.triton_fused import moe_presets_from_json

    small, mid, big = (MoeTileConfig(block_m=m, block_k=128) for m in (16, 32, 64))
    rows = [{"fmt": "nvfp4", "mean_pairs_per_expert": mean, "config": vars(c)}
            for mean, c in ((16.0, mid), (2.0, small), (64.0, big), (16.0, small))]
    rows.append({"fmt": "mxfp4", "mean_pairs_per_expert": 1.0, "config": vars(big)})
    assert moe_presets_from_json(rows) == ((2.0, small), (16.0, mid), (None, big))


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("loads", ["pointer", "tma"])
@pytest.mark.parametrize("block_k", [128, 256])
@pytest.mark.parametrize("layout", ["rows", "tiles"])
def test_fused_moe_on_the_gpu(fmt, loads, block_k, layout):
    """Both load paths and layouts compiled: N tails (I 352 and H 1056 in tiles of 64 and 128
    rows; the tiled layout in whole tiles of 32), a busy expert over several work items, idle
    experts; the gate twice on the same call."""
    from fp4lab.backends.moe import base

    ids = skewed_ids(40, 8, 2, busy=3, seed=4)
    problem = base.make_layer_problem(ids, 8, 1056, 352, fmt, "cuda", seed=4)
    tiles = dict(block_n_gate_up=32, block_n_down=32) if layout == "tiles" else {}
    config = MoeTileConfig(block_m=16, block_k=block_k, loads=loads, layout=layout, **tiles)
    call = moe.get("triton-w4a16-moe").prepare(problem, config=config)
    for _ in range(2):
        gate = base.check_call(call, problem)
        assert gate.ok, gate.message
