"""What each GPU can do on paper (with a source per figure), and which device this run is on.

`SPECS` is the sheet: dense peaks (no structured sparsity) per operand type, bandwidth, power,
SMs, caches. Where a vendor publishes only sparse figures, the dense figure is derived (sparse/2)
and its source says so. `detect()` reads the device in use through torch and NVML, or describes
the CPU, and matches a GPU's name to the sheet.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass, field
from typing import Any

FIGURES = ("compute_capability", "sm_count", "memory_gb", "memory_bw_tbps", "power_w",
           "smem_per_block_kb", "l2_mb")
PEAK_KEYS = ("fp4", "fp8", "bf16", "fp32")
NATIVE_FP4_CAPABILITIES = {(10, 0), (10, 3), (12, 0), (12, 1)}   # Blackwell: sm_100/103/120/121

# Sources, named once.
REFS = "docs/REFERENCES.md (vendor spec sheets, dense figures)"
H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"
H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5)"
H200_DS = "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column"
H200_MEASURED = "read by fp4lab on the project's H200 (torch device properties, chapter 00 of the reference run)"
HOPPER_GUIDE = "CUDA C++ Programming Guide, compute capability 9.0 (227 KB per block)"
B200_DS = "NVIDIA HGX B200 datasheet (per-GPU figures = 8-GPU figures / 8)"
BLACKWELL_GUIDE = "CUDA C++ Programming Guide, compute capability 10.0 (227 KB per block)"
SM12X_GUIDE = "CUDA C++ Programming Guide, compute capability 12.x (99 KB per block)"
ADA_GUIDE = "CUDA C++ Programming Guide, compute capability 8.9 (99 KB per block)"
RTXPRO_DS = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet"
RTXPRO_ANNOUNCE = "NVIDIA RTX PRO 6000 Blackwell launch specs (GTC 2025; full GB202 L2)"
RTX5090_SPECS = "NVIDIA GeForce RTX 5090 product specs / RTX Blackwell GPU architecture whitepaper"
L40S_DS = "NVIDIA L40S datasheet"
NO_FP4 = "no FP4 tensor cores on this architecture (FP4 runs only as weight-only kernels)"
CC_TABLE = "CUDA GPUs compute capability table (developer.nvidia.com/cuda-gpus)"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's paper figures. Peaks are dense TFLOP/s; None where the GPU has no such unit."""

    key: str                                   # short id used in run labels: "h200"
    name: str
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_gb: float
    memory_bw_tbps: float
    power_w: float
    smem_per_block_kb: float
    l2_mb: float | None
    peak_tflops: dict[str, float | None]       # keys fp4, fp8, bf16, fp32; dense
    sources: dict[str, str]                    # figure name (or peak key) -> where it comes from
    notes: str = ""

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


