"""What the H200 reference calls tripped on: the front page's diagnosis reads this run on a GPU
and the newest GPU run on a CPU (a GPU report once crashed there, after every chapter had run);
the commit recorded is the one named, not a stray .git's."""

from __future__ import annotations

import pandas as pd
import pytest

from fp4lab import report
from fp4lab.results import REFERENCE_ROOT, REPO_ROOT, RunDir, latest_gpu_run


def test_a_gpu_report_leads_with_its_own_run(tmp_path):
    run = RunDir.create(tmp_path, "gpu-run")
    assert report.leading_run(run, True, tmp_path) is run


def test_a_cpu_report_leads_with_the_newest_gpu_run(tmp_path):
    run = RunDir.create(tmp_path, "cpu-run")
    leading = report.leading_run(run, False, tmp_path)
    assert leading is not None and leading.path == latest_gpu_run(tmp_path, REFERENCE_ROOT)


def test_an_explicit_commit_wins_over_whatever_git_is_around(monkeypatch):
    """A tree copied to a device machine can sit inside another checkout's .git: the commit the
    caller names is the one recorded."""
    from fp4lab import results

    monkeypatch.setenv("FP4LAB_GIT_SHA", "ba8b458")
    assert results.git_sha() == "ba8b458"
    monkeypatch.delenv("FP4LAB_GIT_SHA")
    assert results.git_sha() != "ba8b458"


def test_a_newer_gpu_run_without_its_moe_sweep_does_not_lead(tmp_path):
    """A GPU report stopped before chapter 03 (or a GEMM-only sweep) would diagnose the layer
    from GEMM loops alone: the newest complete GPU run leads instead, while one exists."""
    from fp4lab import schema

    def gpu_run(run_id: str, created: str, tables: tuple[str, ...]) -> RunDir:
        run = RunDir.create(tmp_path, run_id)
        run.update_run_json(None, {"created": created,
                                   "provenance": {"device": {"kind": "cuda", "name": "NVIDIA H200"}}})
        for table in tables:
            run.append_rows(table, [schema.blank_row(table, run_id=run_id, status="ok")])
        return run

    complete = gpu_run("complete", "2026-12-01T10:00:00+00:00", ("gemm", "moe"))
    gpu_run("partial", "2026-12-01T12:00:00+00:00", ("gemm",))
    assert latest_gpu_run(tmp_path) == complete.path
    assert latest_gpu_run(tmp_path, prefer=None).name == "partial"


def text_md(run: RunDir) -> str:
    from fp4lab import text
    from fp4lab.results import device_label
    return text.md(device_label(run.run_json()))


