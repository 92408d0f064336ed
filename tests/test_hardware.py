"""fp4lab.hardware: the spec sheet, name matching, detect() on CPU and with a faked GPU + NVML."""

import json
import sys
import types

import pytest
import torch

from fp4lab import hardware as hw


# -- the sheet --------------------------------------------------------------------------------

def test_sheet_has_the_issue_gpus():
    assert {"h100", "h200", "b200", "rtx-pro-6000", "rtx-5090", "l40s"} <= set(hw.SPECS)


@pytest.mark.parametrize("key", sorted(hw.SPECS))
def test_every_figure_has_a_value_type_and_a_source(key):
    spec = hw.SPECS[key]
    assert spec.key == key and spec.name and spec.arch
    assert set(spec.peak_tflops) == set(hw.PEAK_KEYS)
    for figure in hw.FIGURES + hw.PEAK_KEYS:
        assert spec.sources.get(figure, "").strip(), f"{key}: no source for {figure}"
    for figure in ("sm_count", "memory_gb", "memory_bw_tbps", "power_w", "smem_per_block_kb"):
        assert getattr(spec, figure) > 0, f"{key}: {figure}"
    for kind, value in spec.peak_tflops.items():
        assert value is None or value > 0, f"{key}: {kind}"
    assert spec.peak_tflops["bf16"] and spec.peak_tflops["fp8"]


def test_fp4_peaks_exactly_where_fp4_tensor_cores_exist():
    for spec in hw.SPECS.values():
        has_fp4 = spec.peak_tflops["fp4"] is not None
        assert has_fp4 == bool(hw.native_fp4_formats(spec.compute_capability)), spec.key


def test_published_figures_from_references():
    h200, rtx = hw.SPECS["h200"], hw.SPECS["rtx-pro-6000"]
    assert (h200.sm_count, h200.memory_bw_tbps, h200.peak_tflops["bf16"]) == (132, 4.8, 989)
    assert (rtx.sm_count, rtx.smem_per_block_kb, rtx.power_w) == (188, 99, 600)
    assert "sparse" in rtx.sources["fp4"] and "derived" in rtx.sources["fp4"]


def test_spec_table_and_sheet():
    table = hw.spec_table()
    assert list(table["key"]) == list(hw.SPECS)
    assert {"fp4_tflops", "fp8_tflops", "bf16_tflops", "fp32_tflops", "l2_mb", "native_fp4"} <= set(table)
    sheet = hw.spec_sheet("h200")
    assert list(sheet.columns) == ["figure", "value", "source"]
    assert sheet["source"].str.len().min() > 0
    assert sheet.set_index("figure").loc["compute_capability", "value"] == "9.0"
    with pytest.raises(ValueError, match="no spec sheet for 'a100'"):
        hw.spec_sheet("a100")


# -- names and capabilities -------------------------------------------------------------------

@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 SXM5 80GB", "h100"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
    ("NVIDIA GeForce RTX 5090", "rtx-5090"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GB200", None),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", None),
    ("NVIDIA A100-SXM4-80GB", None),
    ("", None),
])
def test_name_matching(name, key):
    spec = hw.match_spec(name)
    assert (spec.key if spec else None) == key


def test_native_fp4_formats():
    for cc in [(10, 0), (10, 3), (12, 0), (12, 1), [12, 0]]:
        assert hw.native_fp4_formats(cc) == ["nvfp4", "mxfp4"]
    for cc in [(9, 0), (8, 9), (11, 0), None]:
        assert hw.native_fp4_formats(cc) == []
    with pytest.raises(ValueError, match="compute capability"):
        hw.native_fp4_formats("sm_90")


# -- detect() on this machine -----------------------------------------------------------------

def test_detect_cpu():
    info = hw.detect("cpu")
    assert info.kind == "cpu" and info.label == "cpu" and info.spec is None
    assert info.cpu_model and info.name == info.cpu_model
    assert info.cpu_count >= 1 and info.torch_threads == torch.get_num_threads()
    assert info.native_fp4 == []
    assert json.loads(json.dumps(info.as_dict()))["kind"] == "cpu"


