"""The chapter modules build their pages from a run folder; two chapters never state one number
two ways (chapters 03 and 04 on the committed H200 reference run); a GPU run rendered on a CPU is
shown as measured and never added to."""

from __future__ import annotations

import html
import re
import shutil

import pandas as pd
import pytest

from fp4lab.chapters import CHAPTERS, ch01_gemm, ch03_moe, ch04_diagnosis
from fp4lab.results import REFERENCE_ROOT, find_run_dirs

REFERENCE = find_run_dirs(REFERENCE_ROOT)[-1]


@pytest.fixture(scope="module")
def reference_copy(tmp_path_factory):
    """A copy of the committed reference run (chapters must not write into the committed one)."""
    target = tmp_path_factory.mktemp("ref") / REFERENCE.name
    shutil.copytree(REFERENCE, target)
    return target


def page_text(page, section: str) -> str:
    return " ".join(str(block.payload) for block in page.sections.get(section, []) if block.kind != "figure")


def method_times(html: str) -> dict[str, str]:
    """{method: its layer time as printed} from a page's HTML table of methods or paths."""
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    found = {}
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        times = [c for c in cells if re.fullmatch(r"[\d.]+ (us|ms)", c)]
        if cells and times:
            found[cells[0]] = times[0]
    return found


def test_chapters_03_and_04_state_the_same_layer_times(reference_copy):
    moe_page = ch03_moe.build(str(reference_copy), "none", "full", "cpu")
    diagnosis_page = ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu")
    chapter_03 = method_times(page_text(moe_page, "measured"))
    chapter_04 = method_times(page_text(diagnosis_page, "paths"))
    shared = set(chapter_03) & set(chapter_04)
    assert {"loop-bf16", "grouped-bf16", "grouped-fp8"} <= shared
    assert {method: chapter_03[method] for method in shared} == {method: chapter_04[method] for method in shared}
    ratio = re.search(r"One grouped bf16 call is ([\d.]+x) as fast", page_text(moe_page, "findings")).group(1)
    from fp4lab import text
    from fp4lab.analysis import moe

    at = moe.layer_times(moe.moe_results(reference_copy, "glm-5"), 512, "uniform")
    grouped = at[at["method"] == "grouped-bf16"]["speedup_vs_loop"].iloc[0]
    assert "grouped-bf16" in page_text(diagnosis_page, "paths") and ratio == text.ratio(grouped)
    # a one-call method's spread is its row's percentiles; a loop's two GEMMs' sum has none
    rows = moe.moe_results(reference_copy, "glm-5").ok
    for fmt in ("nvfp4", "mxfp4"):
        fused = at[(at["method"] == "cuda-w4a16-moe") & (at["fmt"] == fmt)].iloc[0]
        row = rows[(rows["method"] == "cuda-w4a16-moe") & (rows["fmt"] == fmt) & (rows["batch"] == 512)
                   & (rows["ep"].fillna(1) == 1)].iloc[0]
        assert (fused["layer_p20_us"], fused["layer_p80_us"]) == (row["p20_us"], row["p80_us"])
    assert at[at["kind"] == "gemm"]["layer_p80_us"].isna().all()
    # the diagnosed row (MXFP4 since call 158) spans 1607-1615 us from its 20th to 80th percentile
    assert ("the table of methods' median is 1.61 ms, its samples' 20th and 80th percentiles both 1.61 ms"
            in page_text(diagnosis_page, "findings").replace("\\", ""))