def test_the_front_page_links_the_verdict_to_the_diagnosis_chapter_it_came_from(tmp_path, monkeypatch):
    from fp4lab import book

    run = RunDir.create(tmp_path, "cpu-run")
    leading = report.leading_run(run, False, tmp_path)
    as_reference = {"reference_dir": str(leading.path), "chapters": []}
    pages = book.diagnosed_pages(run, as_reference, leading)
    assert pages["04"] == "chapters/reference/04_diagnosis"
    assert pages["03"] == "chapters/reference/03_moe_expert_scatter"
    assert book.diagnosed_pages(run, {"reference_dir": "", "chapters": []}, leading) == {}   # not in this book
    assert book.diagnosed_pages(leading, {"chapters": [{"chapter": "04_diagnosis"}]}, leading) == \
        {"04": "chapters/04_diagnosis"}
    page = book.front_page(run, {**as_reference, "profile": "smoke"}, leading)
    assert "{doc}`chapter 04, the diagnosis <chapters/reference/04_diagnosis>`" in page
    # the run table's pages are this CPU run's, not the diagnosis's evidence: it says so
    assert "measure no GPU: the diagnosis above reads the reference run" in page
    # the verdict's title says over which days the run's rows were measured (rows were added later)
    from fp4lab.results import measured_span
    span = measured_span(leading.run_json())
    assert " to " in span and f"Verdict for {text_md(leading)}, measured {span}" in page
    # the facts' chapter references are links too, to the section of the same part's page they cite
    assert ("in [chapter 01](chapters/reference/01_fp4_gemm_sweep.ipynb"
            "#where-the-kernels-cycles-go-hardware-counters)):") in page
    assert "(chapter 03)" not in page
    assert ("([chapter 03](chapters/reference/03_moe_expert_scatter.ipynb"
            "#where-fp4labs-fused-kernels-time-goes))") in page
    # the diagnosed kernel's own counters on this GPU, in its diagnosed format, before the others'
    from fp4lab import text
    from fp4lab.analysis import counters, decode
    on_h200 = [counters.read_counters(f) for f in counters.find_profiles("")]
    on_h200 = [p for p in on_h200 if p.device == "NVIDIA H200"]
    d = decode.diagnose(leading.path, decode.DiagnosisConfig.from_profile("full"))
    own = counters.kernel_sentence(on_h200, "cuda-w4a16-moe", d.chosen["fmt"], "It")
    assert own.startswith(f"It, profiled ({d.chosen['fmt']} glm\\-5 B=512: gate\\_up ")
    assert d.chosen["fmt"] == "mxfp4"          # the fastest FP4 path since call 158
    assert "instructions per weight with its issue slots busy on 65-66% of cycles" in own
    assert own.endswith("its warps' largest stalls are 'not selected' (2.20 cycles per instruction issued) and "
                        "'math pipe throttle' (2.08): warps that could issue wait for the schedulers and the math "
                        "pipe, not for their loads.")
    assert (f")): The diagnosed path's kernel, {text.md('cuda-w4a16-moe')}, profiled (") in page
    # under the instruction line, it says why fewer instructions per weight still help it
    # its break-even is its own format's: MXFP4 weights are fewer bytes than the NVFP4 line's
    assert ("The diagnosed kernel needs fewer than 4.19 instructions per weight with MXFP4 weights (3.3-3.4), "
            "but it issues on only 65-66% of its cycles: at that rate they take as long as 4.9-5.2 would on "
            "every slot, 1.2x the time of reading its weights") in page
    assert "is not among them" not in page
    # without a profile of it on this GPU (the H200's of the dense kernel alone), the page says so
    dense_only = [counters.read_counters(REPO_ROOT / "results" / "measurements" / "20261203T1320Z-h200-ncu-cuda")]
    assert counters.kernel_sentence(dense_only, "cuda-w4a16-moe") is None
    monkeypatch.setattr(counters, "find_profiles",
                        lambda choice="": [REPO_ROOT / "results" / "measurements" / "20261203T1320Z-h200-ncu-cuda"])
    assert book.counters_sentence(d).endswith(
        f"The diagnosed path's kernel, {text.md('cuda-w4a16-moe')}, is not among them: no Nsight Compute "
        "profile of it on NVIDIA H200 is committed, so what bounds it comes from its own dissection above, "
        "not from these counters.")
    h100 = counters.read_counters(REPO_ROOT / "results" / "measurements" / "20261206T1527Z-h100-ncu-cuda")
    assert counters.kernel_sentence([h100], "cuda-w4a16-moe") is not None
    assert book.link_chapters("see chapter 07 and chapter 01", {"01": "chapters/01_x"}) == \
        "see chapter 07 and {doc}`chapter 01 <chapters/01_x>`"
    assert book.link_chapters("chapter 01", {"01": "chapters/01_x"}, (("01", "Where it goes: the MMAs'"),)) == \
        "[chapter 01](chapters/01_x.ipynb#where-it-goes-the-mmas)"


def test_each_section_the_front_page_links_to_is_a_heading_of_its_chapter():
    """A renamed heading would leave the front page's link pointing at no anchor."""
    import json

    from fp4lab import book

    for chapter, heading in (book.FUSED_ANATOMY_SECTION, book.GEMM_ANATOMY_SECTION, book.COUNTERS_SECTION):
        (notebook,) = (REPO_ROOT / "notebooks").glob(f"{chapter}_*.ipynb")
        cells = json.loads(notebook.read_text())["cells"]
        headings = [line for cell in cells if cell["cell_type"] == "markdown"
                    for line in "".join(cell["source"]).splitlines() if line.startswith("## ")]
        assert f"## {heading}" in headings, (notebook.name, heading)


def test_the_sidebar_leads_with_the_gpu_measurements(tmp_path):
    """A CPU smoke run's book listed its pipeline check first and the H200 chapters below it."""
    from fp4lab import book

    reference = RunDir.create(tmp_path, "gpu-ref")
    reference.update_run_json(None, {"provenance": {"device": {"kind": "cuda", "name": "NVIDIA H200"}}})
    for kind, first in (("cpu", "Reference run: gpu-ref"), ("cuda", "This run: here")):
        run = RunDir.create(tmp_path / kind, "here")
        run.update_run_json(None, {"provenance": {"device": {"kind": kind, "name": "NVIDIA H200" if kind == "cuda"
                                                             else "Intel(R) Xeon(R)"}}})
        staged = tmp_path / f"staged-{kind}"
        staged.mkdir()
        book.write_toc(staged, ["00_environment"], ["00_environment"], run, reference)
        captions = [line for line in (staged / "_toc.yml").read_text().splitlines() if "caption" in line]
        assert first in captions[0] and len(captions) == 2, captions


