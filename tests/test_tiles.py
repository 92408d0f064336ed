"""fp4lab.tiles: which CUTLASS FP4 tiles fit each GPU's shared memory, and `smem-fit`."""

from __future__ import annotations

import json

import pytest

from fp4lab import cli, tiles
from fp4lab.hardware import SPECS


def row(gpu: str, kind: str, tile: str) -> dict:
    matches = [r for r in tiles.fit_rows([gpu]) if r["kind"] == kind and r["tile"] == tile]
    assert len(matches) == 1, (gpu, kind, tile)
    return matches[0]


@pytest.mark.parametrize("tile", ["128x256x128", "256x128x128"])
def test_the_seeds_two_moe_tiles_overflow_the_rtx_pro_6000_and_fit_the_b200(tile):
    rtx, b200 = row("rtx-pro-6000", "moe", tile), row("b200", "moe", tile)
    assert rtx["seed"] and rtx["k_values"] == 256            # 128 bytes of FP4 = 256 values
    assert rtx["fits"] is False and rtx["stages"] < tiles.MIN_STAGES
    assert rtx["smem_kb"] > rtx["limit_kb"] == 99
    assert b200["fits"] is True and b200["stages"] >= tiles.MIN_STAGES
    assert b200["smem_kb"] <= b200["limit_kb"] == 227


def test_their_k64_halves_that_flashinfer_0_7_lists_for_sm120_fit_with_three_stages():
    for tile in ("128x256x64", "256x128x64"):
        fitted = row("rtx-pro-6000", "moe", tile)
        assert fitted["listed"] and fitted["fits"] and fitted["stages"] == 3


def test_the_four_named_tiles_are_shown_for_every_fp4_gpu():
    for gpu in ("b200", "rtx-pro-6000", "rtx-5090"):
        shown = {r["tile"] for r in tiles.fit_rows([gpu]) if r["kind"] == "moe"}
        assert {"128x128x128", "128x256x128", "256x128x128", "64x128x128"} <= shown


def test_the_stage_bytes_follow_the_stated_formula():
    # 128x128 tile of 256 values: A and B 128*256/2 each, SFA and SFB 128*256/16 each, 128 barriers
    assert tiles.stage_bytes(tiles.FAMILIES["sm_120"], 128, 128, 256) == 16384 * 2 + 2048 * 2 + 128
    # sm_120 pads the B scales to 128 rows, sm_100 rounds rows up to 128-row blocks too
    assert tiles.stage_bytes(tiles.FAMILIES["sm_120"], 128, 32, 128) == 8192 + 2048 + 1024 + 1024 + 128


def test_stages_are_what_fits_after_the_carve_outs_and_smem_adds_up():
    for r in tiles.fit_rows(["rtx-pro-6000", "b200"]):
        limit = r["limit_kb"] * 1024
        fixed = r["epilogue_bytes"] + r["kernel_bytes"]
        assert r["stages"] == (limit - fixed) // r["stage_bytes"]
        assert r["smem_bytes"] == max(r["stages"], 2) * r["stage_bytes"] + fixed
        assert r["fits"] == (r["smem_bytes"] <= limit)
        assert str(r["smem_bytes"]) in r["reason"] and str(int(limit)) in r["reason"]


def test_the_limits_are_cutlass_capacities_from_the_spec_sheet():
    assert SPECS["b200"].smem_per_block_kb * 1024 == 232448        # cutlass sm100_smem_capacity_bytes
    assert SPECS["rtx-pro-6000"].smem_per_block_kb * 1024 == 101376  # sm120_smem_capacity_bytes


def test_hopper_has_no_fp4_kernels_to_fit():
    for r in tiles.fit_rows(["h200"]):
        assert r["fits"] is None and r["stages"] is None and "no FP4 tensor cores" in r["reason"]


def test_an_unknown_gpu_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: h100, h200, b200"):
        tiles.fit_rows(["a100"])


def test_the_table_is_a_dataframe_for_the_book():
    frame = tiles.fit_table(["b200", "rtx-pro-6000"])
    assert {"tile", "stages", "smem_kb", "limit_kb", "fits", "reason"} <= set(frame.columns)
    assert len(frame) == len(tiles.fit_rows(["b200", "rtx-pro-6000"]))


def test_smem_fit_json(capsys):
    assert cli.main(["smem-fit", "--gpu", "rtx-pro-6000,b200", "--kind", "moe", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    seed = {(r["gpu"], r["tile"]): r["fits"] for r in rows if r["seed"]}
    assert seed == {("rtx-pro-6000", "128x256x128"): False, ("rtx-pro-6000", "256x128x128"): False,
                    ("b200", "128x256x128"): True, ("b200", "256x128x128"): True}
    assert all(r["kind"] == "moe" for r in rows)


def test_smem_fit_table_and_a_bad_gpu(capsys):
    assert cli.main(["smem-fit", "--gpu", "B200"]) == 0
    out = capsys.readouterr().out
    assert "128x256x128" in out and "limit KB" in out
    assert cli.main(["smem-fit", "--gpu", "mi300"]) == 2
    assert "--gpu 'mi300': unknown GPU mi300; valid:" in capsys.readouterr().err