SPECS: dict[str, GpuSpec] = {spec.key: spec for spec in [
    GpuSpec(
        key="h100", name="NVIDIA H100 SXM", arch="Hopper", compute_capability=(9, 0),
        sm_count=132, memory_gb=80, memory_bw_tbps=3.35, power_w=700, smem_per_block_kb=227,
        l2_mb=50, peak_tflops={"fp4": None, "fp8": 1979, "bf16": 989, "fp32": 67},
        sources={"compute_capability": CC_TABLE, "sm_count": H100_WP, "memory_gb": H100_DS,
                 "memory_bw_tbps": H100_DS, "power_w": H100_DS, "smem_per_block_kb": HOPPER_GUIDE,
                 "l2_mb": H100_WP, "fp4": NO_FP4, "fp8": REFS + "; " + H100_DS + " (dense = sparse/2)",
                 "bf16": REFS + "; " + H100_DS + " (dense = sparse/2)", "fp32": H100_DS},
        notes="Hopper: FP8 tensor cores, no FP4; NVFP4/MXFP4 weights are decoded to bf16/fp8.",
    ),
    GpuSpec(
        key="h200", name="NVIDIA H200 SXM", arch="Hopper", compute_capability=(9, 0),
        sm_count=132, memory_gb=141, memory_bw_tbps=4.8, power_w=700, smem_per_block_kb=227,
        l2_mb=60, peak_tflops={"fp4": None, "fp8": 1979, "bf16": 989, "fp32": 67},
        sources={"compute_capability": CC_TABLE, "sm_count": REFS, "memory_gb": H200_DS,
                 "memory_bw_tbps": REFS + "; " + H200_DS, "power_w": REFS + "; " + H200_DS,
                 "smem_per_block_kb": HOPPER_GUIDE, "l2_mb": H200_MEASURED, "fp4": NO_FP4,
                 "fp8": REFS + "; " + H200_DS + " (dense = sparse/2)",
                 "bf16": REFS + "; " + H200_DS + " (dense = sparse/2)", "fp32": H200_DS},
        notes="The project's test GPU. Same compute as H100 SXM, more and faster HBM3e.",
    ),
    GpuSpec(
        key="b200", name="NVIDIA B200", arch="Blackwell", compute_capability=(10, 0),
        sm_count=148, memory_gb=180, memory_bw_tbps=8.0, power_w=1000, smem_per_block_kb=227,
        l2_mb=None, peak_tflops={"fp4": 9000, "fp8": 4500, "bf16": 2250, "fp32": None},
        sources={"compute_capability": CC_TABLE,
                 "sm_count": "CUDA device properties reported on B200 systems (not on the datasheet)",
                 "memory_gb": B200_DS, "memory_bw_tbps": REFS + "; " + B200_DS,
                 "power_w": REFS + "; " + B200_DS, "smem_per_block_kb": BLACKWELL_GUIDE,
                 "l2_mb": "not on NVIDIA's datasheet: left blank (detect() reads it on the device)",
                 "fp4": REFS + "; " + B200_DS + " (dense = sparse/2)",
                 "fp8": REFS + "; " + B200_DS + " (dense = sparse/2)",
                 "bf16": REFS + "; " + B200_DS + " (dense = sparse/2)",
                 "fp32": "no per-GPU FP32 (non-tensor) figure on the HGX B200 datasheet: left blank"},
        notes="Datacenter Blackwell (sm_100): NVFP4 and MXFP4 tensor cores (tcgen05).",
    ),
    GpuSpec(
        key="rtx-pro-6000", name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        arch="Blackwell", compute_capability=(12, 0), sm_count=188, memory_gb=96,
        memory_bw_tbps=1.79, power_w=600, smem_per_block_kb=99, l2_mb=128,
        peak_tflops={"fp4": 2000, "fp8": 1000, "bf16": 500, "fp32": 125},
        sources={"compute_capability": CC_TABLE, "sm_count": REFS, "memory_gb": RTXPRO_DS,
                 "memory_bw_tbps": REFS + "; " + RTXPRO_DS, "power_w": REFS + "; " + RTXPRO_DS,
                 "smem_per_block_kb": REFS + "; " + SM12X_GUIDE, "l2_mb": RTXPRO_ANNOUNCE,
                 "fp4": REFS + ": derived, dense = 4000 AI TOPS (FP4, sparse) / 2",
                 "fp8": REFS + ": derived (third-party breakdown), dense = FP4 dense / 2",
                 "bf16": REFS + ": derived (third-party breakdown), dense = FP8 dense / 2",
                 "fp32": RTXPRO_DS + " (125 TFLOPS single precision)"},
        notes="The seed's GPU (sm_120): FP4 tensor cores (mma.sync block-scaled), 99 KB smem "
              "per block limits tile sizes compared with sm_100.",
    ),
    GpuSpec(
        key="rtx-5090", name="NVIDIA GeForce RTX 5090", arch="Blackwell",
        compute_capability=(12, 0), sm_count=170, memory_gb=32, memory_bw_tbps=1.792,
        power_w=575, smem_per_block_kb=99, l2_mb=96,
        peak_tflops={"fp4": 1676, "fp8": 838, "bf16": 209.5, "fp32": 104.8},
        sources={"compute_capability": CC_TABLE, "sm_count": RTX5090_SPECS,
                 "memory_gb": RTX5090_SPECS, "memory_bw_tbps": RTX5090_SPECS,
                 "power_w": RTX5090_SPECS + " (total graphics power)",
                 "smem_per_block_kb": SM12X_GUIDE, "l2_mb": RTX5090_SPECS,
                 "fp4": RTX5090_SPECS + ": derived, dense = 3352 AI TOPS (FP4, sparse) / 2",
                 "fp8": RTX5090_SPECS + ": derived, dense = 1676 (FP8, sparse) / 2",
                 "bf16": RTX5090_SPECS + ": derived, dense = 838 (FP16 tensor, sparse) / 2, "
                         "halved again for FP32 accumulate on GeForce",
                 "fp32": RTX5090_SPECS},
        notes="Consumer sm_120. GeForce tensor cores run FP32-accumulate at reduced rate; "
              "the fp8 figure is the FP16-accumulate rate.",
    ),
    GpuSpec(
        key="l40s", name="NVIDIA L40S", arch="Ada Lovelace", compute_capability=(8, 9),
        sm_count=142, memory_gb=48, memory_bw_tbps=0.864, power_w=350, smem_per_block_kb=99,
        l2_mb=96, peak_tflops={"fp4": None, "fp8": 733, "bf16": 362.05, "fp32": 91.6},
        sources={"compute_capability": CC_TABLE, "sm_count": L40S_DS, "memory_gb": L40S_DS,
                 "memory_bw_tbps": L40S_DS, "power_w": L40S_DS, "smem_per_block_kb": ADA_GUIDE,
                 "l2_mb": "NVIDIA Ada GPU architecture whitepaper (AD102: 96 MB L2)",
                 "fp4": NO_FP4, "fp8": L40S_DS + " (dense; sparse 1466)",
                 "bf16": L40S_DS + " (dense; sparse 733)", "fp32": L40S_DS},
        notes="Ada (sm_89): FP8 tensor cores, no FP4.",
    ),
]}

