"""The two sweeps, declared as data: the GEMM grid and the MoE grid, their defaults from a profile.

A config is built once (`from_profile` lays the given values over the profile's section), checked
once (`check`: every field, the backend and method names, the timer settings), stored in run.json
(`as_dict`) and rebuilt from there to resume (`from_dict`). A value of None keeps the profile's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fp4lab import params, profiles
from fp4lab.bench import TimerConfig
from fp4lab.errors import ParameterError
from fp4lab.formats import BLOCK_SIZE

FORMATS = tuple(BLOCK_SIZE)
DEVICES = ("auto", "cpu", "cuda")
GEMMS = ("gate_up", "down")
GPUS = ("one", "all")           # the GEMM sweep on one device, or on every GPU (fp4lab.sweep.ranks)
DENSE_M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _overlay(section: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The section with every override that is not None laid over it (timer settings merge)."""
    values = dict(section)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "timer" and isinstance(value, dict):
            value = {**values.get("timer", {}), **value}
        values[key] = value
    return values


def _settings(cls, what: str, values: Any) -> dict[str, Any]:
    """`values` (a profile section laid over, or a config stored in run.json) as the keyword
    arguments of `cls`: a mapping with no unknown and no missing setting, the timer built.
    Anything else is one line naming the setting, never a TypeError."""
    if not isinstance(values, dict):
        raise ParameterError(f"{what}: expected a mapping of settings, found {params.shown(values)}")
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ParameterError(f"{what}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(names))})")
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in values]
    if required:
        raise ParameterError(f"{what}: missing setting {required[0]!r}")
    return {**values, "timer": timer_config(values.get("timer", {}))}


def timer_config(values: Any) -> TimerConfig:
    """TimerConfig.from_dict, with a wrong-typed setting (e.g. a string where a number goes) as
    one line naming it too."""
    try:
        return TimerConfig.from_dict(values)
    except TypeError as exc:
        raise ParameterError(f"timer: {exc}") from None


def check_gpus(value: Any) -> str:
    if value not in GPUS:
        raise ParameterError(f"gpus={params.shown(value)}: use 'one' (this process, one device) or "
                             "'all' (one torchrun rank per visible GPU)")
    return value


def check_device(device: str) -> str:
    """"auto", "cpu", "cuda" or "cuda:N"; a GPU asked for must be there."""
    from fp4lab import hardware

    params.check_text("device", device)
    try:
        hardware.resolve_device(device)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    return device


def preset_shapes(name: str) -> tuple[tuple[int, int], ...]:
    """The expert GEMM shapes (N, K) of a model preset."""
    from fp4lab.moe import presets

    try:
        model = presets.get(name)
    except ValueError as exc:
        raise ParameterError(f"preset: {exc}") from None
    return tuple(tuple(shape) for shape in model.gemm_shapes().values())


@dataclass(frozen=True)
class GemmSweep:
    """The GEMM grid: backends x formats x weight shapes (N, K) x M, and how each point is timed."""

    backends: tuple[str, ...]          # empty: every registered backend
    fmts: tuple[str, ...]
    m_values: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]
    timer: TimerConfig
    energy_window_s: float             # 0: no energy window per point
    telemetry_hz: float
    point_timeout_s: float             # a point that takes longer becomes a `timeout` row
    anatomy_m: tuple[int, ...] = ()    # Ms at which fp4lab's FP4 kernels are dissected by stage
    anatomy_fmts: tuple[str, ...] = ()  # of fmts, those they are dissected in (empty: every one)
    gpus: str = "one"                  # "all": one torchrun rank per visible GPU (sweep.ranks)
    device: str = "auto"
    profile: str = "smoke"
    seed: int = 0

    @classmethod
    def from_profile(cls, profile: str = "auto", device: str = "auto", preset: str | None = None,
                     **overrides: Any) -> "GemmSweep":
        """The profile's `gemm` section with `overrides` laid over it; `preset` adds a model's
        expert shapes to the shapes. Checked."""
        profile = profiles.resolve(profile, _has_cuda(device))
        values = _overlay(profiles.section(profile, "gemm"), overrides)
        profile_preset = values.pop("preset", "")
        preset = profile_preset if preset is None else preset
        shapes = params.check_shapes("shapes", values.pop("shapes"))
        if not shapes:      # before the preset adds its shapes: an empty list is an error on every profile
            raise ParameterError("shapes=[]: give at least one [N, K] weight shape")
        if preset:
            shapes = tuple(dict.fromkeys(shapes + preset_shapes(params.check_text("preset", preset))))
        return cls.from_dict({**values, "shapes": shapes, "device": device, "profile": profile})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GemmSweep":
        return cls(**_settings(cls, "gemm sweep", values)).check()

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "timer": self.timer.as_dict()}

    def check(self) -> "GemmSweep":
        from fp4lab.sweep.registry import backend_names

        known = backend_names()
        fmts = params.check_text_list("fmts", self.fmts, FORMATS, allow_empty=False)
        shapes = params.check_shapes("shapes", self.shapes)
        if not shapes:
            raise ParameterError("shapes=[]: give at least one [N, K] weight shape")
        for n, k in shapes:
            for fmt in fmts:
                if k % BLOCK_SIZE[fmt]:
                    raise ParameterError(f"shapes: K={k} of {n}x{k} is not a multiple of the {fmt} "
                                         f"block size ({BLOCK_SIZE[fmt]})")
        return dataclasses.replace(
            self,
            backends=params.check_text_list("backends", self.backends, known),
            fmts=fmts, shapes=shapes,
            m_values=params.check_int_list("m_values", self.m_values),
            anatomy_m=params.check_int_list("anatomy_m", self.anatomy_m, allow_empty=True),
            anatomy_fmts=params.check_text_list("anatomy_fmts", self.anatomy_fmts, FORMATS),
            gpus=check_gpus(self.gpus),
            energy_window_s=params.check_float("energy_window_s", self.energy_window_s, 0, 60),
            telemetry_hz=params.check_float("telemetry_hz", self.telemetry_hz, 0, 1000, strict_minimum=True),
            **_checked_common(self))

    @property
    def backend_names(self) -> tuple[str, ...]:
        from fp4lab.sweep.registry import backend_names

        return self.backends or tuple(backend_names())

    @property
    def anatomy_formats(self) -> tuple[str, ...]:
        """The grid's formats the anatomy dissects (a grid of other formats: none)."""
        return tuple(f for f in self.fmts if f in self.anatomy_fmts) if self.anatomy_fmts else self.fmts