def test_chapter_01_seed_caption_states_chapter_04s_modelled_loop(reference_copy):
    """Chapter 01's seed table says why it is this backend's with the same modelled loop time
    chapter 04's seed sentence gives (computed once, `decode.seed_loop`)."""

    caption = page_text(ch01_gemm.build(str(reference_copy), "none", "full", "cpu"), "seed").replace("\\", "")
    said = page_text(ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu"), "seed").replace("\\", "")
    assert "model a loop of expert GEMMs at 5.06 ms (nvfp4)" in said
    assert "runs the glm-5 layer fastest at B=512, 5.06 ms (nvfp4) modelled from its GEMM times (a" in caption


def test_chapter_04_sets_every_timing_of_the_diagnosed_call_side_by_side(reference_copy):
    """A newcomer met the diagnosed call as 1.74, 1.76, 1.82, 1.97 and 2.22 ms on different pages:
    chapter 04 lists them in one table, fastest first, each with how it was timed (the reference
    since call 158: the layer table's MXFP4 1.61 and NVFP4 1.93 ms, the dissecting worker's 1.74
    and 1.93 ms, MXFP4's 1.92 ms back to back)."""
    from fp4lab import text
    from fp4lab.analysis import decode, moe

    d = decode.diagnose(reference_copy, decode.DiagnosisConfig.from_profile("full"))
    times = d.call_times
    assert list(times["us"]) == sorted(times["us"])
    assert times.iloc[0]["timing"] == "layer table (the verdict's)" and \
        times.iloc[0]["us"] == pytest.approx(d.chosen["layer_us"])
    assert set(times["timing"]) == {"layer table (the verdict's)", "layer table", "dissecting worker",
                                    "back to back"}
    worker = times[(times["timing"] == "dissecting worker") & (times["fmt"] == d.chosen["fmt"])]
    assert worker["us"].item() == pytest.approx(d.chosen_anatomy["full"])
    back_to_back = times[times["timing"] == "back to back"].iloc[0]
    assert back_to_back["us"] == pytest.approx(d.chosen_power["window_us_per_call"])
    # how long it ran, read from the row (a newcomer read "for seconds" in a 0.6 s window)
    assert back_to_back["how"].startswith("replayed back to back for 0.58 s (its energy window): 739 W on average "
                                          "against the 700 W limit")
    dissected = moe.fused_anatomy(d.moe)
    assert decode.call_times(d.paths, dissected, None, None).empty          # no diagnosed path
    loop = d.paths[d.paths["source"] == "GEMM sweep"].iloc[0].to_dict()  # a modelled loop: no timing
    assert decode.call_times(d.paths, dissected, loop, None).empty
    table = html.unescape(page_text(ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu"), "breakdown"))
    assert "every time this run measured for one cuda-w4a16-moe call at B=512" in table
    assert [text.us(us) for us in times["us"]] == ["1.61 ms", "1.74 ms", "1.92 ms", "1.93 ms", "1.93 ms"]
    for shown in ("1.61 ms", "1.74 ms", "1.92 ms", "1.93 ms"):
        assert shown in table
    # the NVFP4 burst met the power cap: its row gives the clock its timer read (these rows keep
    # only the mean of the readings before and after the burst, and say so), and its spread shows
    # the samples split in two (1.70 and 1.95 ms) where MXFP4's burst held its clock
    averaged = "the SM clock read before and after its burst averaged"
    assert f"{averaged} 1792 MHz" in table and f"{averaged} 1980 MHz" in table
    assert "1792 MHz; its samples' 20th-80th percentiles 1.70-1.95 ms" in table
    assert "1980 MHz; its samples' 20th and 80th percentiles both 1.61 ms" in table
    # the dissecting worker's rows too: its MXFP4 burst read the same 1980 MHz and spread 1.62-1.87
    assert (f"another burst); {averaged} 1980 MHz; its samples' 20th-80th percentiles 1.62-1.87 ms"
            in table)
    # rows that keep both readings say whether the clock fell within the burst
    assert decode.burst_words(1792.5, 1700.0, 1950.0, 1980.0, 1605.0).startswith(
        "; its SM clock fell from 1980 to 1605 MHz during its burst; its samples' 20th-80th")
    assert decode.burst_words(1972.5, 1610.0, 1612.0, 1980.0, 1965.0).startswith(
        "; its SM clock read 1980 MHz before its burst and 1965 after;")
    assert decode.burst_words(1980.0, 1610.0, 1612.0, 1980.0, 1980.0).startswith(
        "; its SM clock read 1980 MHz before and after its burst;")
    moe_page = page_text(ch03_moe.build(str(reference_copy), "none", "full", "cpu"), "anatomy")
    assert ("this worker's 1.74 ms is 8.0% off it: both bursts read 1980 MHz, and this worker's own samples "
            "have their 20th-80th percentiles 1.62-1.87 ms") in moe_page


def test_chapter_04_says_which_points_never_reached_the_gate(reference_copy):
    """"No point failed the correctness gate" beside chapter 01's "gemlite-w4a16 error x21" read
    as a contradiction: the page names the points that stopped before the gate."""
    import json

    rows = [json.loads(line) for line in (reference_copy / "gemm.jsonl").read_text().splitlines()]
    errored = sum(1 for r in rows if r["backend"] == "gemlite-w4a16" and r["status"] == "error")
    assert errored and not any(r["status"] == "wrong_result" for r in rows)
    said = page_text(ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu"), "gate").replace("\\", "")
    assert said.startswith("No point failed the correctness gate")
    assert f"Stopped before reaching it: {errored} gemlite-w4a16 points with error" in said


def test_chapter_04_states_the_seed_table_in_one_sentence_and_levers_on_one_basis(reference_copy):
    """The seed's table was shown on the front page, in chapter 01 and again in chapter 04; 04 now
    says what it means for the layer from the same rows. Its levers all stand on the diagnosed
    path: EP 8 measured on its busiest rank (not a 4.0x of a slower loop), the bf16 lever
    against the fastest bf16 path, the baseline the FP4 sentence states."""
    from fp4lab import text
    from fp4lab.analysis import decode

    page = ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu")
    said = page_text(page, "seed").replace("\\", "")
    assert "<table" not in said and "front page and in chapter 01" in said
    assert "up to M = 16 its GEMMs are bound by launches and memory, at most 13% of the measured bf16 peak" in said
    assert ("from M = 64 the compute floor is the largest at some shapes, and it reaches at most 57% of that "
            "peak (M = 256)") in said
    # why this backend's table: its modelled loop, and the MoE sweep's own timing of that loop (the
    # one the paths table shows, slower than humming's modelled loop there)
    assert ("model a loop of expert GEMMs at 5.06 ms (nvfp4), the fastest of the backends that ran every M; the MoE "
            "sweep timed that loop itself, launches between its GEMMs included, at 6.26 ms (nvfp4), and at 5.82 ms "
            "in mxfp4; the paths below show both") in said
    d = decode.diagnose(reference_copy, decode.DiagnosisConfig.from_profile("full"))
    assert d.ep_basis == decode.MEASURED_BATCHES
    ep = d.levers[d.levers["lever"].str.startswith("expert parallelism EP=8 (")].iloc[0]
    # measured without its all-to-alls: the communication a layer it can afford, what it saves per
    # token over the 512 tokens each GPU brings
    budget = text.us((ep["now_us"] - ep["with_us"]) * 512)
    saved = text.us(ep["now_us"] - ep["with_us"])
    assert ep["lever"] == (f"expert parallelism EP=8 (cuda-w4a16-moe; all-to-alls not measured: worth it under "
                           f"{budget} = {saved} x 512)")
    assert ep["per"] == "token" and set(d.levers["per"]) == {"token", "call"}
    # the diagnosed path's own rows (its format's): at EP 1, B = 512 against its busiest EP 8 rank
    # at 8 x 512 tokens, each per token of one GPU's 512
    moe_rows = pd.read_parquet(reference_copy / "moe.parquet")
    own = moe_rows[(moe_rows["method"] == "cuda-w4a16-moe") & (moe_rows["fmt"] == d.chosen["fmt"])
                   & (moe_rows["preset"] == "glm-5")]
    alone = own[(own["ep"] == 1) & (own["batch"] == 512)]["median_us"].item() / 512
    spread_rank = own[(own["ep"] == 8) & (own["batch"] == 4096)]["median_us"].item() / 512
    assert ep["kind"] == "measured" and ep["gain"] == pytest.approx(alone / spread_rank, rel=1e-3)
    spread = page_text(ch03_moe.build(str(reference_copy), "none", "full", "cpu"), "spread").replace("\\", "")
    assert "cuda-w4a16-moe" in spread and "4096" in spread
    levers = page_text(page, "levers").replace("\\", "")
    bf16 = d.levers[d.levers["lever"].str.endswith("instead of the fastest bf16 path (padded-bf16)")]
    assert len(bf16) == 1 and bf16.iloc[0]["kind"] == "measured" and bf16.iloc[0]["gain"] > 2
    assert "instead of the fastest bf16 path (padded-bf16)" in levers
    assert f"{bf16.iloc[0]['gain']:.1f}x" in levers
    assert "triton-w4a16 GEMM loop" not in levers
    # the findings list the levers one a line, under their lead-in, largest gain first
    findings = page_text(page, "findings").replace("\\", "")
    lead = f"- More tokens/s than {d.chosen['path']} at B={d.config.decode_batch}, largest first:\n  - "
    assert lead in findings
    on_path, others = findings.split(lead)[1].split("\n- Against other baselines:\n  - ")
    shown = d.levers[d.levers["gain"] > 1 + decode.SAME_SPEED_WITHIN]
    for listed, kept in ((on_path, shown[shown["from_path"]]), (others, shown[~shown["from_path"]])):
        nested = listed.split("\n- ")[0].split("\n  - ")
        assert len(nested) == len(kept) and nested[0].startswith(kept.iloc[0]["lever"])
    assert " → " in on_path and "->" not in findings


def test_chapter_03_tables_each_other_model_the_run_swept_with_its_own_times(reference_copy):
    from fp4lab import text
    from fp4lab.analysis import moe
    from fp4lab.backends.moe import OWN_LAYER_METHODS

    assert moe.other_presets(reference_copy, "glm-5") == ["deepseek-v3"]
    assert moe.other_presets(reference_copy, "deepseek-v3") == ["glm-5"]
    page = ch03_moe.build(str(reference_copy), "none", "full", "cpu")
    others = page_text(page, "others")
    at = moe.layer_times(moe.moe_results(reference_copy, "deepseek-v3"), 512, "uniform")
    best = at.iloc[0]
    assert "DeepSeek" in others and f"at {text.us(best['layer_us'])}" in others
    first_row = re.search(r"<tbody><tr>(.*?)</tr>", others).group(1)      # fastest first
    assert best["method"] in first_row and f">{text.us(best['layer_us'])}<" in first_row
    # fp4lab's CUDA fused MoE is the fastest method there (call 95): named once, as the fastest
    assert best["method"] in OWN_LAYER_METHODS and "fp4lab's fastest fused kernel" not in others
    assert f"the fastest method is {text.md(best['method'])}" in others
    # its burst ran at 1792 MHz where the table's others read 1980 (call 158): the finding says so,
    # as the caption does
    assert f"at {text.us(best['layer_us'])} (timed at 1792 MHz), 1.5x its weight-read floor" in others
    assert "GLM" not in others                       # the chapter's own model stays above
    # the reference run's 4096 rows came from a later moe-sweep: the parameters say it holds them
    parameters = html.unescape(page_text(page, "parameters"))
    assert re.search(r"batch_sizes</td><td[^>]*>64, 256, 512, 2048 \(the full profile's\)<", parameters)
    assert re.search(r"batches the run also holds</td><td[^>]*>4096<", parameters)


def test_chapter_03_names_the_layer_rows_timed_at_a_lower_clock(reference_copy):
    """The reference's NVFP4 cuda-w4a16-moe row read 1792 MHz where every other B = 512 row read
    1980 (call 158; MXFP4's, 1815 MHz, before it): the layer table's caption says so, so the two
    formats' times are not read as the kernel's alone."""
    from fp4lab.analysis import moe

    at = moe.layer_times(moe.moe_results(reference_copy, "glm-5"), 512, "uniform")
    usual, slow = moe.slow_clock_rows(at)
    assert usual == 1980 and [(r.method, r.fmt) for r in slow.itertuples()] == [("cuda-w4a16-moe", "nvfp4")]
    measured = html.unescape(page_text(ch03_moe.build(str(reference_copy), "none", "full", "cpu"), "measured"))
    assert "timed at an SM clock of 1980 MHz but cuda-w4a16-moe (nvfp4) at 1792 MHz" in measured
    assert moe.slow_clock_rows(at.assign(sm_clock_mhz=float("nan")))[0] is None


def test_chapter_03_says_how_to_add_a_model_when_the_run_swept_one(tmp_path, reference_copy):
    run = tmp_path / reference_copy.name
    shutil.copytree(reference_copy, run)
    lines = (run / "moe.jsonl").read_text().splitlines(keepends=True)
    (run / "moe.jsonl").write_text("".join(line for line in lines if '"deepseek-v3"' not in line))
    (run / "moe.parquet").unlink()
    others = page_text(ch03_moe.build(str(run), "none", "full", "cpu"), "others")
    assert "swept no model besides GLM-5" in others and f"--run-id {run.name}" in others


def test_a_gpu_run_rendered_on_a_cpu_is_never_added_to(reference_copy):
    before = (reference_copy / "gemm.jsonl").read_text()
    CHAPTERS["01_fp4_gemm_sweep"].build(str(reference_copy), "none", "full", "cpu")
    assert (reference_copy / "gemm.jsonl").read_text() == before


def test_every_chapter_fills_its_sections_from_the_reference(reference_copy):
    for stem, module in CHAPTERS.items():
        page = module.build(str(reference_copy), "none", "full", "cpu")
        assert page.sections.get("findings"), f"{stem} states no finding"
        assert not page.smoke, f"{stem}: the H200 run is not a smoke run"


COMM_ONE_GPU = REFERENCE_ROOT.parent / "measurements" / "20261201T095731Z-comm-1"


def test_the_comm_chapter_ranks_layouts_from_its_own_rows(tmp_path, monkeypatch):
    """A CPU run with GEMM rows and a two-rank gloo comm run: every layout of two ranks gets a
    step time from the run's own rows, and the page says the sizes are a stand-in's."""
    from fp4lab.analysis import layouts
    from fp4lab.chapters import ch05_comm
    from fp4lab.cli import main
    from fp4lab.results import RunDir

    monkeypatch.setenv("FP4LAB_RUNS_DIR", str(tmp_path))
    assert main(["sweep", "--backends", "torch-bf16", "--format", "nvfp4", "--m", "1,8,64", "--profile",
                 "smoke", "--device", "cpu", "--out", str(tmp_path), "--run-id", "cpu-run", "--quiet"]) == 0
    page = ch05_comm.build(str(tmp_path / "cpu-run"), "none", "smoke", "cpu")
    study = layouts.study(RunDir.open(tmp_path / "cpu-run"), None, "glm-5", [8, 32], 512)
    assert set(study.layouts["layout"]) == {"TP2", "TP1xPP2", "EP2"}
    assert study.layouts["step_us"].notna().all() and study.model.scaled
    findings = page_text(page, "findings")
    assert study.fastest["layout"] in findings and "stand-in" in findings
    assert "gloo" in page_text(page, "measured") or "gloo" in findings


def test_one_gpu_comm_rows_rank_no_layout_and_say_why(tmp_path):
    from fp4lab.analysis import layouts
    from fp4lab.analysis.run import view
    from fp4lab.results import RunDir

    copy = tmp_path / COMM_ONE_GPU.name
    shutil.copytree(COMM_ONE_GPU, copy)
    empty = RunDir.create(tmp_path, "empty")
    study = layouts.study(empty, view(copy), "glm-5", [64, 512], 512)
    assert study.source.run_id == COMM_ONE_GPU.name and study.gpus == 1
    assert "one GPU" in study.why_not and not len(study.layouts)
    assert layouts.smallest_time(study)["us"] < 5        # world size 1: a local copy, microseconds
    from fp4lab import text
    from fp4lab.chapters.ch05_comm import findings
    said = findings(study)[0]
    assert "every collective ran at one rank, a copy inside one GPU" in said and "pays" not in said
    # the rows are the reference's, and the finding says whose: this run measured none
    assert study.from_reference
    assert f"(in the run shown beside, `{COMM_ONE_GPU.name}`: this run measured no collective)" in said
    assert not layouts.study(RunDir.open(copy), None, "glm-5", [64, 512], 512).from_reference
    # the cheapest call is the fastest of every row, not the fewest tokens' (64 of 1-2048 in the
    # reference: the page once said "the fewest measured"); the table at the decode batch: both are said
    cheapest = layouts.smallest_time(study)
    low, high = cheapest["tokens_span"]
    assert low <= cheapest["tokens"] <= high and cheapest["calls_measured"] == len(study.ok)
    assert f"the cheapest of the {len(study.ok)} calls measured ({low}-{high} tokens)" in said
    assert "the fewest measured" not in said
    table = layouts.at_decode(study, 512)
    same = table[(table["op"] == cheapest["op"]) & (table["dtype"] == cheapest["dtype"])]
    assert cheapest["tokens"] < cheapest["table_tokens"] == int(same["tokens"].iloc[0])
    assert f"at the table's {cheapest['table_tokens']} tokens it takes {text.us(cheapest['table_us'])}" in said
    assert cheapest["table_us"] == float(same["median_us"].iloc[0])


def test_the_comm_page_says_its_rank_knobs_launched_nothing_when_rendering_a_gpu_run(reference_copy):
    """Rendered on a CPU, the full profile's nproc (all: 2 processes here) did not measure the
    collectives shown; the parameters say at how many ranks they ran."""
    from fp4lab.chapters import ch05_comm

    page = ch05_comm.build(str(reference_copy), str(COMM_ONE_GPU), "full", "cpu")
    parameters = html.unescape(page_text(page, "parameters"))
    assert re.search(r"nproc</td><td[^>]*>2 \(the full profile's\); no comm run launched \(rendering only\): "
                     r"the collectives shown ran at 1 rank<", parameters)
    assert re.search(r"measure</td><td[^>]*>True \(the full profile's\); no comm run launched \(rendering only\)<",
                     parameters)


def test_the_ep_lever_adds_measured_all_to_alls_only_where_measured():
    from fp4lab.analysis import comm as comm_analysis
    from fp4lab.analysis import decode
    from fp4lab.results import RunDir

    config = decode.DiagnosisConfig.from_profile("full").check()
    gemm = decode.gemm_analysis.gemm_results(REFERENCE)
    model = decode.presets.get(config.preset)
    backend = gemm.ok["backend"].iloc[0]
    frame = RunDir.open(COMM_ONE_GPU).read_table("comm")
    ep = decode.what_if_ep(gemm, backend, model, config, comm_analysis.CommTable(frame))
    one = ep[ep["ep"] == 1].iloc[0]
    assert one["comm_us"] == 0 and one["us_per_token_with_comm"] == one["us_per_token"]
    spread = ep[ep["ep"] > 1]
    assert len(spread) and spread["comm_us"].isna().all()      # the rows hold world size 1 only


def test_chapters_02_and_04_state_the_same_decode_power(reference_copy):
    power_page = CHAPTERS["02_power_clocks"].build(str(reference_copy), "none", "full", "cpu")
    diagnosis_page = ch04_diagnosis.build(str(reference_copy), "none", "full", "cpu")
    # the diagnosed layer's own window (call 122: NVFP4 at B = 512) in both, word for word
    own = re.search(r"Power caps the diagnosed path: [^\n]*? whose samples are a burst at the clock of the moment"
                    r"[^\n]*?\.(?=\s|$)", page_text(diagnosis_page, "findings"))
    assert own and own.group(0) in page_text(power_page, "findings") and "drew 739 W" in own.group(0)
    # 1.92 ms is 19% over 1.61 ms; the SM clock's fall (1980 -> 1620 MHz) could explain up to 22%
    assert ("19% over the timer's 1.61 ms, whose samples are a burst at the clock of the moment (the SM clock "
            "read before and after this one averaged 1980 MHz): the clock's fall alone could account for it (at most 22%).") in own.group(0)
    found = page_text(power_page, "findings")        # the reference's instant readings passed 700 W
    assert re.search(r"At decode sizes .*? the GPU draws 190 W", found)                 # the GEMMs'

    assert "readings above it over shorter spans (instant samples, short energy windows) are bursts" in found
    assert re.search(r"the least efficient, \S+ at M = \d+ on \d+x\d+, reaches", found)


@pytest.mark.parametrize("timed_mhz, window_mhz, slower, says", [
    (1980.0, 1740.0, 0.26, "(the SM clock read before and after this one averaged 1980 MHz): the clock's "
                           "fall stretches a call by at most 14%, so these rows do not say where the rest goes"),          # the reference before call 158
    (1980.0, 1620.0, 0.19, "(the SM clock read before and after this one averaged 1980 MHz): the clock's "
                           "fall alone could account for it (at most 22%)"),
    (1980.0, 1980.0, 0.05, ""),                                  # no fall: nothing to say about it
    (1800.0, 1620.0, -0.02, "")])                                # not longer back to back
def test_a_longer_call_back_to_back_says_how_much_of_it_the_clock_explains(timed_mhz, window_mhz, slower, says):
    own = {"timed_sm_clock_mhz": timed_mhz, "clock_stretch": timed_mhz / window_mhz - 1, "window_over_timed": slower}
    assert ch04_diagnosis.clock_share(own) == (f" {says}" if says else "")


@pytest.mark.parametrize("average_w,says", [
    (690.0, "stayed within it: readings above it over shorter spans"),
    (703.8, "peaked at 101% of it: the limiter held the GPU at its limit, and readings above it"),
    (760.0, "peaked at 109% of the limit: the limit was not held")])
def test_instant_power_above_the_limit_is_read_against_the_averaged_peak(average_w, says):
    """The averaged reading can sit a hair above the limit the limiter holds (the 1222Z run: 704 W of
    700): that is the limit held, not broken; well above it, the page says it was not held."""
    from fp4lab.chapters.ch02_power import _against_limit

    assert says in _against_limit({"instant_max_w": 948.0, "average_max_w": average_w}, 700.0)


def test_no_instant_reading_above_the_limit_or_no_limit_says_nothing_of_it():
    from fp4lab.chapters.ch02_power import _against_limit

    assert _against_limit({"instant_max_w": 650.0, "average_max_w": 640.0}, 700.0) == ""
    assert _against_limit({"instant_max_w": 950.0, "average_max_w": 640.0}, None) == ""


def test_a_page_lists_the_values_its_profile_gave_the_knobs_left_unset(reference_copy):
    """Every knob left at None read '(profile default)': the page now says what ran."""
    page = CHAPTERS["01_fp4_gemm_sweep"].build(str(reference_copy), "none", "full", "cpu", measure=False)
    shown = page_text(page, "parameters")
    assert "(profile default)" not in shown
    assert "8192x8192, 4096x6144, 6144x2048 (the full profile" in shown and "glm-5 (the full profile" in shown


def test_chapter_03_dissects_the_fused_kernel_from_its_builds(tmp_path):
    from fakes.runs import fused_anatomy_run, moe_anatomy_row

    run = fused_anatomy_run(tmp_path, {"full": 1800.0, "load": 1250.0, "decode": 1400.0})
    run.append_rows("moe_anatomy", [moe_anatomy_row(stage, us, fmt="mxfp4") for stage, us in
                                    (("full", 1700.0), ("load", 1300.0), ("decode", 1350.0))])
    page = ch03_moe.build(str(run.path), "none", "full", "cpu")
    assert [block.kind for block in page.sections["anatomy"]] == ["figure", "markdown"]
    said = page_text(page, "anatomy")
    assert ("take 1.25 ms (69% of this worker's call), reading the weights at 80% of the copy bandwidth (their read "
            "floor is 1.00 ms); decoding them brings it to 1.40 ms (+150 us), the MMAs with the "
            "epilogue to 1.80 ms (+400 us)") in said
    assert "add 550 us to the loads alone: the part of their work the loads do not hide" in said and "its loads-only time, 1.25 ms in this worker" in said
    assert "mxfp4 at B=512: the whole call 1.70 ms, its loads 1.30 ms (76%)" in said
    assert "layer table times the same call" not in said          # 1.85 against 1.80 ms: 2.8%


def test_chapter_03_says_when_the_math_alone_is_as_long_as_the_weight_stream(tmp_path):
    """With a compute build (the call without its weights' read), the page states it beside the
    loads and says which bounds the call: the SMs' issue when the math is about as long as the loads
    (as call 113 measured for the H200), the loads when it is shorter; without one, the loads-only
    time is a bound only on that condition, and the page says the run did not time it."""
    from fakes.runs import fused_anatomy_run, moe_anatomy_row

    run = fused_anatomy_run(tmp_path / "bound", {"full": 1800.0, "load": 1250.0, "decode": 1400.0,
                                                 "compute": 1400.0})
    run.append_rows("moe_anatomy", [moe_anatomy_row(stage, us, fmt="mxfp4") for stage, us in
                                    (("full", 1700.0), ("load", 1200.0), ("decode", 1350.0),
                                     ("compute", 1300.0))])
    page = ch03_moe.build(str(run.path), "none", "full", "cpu")
    said = page_text(page, "anatomy")
    assert "Without reading the weights at all" in said and "the call takes 1.40 ms, 1.12x its loads alone" in said
    assert "could not go below 1.40 ms" in said and "own instructions (decode and MMAs) more than by HBM" in said   # 1.1x
    assert "would take the layer to about its loads-only time" not in said
    assert "without the weights' read 1.30 ms (1.08x its loads)" in said             # the MXFP4 line
    hidden = fused_anatomy_run(tmp_path / "hidden", {"full": 1800.0, "load": 1250.0, "decode": 1400.0,
                                                     "compute": 800.0})
    said = page_text(ch03_moe.build(str(hidden.path), "none", "full", "cpu"), "anatomy")
    assert "the call takes 800 us, 0.64x its loads alone" in said
    assert "would take the layer to about its loads-only time, 1.25 ms in this worker" in said
    assert "as much as by HBM" not in said
    old = fused_anatomy_run(tmp_path / "old", {"full": 1800.0, "load": 1250.0, "decode": 1400.0})
    said = page_text(ch03_moe.build(str(old.path), "none", "full", "cpu"), "anatomy")
    assert "if they alone take less than that: this run did not time the call without the weights' read" in said


def test_chapter_03_says_where_the_layer_table_times_the_dissected_call_elsewhere(tmp_path):
    from fakes.runs import fused_anatomy_run, moe_anatomy_row, moe_row

    run = fused_anatomy_run(tmp_path, {"full": 1700.0, "load": 1250.0, "decode": 1400.0})
    run.append_rows("moe", [moe_row("cuda-w4a16-moe", "layer", 512, 1500.0, weight_dtype="fp4",
                                    kind="layer", fmt="mxfp4", weight_bytes=4e9)])
    run.append_rows("moe_anatomy", [moe_anatomy_row(stage, us, fmt="mxfp4") for stage, us in
                                    (("full", 1400.0), ("load", 1300.0), ("decode", 1350.0))])
    said = page_text(ch03_moe.build(str(run.path), "none", "full", "cpu"), "anatomy")
    # mxfp4 leads: the layer table times it fastest, so it is the format chapter 04 diagnoses
    assert said.startswith("- At B=512 (mxfp4) `cuda-w4a16-moe` takes 1.40 ms a layer in this worker")
    assert ("The sweep's layer table times the same call at the same point at 1.50 ms, in its own "
            "worker; this worker's 1.40 ms is 6.7% off it") in said
    assert ("nvfp4 at B=512: the whole call 1.70 ms (the layer table: 1.85 ms, 8.1% off it, the same spread "
            "between workers)") in said


def test_chapter_03_says_how_to_dissect_the_fused_kernel_where_a_run_did_not(tmp_path):
    from fakes.runs import fused_anatomy_run

    run = fused_anatomy_run(tmp_path / "undissected", {})
    said = page_text(ch03_moe.build(str(run.path), "none", "full", "cpu"), "anatomy")
    assert "was not dissected in this run (not measured)" in said
    assert f"--anatomy-batch 512 --run-id {run.path.name}" in said


def test_chapter_04_says_when_the_diagnosed_paths_own_timing_saw_the_sm_clock_fall(tmp_path, reference_copy):
    """The decode GEMMs' 190 W cleared power for all of decode, but a fused layer kernel without an
    energy window carries only the SM clock its timer read. Where the diagnosed path's fell under
    its timer's steady-clock share of the maximum (the reference's GLM-5 path given DeepSeek-V3's
    1830 MHz of call 108, its windows taken out), the page says so instead of clearing power."""
    import json

    from fp4lab.analysis import decode

    config = decode.DiagnosisConfig.from_profile("full")
    assert decode.diagnose(reference_copy, config).chosen_clock is None        # 1980 MHz: it held
    run = tmp_path / reference_copy.name
    shutil.copytree(reference_copy, run)
    rows = [json.loads(line) for line in (run / "moe.jsonl").read_text().splitlines()]
    for row in rows:
        if row["method"] == "cuda-w4a16-moe":
            row.update(avg_power_w=None, energy_per_call_j=None, window_sm_clock_mhz=None, throttle_reasons=None)
            # the diagnosed row (MXFP4 since call 158)
            if row["fmt"] == "mxfp4" and row["preset"] == "glm-5" and row["batch"] == 512 and row["ep"] == 1:
                row["sm_clock_mhz"] = 1830.0
    (run / "moe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "moe.parquet").unlink()            # the jsonl log is the truth the table is read from
    assert 1830.0 < json.loads((run / "run.json").read_text())["moe"]["config"]["timer"]["min_clock_ratio"] * 1980
    d = decode.diagnose(run, config)
    assert d.chosen_power is None
    assert d.chosen_clock == {"path": "cuda-w4a16-moe", "fmt": "mxfp4", "sm_clock_mhz": 1830.0,
                              "max_sm_clock_mhz": 1980.0, "fraction": 1830.0 / 1980}
    said = ch04_diagnosis.power_sentence(d).replace("\\", "")
    assert said.startswith("Power does not limit the decode GEMMs: ")
    assert "cuda-w4a16-moe, read the SM clock at 1830 MHz in its own timing, 92% of" in said
    assert "whether the power limit lowered it is not measured here" in said
    assert "power-capped" not in ch04_diagnosis.verdict_sentence(d)      # no window, no claim


def test_chapter_04_states_the_diagnosed_paths_own_energy_window_when_the_sweep_took_one(tmp_path,
                                                                                       reference_copy):
    """The MoE sweep's `energy_batches` give each point there an energy window (the call replayed
    back to back): where the diagnosed path has one, chapter 04 states its own power, clock and
    time a call there, instead of the decode GEMMs' power. Here the reference's GLM-5 path
    (cuda-w4a16-moe, MXFP4 since call 158, B = 512) is given the window call 110 measured on an
    H100; without a window of its own format, the other format's is stated as such."""
    import json

    from fp4lab.analysis import decode

    run = tmp_path / reference_copy.name
    shutil.copytree(reference_copy, run)
    rows = [json.loads(line) for line in (run / "moe.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["method"] == "cuda-w4a16-moe" and r["fmt"] == "mxfp4"
              and r["preset"] == "glm-5" and r["batch"] == 512 and r["ep"] == 1]
    assert len(chosen) == 1
    timed_us = chosen[0]["median_us"]
    chosen[0].update(avg_power_w=699.0, energy_per_call_j=699.0 * 2.09e-3, window_sm_clock_mhz=1635.0,
                     throttle_reasons="none;sw_power_cap")
    (run / "moe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "moe.parquet").unlink()            # the jsonl log is the truth the table is read from
    d = decode.diagnose(run, decode.DiagnosisConfig.from_profile("full"))
    own = d.chosen_power
    assert own["capped"] and own["throttle_reasons"] == ["sw_power_cap"]    # "none" read in other samples
    assert own["window_us_per_call"] == pytest.approx(2090.0)
    assert own["timed_us"] == pytest.approx(timed_us) and own["fraction"] == pytest.approx(699 / 700)
    said = ch04_diagnosis.power_sentence(d).replace("\\", "")
    # the window's own length, from the row's start and end (0.6 s in the committed run)
    window_s = chosen[0]["window_end_s"] - chosen[0]["window_start_s"]
    assert own["window_s"] == pytest.approx(window_s) and 0.5 < window_s < 0.7
    assert said.startswith(f"Power caps the diagnosed path: replayed back to back for {window_s:.2g} s, "
                           "cuda-w4a16-moe drew 699 W on average over the window, 100% of the 700 W limit "
                           "(enforced on ~1 s averages: chapter 02), with the SM clock at 1635 MHz (clock-event reasons: "
                           "sw_power_cap); a call took 2.09 ms there")
    assert f"over the timer's {chosen[0]['median_us'] / 1000:.2f} ms" in said
    # the verdict itself says the burst it reads is not the sustained call
    over = round(100 * (2090.0 / timed_us - 1))
    assert ch04_diagnosis.verdict_sentence(d).replace("\\", "").endswith(
        f" Back to back it is also **power-capped** (699 W, limit 700 W) at 2.09 ms a call, {over}% over the "
        f"timed {timed_us / 1000:.2f} ms.")
    # the committed reference: the diagnosed MXFP4 call's own window (call 158)
    plain = decode.diagnose(reference_copy, decode.DiagnosisConfig.from_profile("full"))
    assert plain.chosen["fmt"] == "mxfp4" and not plain.chosen_power["other_format"]
    assert ("Back to back it is also **power-capped** (739 W, limit 700 W) at 1.92 ms a call, 19% over "
            "the timed 1.61 ms.") in ch04_diagnosis.verdict_sentence(plain)
    # its window taken out, the NVFP4 call's (call 158) stands in, named as the other format's
    chosen[0].update(avg_power_w=None, energy_per_call_j=None, window_sm_clock_mhz=None, throttle_reasons=None)
    (run / "moe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    other = decode.diagnose(run, decode.DiagnosisConfig.from_profile("full"))
    assert other.chosen_power["other_format"] and other.chosen_power["fmt"] == "nvfp4"
    said = ch04_diagnosis.power_sentence(other).replace("\\", "")
    assert said.startswith("Power caps the diagnosed path: replayed back to back for 0.6 s, cuda-w4a16-moe (with NVFP4 "
                           "weights: the run has no window of the diagnosed format) drew 713 W")
    assert "Back to back its NVFP4 build is also **power-capped** (713 W, limit 700 W)" in \
        ch04_diagnosis.verdict_sentence(other)


def test_chapter_01_sets_fp4labs_kernels_against_the_fastest_peer(reference_copy, tmp_path):
    """Issue 13's comparison on the page: the reference run's figure, per-M table and findings
    (13 of 18 decode points at the 1.5x aim, none level at M = 64 and 256, the bf16 MMAs' floor
    from M = 256), and a run where fp4lab's kernels did not run says so instead."""
    from fp4lab.analysis import gemm
    from fp4lab.results import RunDir

    page = ch01_gemm.build(str(reference_copy), "none", "full", "cpu", measure=False)
    assert [block.kind for block in page.sections["peers"]] == ["figure", "html", "markdown"]
    per_m = gemm.own_against_peers_per_m(gemm.own_against_peers(gemm.gemm_results(reference_copy)))
    decode = per_m[per_m["m"] <= gemm.PEER_TARGET_UP_TO_M]
    said = page_text(page, "peers").replace("\\", "")
    assert (decode["at_aim"].sum(), decode["points"].sum()) == (13, 18)
    assert "13 of 18 points reach the 1.5x aim" in said
    assert "0 of 12 points level" in said and "From M = 256 a weight-only FP4 GEMM's bf16 MMAs" in said
    empty = RunDir.create(tmp_path, "bf16-only")
    empty.append_rows("gemm", [dict(row) for row in RunDir.open(reference_copy).read_table("gemm")
                               .query("backend == 'torch-bf16'").head(3).to_dict("records")])
    alone = page_text(ch01_gemm.build(str(empty.path), "none", "full", "cpu", measure=False), "peers")
    assert alone.startswith("No point of this run has both one of fp4lab's own kernels")


def test_chapter_03_says_what_its_utilization_figure_shows_and_why_its_ep_curves_coincide(reference_copy):
    """A newcomer saw EP=1 and EP=8 on one line at 20% with no word beside them, against measured
    EP gains of 1.3-2.4x: the section states the prediction and the convention behind it."""
    said = page_text(ch03_moe.build(str(reference_copy), "none", "full", "cpu"), "utilization").replace("\\", "")
    assert "No batch swept reaches 50% of the spec bf16 peak" in said and "at best 20%" in said
    assert "so the EP curves coincide" in said and "each GPU brings its own B" in said


def test_chapter_03_leads_the_run_shown_beside_into_its_own_table():
    """Its table has this run's columns: a newcomer read it as this run's, with another method on top."""
    from fp4lab.results import REFERENCE_ROOT, latest_gpu_run

    page = ch03_moe.build(str(latest_gpu_run(REFERENCE_ROOT)), "", "full", "cpu")
    lead = page_text(page, "reference").replace("\\", "")
    assert lead.startswith("The same layer in the run shown beside, `20261202T1849Z-h200-full` (NVIDIA H200, "
                           "2026-12-02): fastest there humming-moe-indexed at 2.21 ms.")


def test_chapter_01_states_the_fastest_weight_stream_against_the_measured_copy_bandwidth(reference_copy):
    """The book's floors use the copy bandwidth the run measured: the M=1 reader's share of it comes
    first, the sheet's beside it; a bf16 backend's row names no 4-bit format."""
    findings = page_text(ch01_gemm.build(str(reference_copy), "none", "full", "cpu"), "findings").replace("\\", "")
    assert ("At M=1 the weights stream fastest, in bytes a second, through torch-bf16 on 8192x8192: 4.07 TB/s "
            "(96% of the measured copy bandwidth, 85% of the spec sheet's); a rate, not the fastest call: its "
            "weights are bf16") in findings


@pytest.mark.parametrize("table_mhz, worker_mhz, says", [
    (1980.0, 1980.0, ": both bursts read 1980 MHz, and this worker's own samples have their 20th-80th percentiles 1.62-1.87 ms"),
    (1980.0, 1785.0, ": the table's burst read the SM clock at 1980 MHz, this worker's at 1785 MHz"),
    (float("nan"), 1785.0, "")])
def test_chapter_03_says_why_two_workers_time_one_call_apart(table_mhz, worker_mhz, says):
    """'near the power limit their bursts can run at different clocks' stood where both bursts read
    1980 MHz: the sentence now reads the two clocks and the worker's own spread."""
    row = {"layer_sm_clock_mhz": table_mhz, "full_sm_clock_mhz": worker_mhz,
           "full_p20_us": 1617.4, "full_p80_us": 1871.9}
    assert ch03_moe.apart_why(row).startswith(says) and (says or not ch03_moe.apart_why(row))
    # a row without percentiles (an older run) names the clocks only
    unspread = ch03_moe.apart_why({**row, "full_p20_us": float("nan")})
    assert "—" not in unspread and "spread" not in unspread