# How a device name (torch / NVML) maps to a sheet entry: (pattern, exclude pattern, key).
# Variants with other power or memory (PCIe, NVL, Max-Q, laptop, GB200) stay unmatched.
NAME_RULES: tuple[tuple[str, str | None, str], ...] = (
    (r"\bh200\b", r"\bnvl\b", "h200"),
    (r"\bh100\b.*\b(sxm\d?|hbm3)\b", r"\b(pcie|nvl)\b", "h100"),
    (r"(?<![a-z])b200\b", None, "b200"),
    (r"\brtx pro 6000 blackwell\b", r"max-q", "rtx-pro-6000"),
    (r"\brtx 5090\b", r"laptop|\b5090 d\b", "rtx-5090"),
    (r"\bl40s\b", None, "l40s"),
)


def match_spec(name: str | None) -> GpuSpec | None:
    """The sheet entry for a device name such as "NVIDIA H100 80GB HBM3", or None if unknown."""
    if not name:
        return None
    text = name.lower()
    for pattern, exclude, key in NAME_RULES:
        if re.search(pattern, text) and not (exclude and re.search(exclude, text)):
            return SPECS[key]
    return None


def native_fp4_formats(compute_capability) -> list[str]:
    """FP4 formats the tensor cores run: Blackwell (sm_100/103/120/121) only; [] for Hopper/CPU."""
    if compute_capability is None:
        return []
    try:
        major, minor = (int(part) for part in compute_capability)
    except (TypeError, ValueError):
        raise ValueError(f"compute capability must be a (major, minor) pair, "
                         f"got {compute_capability!r}") from None
    return ["nvfp4", "mxfp4"] if (major, minor) in NATIVE_FP4_CAPABILITIES else []


# -- the device in use ------------------------------------------------------------------------

@dataclass
class DeviceInfo:
    """The device a run measured on. GPU fields are None on CPU, CPU fields None on a GPU."""

    kind: str                                    # "cuda" or "cpu"
    name: str
    compute_capability: tuple[int, int] | None = None
    driver: str | None = None
    cuda_version: str | None = None
    memory_gb: float | None = None               # GiB as the driver reports it
    sm_count: int | None = None
    l2_mb: float | None = None
    sm_clock_mhz: float | None = None            # current, at the moment of detect()
    max_sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None           # maximum memory clock
    power_limit_w: float | None = None           # enforced limit
    pci_bus_id: str | None = None                # NVML's id of the GPU, e.g. 00000000:18:00.0
    index: int | None = None                     # torch's CUDA index of the GPU
    spec: GpuSpec | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    torch_threads: int | None = None
    notes: list[str] = field(default_factory=list)   # why a field is missing (e.g. no NVML)

    @property
    def label(self) -> str:
        """Short name for run ids: the sheet key ("h200"), else a slug of the name, or "cpu"."""
        if self.kind == "cpu":
            return "cpu"
        if self.spec is not None:
            return self.spec.key
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower().replace("nvidia", "")).strip("-") or "gpu"

    @property
    def native_fp4(self) -> list[str]:
        return native_fp4_formats(self.compute_capability)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the spec appears as its key, the capability as a list."""
        data = asdict(self)
        data["spec"] = self.spec.key if self.spec else None
        if self.compute_capability is not None:
            data["compute_capability"] = list(self.compute_capability)
        data["label"] = self.label
        data["native_fp4"] = self.native_fp4
        return data


def resolve_device(device: str = "auto") -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; "cuda"/"cuda:N" must have a GPU."""
    import torch

    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ValueError(f"device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU "
                         f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} asked for, but torch sees {torch.cuda.device_count()} CUDA "
                         f"GPU(s): cuda:0 to cuda:{torch.cuda.device_count() - 1} (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
    return device