def test_the_front_page_shows_the_verdicts_numbers_and_its_three_largest_levers(tmp_path):
    """Issue 10: beside the verdict, tokens per expert, power against the limit and the largest
    levers, each value the diagnosis's own (the newest committed GPU run)."""
    import re

    from fp4lab import book, text
    from fp4lab.analysis import decode
    from fp4lab.chapters import ch04_diagnosis as words

    run = RunDir.create(tmp_path, "cpu-run")
    leading = report.leading_run(run, False, tmp_path)
    page = book.front_page(run, {"chapters": [], "profile": "smoke"}, leading)
    d = decode.diagnose(leading, decode.DiagnosisConfig.from_profile("smoke"))
    glance = words.glance_html(d)
    assert glance in page and page.index("fp4lab-glance") < page.index("fp4lab-seed")
    shown = d.levers[d.levers["gain"] > 1 + decode.SAME_SPEED_WITHIN]
    on_path = shown[shown["from_path"]].sort_values("gain", ascending=False)
    assert len(on_path) >= 2      # the bound and batch 2048
    # only what would make the diagnosed path faster, largest first, under a header that says so
    assert f"more tokens/s than {text.html(d.chosen['path'])} at B=512" in glance
    # the largest, and the verdict's own lever (the path at its weight-read floor) in the last row
    # where it is not among them: three rows, so the seed's table stays above the fold
    floor = on_path[on_path["kind"] == "bound"].iloc[0]
    assert floor["lever"] not in set(on_path.head(words.GLANCE_LEVERS)["lever"])
    listed = pd.concat([on_path.head(words.GLANCE_LEVERS - 1), on_path[on_path["kind"] == "bound"]])
    positions = [glance.index(text.html(lever)) for lever in listed["lever"]]
    assert positions == sorted(positions) and len(positions) == words.GLANCE_LEVERS
    for lever in listed.itertuples():
        assert text.html(lever.lever) in glance and text.ratio(lever.gain) in glance
        # each change says whose time it is: a call's or a token's
        change = f"{text.us_change(lever.now_us, lever.with_us)} a {lever.per} ({lever.kind})"
        assert text.html(change) in glance
    assert "a token (measured)" in glance and "a call (bound)" in glance
    # the EP lever's time is measured, its all-to-alls not (one GPU): its words say so, on the
    # front page where it is among the largest, and in chapter 04's findings always
    ep = on_path[on_path["lever"].str.startswith("expert parallelism")]
    assert len(ep) and "(all-to-alls not measured: worth it under " in "\n".join(words.findings(d)).replace("\\", "")
    assert ("(all-to-alls not measured: worth it under " in glance) == bool(set(ep["lever"]) & set(listed["lever"]))
    left_out = shown[~shown["lever"].isin(listed["lever"])]
    for lever in left_out.itertuples():
        assert text.html(lever.lever) not in glance
    # the header says levers are left out, and how many (a reader missed batch 4096's 1.7x)
    assert len(left_out) and f"at B=512 ({len(listed)} of {len(on_path)})" in glance
    assert f"{text.sig(d.load['busiest_m'])} busiest" in glance
    # FP4 against bf16 / fp8 names its unit, a call: fp8's batch-2048 lever below is in tokens/s
    best, fp8 = d.fp4["best"]["layer_us"], d.fp4["fp8"]["layer_us"]
    assert re.search(rf"best FP4 vs bf16 / fp8 call</b>: [\d.]+x / {re.escape(text.ratio(fp8 / best))} as fast",
                     glance)
    # the diagnosed path's own window is power-capped (call 122): the verdict states its watts and
    # clock, so the glance does not repeat them
    assert d.chosen_power["capped"] and "power of" not in glance
    verdict = words.verdict_box(d)
    assert (f"{text.sig(d.chosen_power['avg_power_w'])} W, "
            f"limit {text.sig(d.chosen_power['power_limit_w'])} W") in verdict
    assert not re.search(r"\bnan\b|None", glance)