def test_detect_auto_on_cpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hw.detect().kind == "cpu"
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        hw.detect("cuda")
    with pytest.raises(ValueError, match="device 'gpu'"):
        hw.detect("gpu")


# -- a faked GPU: torch properties + pynvml (tests/fakes) ------------------------------------

def test_a_gpu_index_the_box_lacks_is_refused_naming_what_it_has(fake_gpu, monkeypatch):
    """On a box of two GPUs, cuda:1 is fine and cuda:2 a clear error, not a CUDA traceback later."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    fake_gpu((9, 0), count=2)
    assert hw.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"device 'cuda:2' asked for, but torch sees 2 CUDA GPU\(s\): "
                                         r"cuda:0 to cuda:1 \(CUDA_VISIBLE_DEVICES='4,5'\)"):
        hw.resolve_device("cuda:2")


def test_detect_fake_h200_with_nvml(fake_gpu, fake_nvml):
    fake_gpu((9, 0))
    fake_nvml(sm_clock_mhz=345)
    info = hw.detect("auto")
    assert info.kind == "cuda" and info.label == "h200" and info.spec is hw.SPECS["h200"]
    assert info.compute_capability == (9, 0) and info.native_fp4 == []
    assert (info.sm_count, info.l2_mb, info.memory_gb) == (132, 60.0, 139.7)
    assert (info.driver, info.sm_clock_mhz, info.max_sm_clock_mhz, info.mem_clock_mhz,
            info.power_limit_w) == ("580.159.04", 345, 1980, 3201, 700.0)
    assert info.pci_bus_id == "00000000:18:00.0" and info.notes == []
    data = json.loads(json.dumps(info.as_dict()))
    assert data["spec"] == "h200" and data["compute_capability"] == [9, 0]


def test_detect_reads_the_gpu_by_bus_id_not_by_index(fake_gpu, fake_nvml):
    """torch's cuda:0 is NVML's last GPU in the fake (as under CUDA_VISIBLE_DEVICES reordering)."""
    from fp4lab import nvml

    fake_gpu((9, 0), count=4)
    fake = fake_nvml(gpus=4)
    fake.nvmlInit()
    assert nvml.GpuReader(fake, 0).handle == ("gpu", 3)
    assert nvml.GpuReader(fake, 3).handle == ("gpu", 0)


def test_detect_without_pynvml(fake_gpu, monkeypatch):
    fake_gpu((9, 0))
    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml -> ImportError
    info = hw.detect("cuda")
    assert info.name == "NVIDIA H200" and info.sm_count == 132
    assert info.driver is None and info.power_limit_w is None
    assert any("not installed" in note for note in info.notes)


def test_detect_when_nvml_init_fails(fake_gpu, fake_nvml):
    fake_gpu((9, 0))
    fake_nvml(no_library=True)
    info = hw.detect("cuda:0")
    assert info.kind == "cuda" and info.driver is None and info.sm_clock_mhz is None
    assert any("nvmlInit failed" in note for note in info.notes)


def test_detect_when_single_nvml_calls_fail(fake_gpu, fake_nvml):
    fake_gpu((9, 0))
    fake_nvml(unsupported={"nvmlDeviceGetEnforcedPowerLimit", "clock:sm",
                           "nvmlDeviceGetHandleByPciBusId"})
    info = hw.detect("cuda")
    assert info.power_limit_w is None and info.sm_clock_mhz is None
    assert info.driver == "580.159.04" and info.max_sm_clock_mhz == 1980   # the rest still read
    assert len(info.notes) == 2 and all(note.startswith("NVML:") for note in info.notes)


def test_unknown_gpu_gets_no_spec_and_a_slug_label(fake_gpu, monkeypatch):
    fake_gpu((8, 0), name="NVIDIA A100-SXM4-80GB")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    info = hw.detect()
    assert info.spec is None and info.label == "a100-sxm4-80gb"


@pytest.mark.cuda
def test_detect_real_gpu():
    info = hw.detect("cuda")
    assert info.kind == "cuda" and info.sm_count > 0 and info.memory_gb > 0
    json.dumps(info.as_dict())