@dataclass(frozen=True)
class MoeSweep:
    """The MoE grid: every MoE method at the routed loads of each decode batch and EP degree,
    plus one expert's dense curve (the layer model's input)."""

    preset: str
    batch_sizes: tuple[int, ...]
    routing: str
    ep_degrees: tuple[int, ...]
    fmts: tuple[str, ...]              # FP4 formats of the FP4 and layer methods
    methods: tuple[str, ...]           # empty: every registered MoE method
    steps: int                         # routing steps drawn; the typical one is timed
    timer: TimerConfig
    point_timeout_s: float
    scaled: bool = False               # a tiny stand-in preset (the CPU smoke run): rows say so
    gemms: tuple[str, ...] = GEMMS
    dense_m_values: tuple[int, ...] = DENSE_M_VALUES
    anatomy_batches: tuple[int, ...] = ()   # batches at which fp4lab's fused MoE is dissected
    energy_batches: tuple[int, ...] = ()    # batches whose points also get an energy window...
    energy_window_s: float = 0.0            # ...of this long (0: none)
    device: str = "auto"
    profile: str = "smoke"
    seed: int = 0

    @classmethod
    def from_profile(cls, profile: str = "auto", device: str = "auto", **overrides: Any) -> "MoeSweep":
        """The profile's `moe` section with `overrides` over it; on a CPU the preset is scaled down
        (seconds, not hours) unless `scaled` is given."""
        has_cuda = _has_cuda(device)
        profile = profiles.resolve(profile, has_cuda)
        values = _overlay(profiles.section(profile, "moe"), overrides)
        for chapter_only in ("measure", "target_utilization"):
            values.pop(chapter_only, None)
        values.setdefault("scaled", not has_cuda or device == "cpu")
        return cls.from_dict({**values, "device": device, "profile": profile})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MoeSweep":
        return cls(**_settings(cls, "moe sweep", values)).check()

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "timer": self.timer.as_dict()}

    def model(self):
        from fp4lab.moe import presets

        model = presets.get(self.preset)
        return presets.scaled_down(model) if self.scaled else model

    def check(self) -> "MoeSweep":
        from fp4lab.moe import presets, routing
        from fp4lab.sweep.registry import moe_method_names

        try:
            model = presets.get(params.check_text("preset", self.preset, allow_empty=False))
            spec = routing.parse_routing(params.check_text("routing", self.routing, allow_empty=False))
        except ParameterError:
            raise
        except ValueError as exc:
            raise ParameterError(str(exc)) from None
        ep_degrees = params.check_int_list("ep_degrees", self.ep_degrees)
        scaled = params.check_bool("scaled", self.scaled)
        batch_sizes = params.check_int_list("batch_sizes", self.batch_sizes)
        steps = params.check_int("steps", self.steps, 1, 100_000)
        measured = presets.scaled_down(model) if scaled else model
        for ep in ep_degrees:
            if measured.experts % ep:
                raise ParameterError(f"ep_degrees: {measured.experts} experts do not split evenly over {ep} ranks")
        if spec.kind == "trace":          # the file must fit every batch now, not fail every point later
            for batch in batch_sizes:
                try:
                    routing.load_trace(spec.trace_path, measured.experts, measured.top_k, batch=batch, steps=steps)
                except ValueError as exc:
                    raise ParameterError(f"routing: {exc}") from None
        return dataclasses.replace(
            self,
            batch_sizes=batch_sizes,
            ep_degrees=ep_degrees,
            fmts=params.check_text_list("fmts", self.fmts, FORMATS, allow_empty=False),
            methods=params.check_text_list("methods", self.methods, moe_method_names()),
            gemms=params.check_text_list("gemms", self.gemms, GEMMS, allow_empty=False),
            dense_m_values=params.check_int_list("dense_m_values", self.dense_m_values),
            anatomy_batches=params.check_int_list("anatomy_batches", self.anatomy_batches,
                                                  allow_empty=True),
            energy_batches=params.check_int_list("energy_batches", self.energy_batches, allow_empty=True),
            energy_window_s=params.check_float("energy_window_s", self.energy_window_s, 0, 60),
            steps=steps,
            scaled=scaled,
            **_checked_common(self))

    @property
    def method_names(self) -> tuple[str, ...]:
        from fp4lab.sweep.registry import moe_method_names

        return self.methods or tuple(moe_method_names())


def _checked_common(sweep) -> dict[str, Any]:
    """The fields every sweep config has, checked: point_timeout_s, device, profile, seed."""
    return {"point_timeout_s": params.check_float("point_timeout_s", sweep.point_timeout_s, 0, 86400,
                                                  strict_minimum=True),
            "device": check_device(sweep.device), "profile": profiles.check(sweep.profile),
            "seed": params.check_int("seed", sweep.seed, minimum=0)}


def _has_cuda(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()
