"""The chapter modules build their pages from a run folder; two chapters never state one number
two ways (chapters 03 and 04 on the committed H200 reference run); a GPU run rendered on a CPU is
shown as measured and never added to."""

from __future__ import annotations

import re
import shutil

import pytest

from fp4lab.chapters import CHAPTERS, ch03_moe, ch04_diagnosis
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
    assert f"grouped-bf16" in page_text(diagnosis_page, "paths") and ratio == "1.1x"


def test_a_gpu_run_rendered_on_a_cpu_is_never_added_to(reference_copy):
    before = (reference_copy / "gemm.jsonl").read_text()
    CHAPTERS["01_fp4_gemm_sweep"].build(str(reference_copy), "none", "full", "cpu")
    assert (reference_copy / "gemm.jsonl").read_text() == before


def test_every_chapter_fills_its_sections_from_the_reference(reference_copy):
    for stem, module in CHAPTERS.items():
        page = module.build(str(reference_copy), "none", "full", "cpu")
        assert page.sections.get("findings"), f"{stem} states no finding"
        assert not page.smoke, f"{stem}: the H200 run is not a smoke run"