def detect(device: str = "auto") -> DeviceInfo:
    """The device this process measures on: a GPU through torch + NVML, or the CPU."""
    resolved = resolve_device(device)
    return _detect_cpu() if resolved == "cpu" else _detect_cuda(resolved)


def _detect_cuda(device: str) -> DeviceInfo:
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    l2_bytes = getattr(props, "L2_cache_size", None)
    info = DeviceInfo(
        kind="cuda", name=props.name, compute_capability=(props.major, props.minor), index=index,
        cuda_version=torch.version.cuda, memory_gb=round(props.total_memory / 2**30, 1),
        sm_count=props.multi_processor_count,
        l2_mb=round(l2_bytes / 2**20, 1) if l2_bytes else None,
        spec=match_spec(props.name),
    )
    _fill_from_nvml(info, index)
    return info


def _fill_from_nvml(info: DeviceInfo, index: int) -> None:
    """Driver, clocks and power limit through fp4lab.nvml's reader; each missing answer leaves
    its field None and says why in `info.notes`."""
    from fp4lab import nvml

    pynvml, why = nvml.load_nvml()
    if pynvml is None:
        info.notes.append(f"NVML: {why}")
        return
    try:
        reader = nvml.GpuReader(pynvml, index)
        info.driver = reader.driver_version()
        info.pci_bus_id = reader.bus_id
        info.sm_clock_mhz = reader.sm_clock_mhz()
        info.max_sm_clock_mhz = reader.max_clock_mhz("sm")
        info.mem_clock_mhz = reader.max_clock_mhz("mem")
        info.power_limit_w = reader.power_limit_w
        info.notes += [f"NVML: {field} unavailable ({message})" for field, message in reader.refused.items()]
    except Exception as exc:  # noqa: BLE001 - one unanswered query costs fields, never detect()
        info.notes.append(f"NVML: device unavailable ({exc})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down must not hide what was read
            pass


def _detect_cpu() -> DeviceInfo:
    import torch

    model = cpu_model()
    return DeviceInfo(kind="cpu", name=model, cpu_model=model, cpu_count=os.cpu_count(),
                      torch_threads=torch.get_num_threads())


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# -- tables for the book ----------------------------------------------------------------------

def spec_table():
    """The whole sheet, one row per GPU (dense TFLOP/s), for side-by-side comparison."""
    import pandas as pd

    rows = []
    for spec in SPECS.values():
        row = {"key": spec.key, "name": spec.name, "arch": spec.arch, "sm": spec.sm}
        row.update({name: getattr(spec, name) for name in FIGURES if name != "compute_capability"})
        row.update({f"{kind}_tflops": spec.peak_tflops[kind] for kind in PEAK_KEYS})
        row["native_fp4"] = ", ".join(native_fp4_formats(spec.compute_capability)) or "none"
        rows.append(row)
    return pd.DataFrame(rows)


def spec_sheet(key: str):
    """One GPU's figures with the source of each: columns figure, value, source."""
    import pandas as pd

    if key not in SPECS:
        raise ValueError(f"no spec sheet for {key!r}: known GPUs are {sorted(SPECS)}")
    spec = SPECS[key]
    rows = [{"figure": name, "value": getattr(spec, name), "source": spec.sources[name]}
            for name in FIGURES]
    rows += [{"figure": f"{kind} dense TFLOP/s", "value": spec.peak_tflops[kind],
              "source": spec.sources[kind]} for kind in PEAK_KEYS]
    frame = pd.DataFrame(rows)
    frame["value"] = frame["value"].map(lambda v: "-" if v is None else
                                        (f"{v[0]}.{v[1]}" if isinstance(v, tuple) else v))
    return frame