def test_a_committed_reference_resumed_elsewhere_is_not_its_own_reference(tmp_path):
    """The reference run is resumed on the H200 from a copy of its committed folder: its chapters
    show the previous committed run beside them, not themselves."""
    from fp4lab import schema
    from fp4lab.results import reference_run

    for run_id in ("20261201T1000Z-old", "20261201T2000Z-new"):
        RunDir.create(tmp_path, run_id).append_rows("gemm", [schema.blank_row("gemm", run_id=run_id, status="ok")])
    assert reference_run(root=tmp_path).name == "20261201T2000Z-new"
    assert reference_run(root=tmp_path, exclude="20261201T2000Z-new").name == "20261201T1000Z-old"
    assert reference_run(root=tmp_path, exclude="20261201T1000Z-old").name == "20261201T2000Z-new"


def test_the_share_file_keeps_what_the_verdict_box_no_longer_says(tmp_path):
    """The kernel-time sentence left the verdict box for the facts below it: the share file, which
    has no front page, still states it."""
    from fp4lab import share, text
    from fp4lab.analysis import decode
    from fp4lab.chapters import ch04_diagnosis as words

    leading = RunDir(latest_gpu_run(tmp_path, REFERENCE_ROOT))
    d = decode.diagnose(leading, decode.DiagnosisConfig.from_profile("full"))
    sentence = words.kernel_time_sentence(d)
    assert sentence and text.markdown_to_html(sentence) in share.share_html(leading, "full")


def test_the_front_page_says_why_from_the_profiles_of_its_gpu(tmp_path):
    """The committed Nsight Compute profiles (H200) give the verdict's 'kernel-limited' its count,
    with the leading H200 run's copy bandwidth, naming the three profiles."""
    from fp4lab import book

    run = RunDir.create(tmp_path, "cpu-run")
    leading = report.leading_run(run, False, tmp_path)
    page = book.front_page(run, {"reference_dir": str(leading.path), "chapters": [], "profile": "smoke"},
                           leading)
    line, = [line for line in page.splitlines() if line.startswith("- Why, counted by Nsight Compute")]
    assert ("`20261202T0215Z-h200-ncu`, `20261202T0230Z-h200-ncu-humming` and "
            "`20261206T2231Z-h200-ncu-cuda`") in line
    assert ("(fp4lab's Triton kernels, humming and fp4lab's CUDA kernels) run 2.5-5.0 instructions per "
            "weight") in line
    assert ("the copy bandwidth measured in the diagnosed run `20261203T1155Z-h200-full` (4.24 TB/s)" in line
            and "At 4.43 instructions" in line)
    assert "their instructions bound them" in line and "waits on its global loads" in line
    assert "The diagnosed path's kernel, cuda\\-w4a16\\-moe, profiled (mxfp4 glm\\-5 B=512: " in line


def test_a_change_of_time_writes_a_shared_unit_once():
    from fp4lab import text

    assert text.us_change(3.4, 1.72) == "3.40 → 1.72 us"
    assert text.us_change(1740.0, 1210.0) == "1.74 → 1.21 ms"
    assert text.span((1755.7, 2056.4), text.us) == "1.76-2.06 ms"
    assert text.span((980.0, 1020.0), text.us) == "980 us-1.02 ms"
    assert text.span([65.4, 66.2], text.pct) == "65-66%" and text.span([1.051, 1.118], lambda v: text.ratio(v, 3)) == "1.05-1.12x"
    assert text.span((8, 16), str) == "8-16" and text.span((16, 16), str) == "16"
    # a burst's spread reads one way on every page, and says "both" where its ends read the same
    assert text.percentile_spread(1700.4, 1950.2) == "20th-80th percentiles 1.70-1.95 ms"
    assert text.percentile_spread(1607.0, 1615.0) == "20th and 80th percentiles both 1.61 ms"
    assert text.us_change(1740.0, 980.0) == "1.74 ms → 980 us"
    assert text.us_change(float("nan"), 980.0) == f"{text.MISSING} → 980 us"


def test_chapter_00_states_what_fp4_saves_a_weight_read_per_format():
    """Chapter 00 said "about 3.6x fewer bytes" and chapter 01 "up to ~3.5x faster" for one ratio:
    it is computed from the formats, 2 B against 0.5625 (NVFP4) or 0.53125 (MXFP4) a weight."""
    from fp4lab.analysis import environment
    from fp4lab.analysis.run import view
    from fp4lab.chapters import ch00_environment

    assert environment.fp4_bytes_saving("nvfp4") == pytest.approx(2 / 0.5625, rel=1e-6)
    assert environment.fp4_bytes_saving("mxfp4") == pytest.approx(2 / 0.53125, rel=1e-6)
    said = ch00_environment.fp4_paragraph(view(latest_gpu_run(REFERENCE_ROOT)))
    assert "3.6x fewer bytes to read than bf16 in NVFP4, 3.8x in MXFP4" in said
