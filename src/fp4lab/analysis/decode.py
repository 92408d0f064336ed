"""The diagnosis: what bounds one MoE layer at decode on the GPU a run measured, by how much,
and what would change it. Chapter 04, the book's front page and the share file all read this.

Every number comes from the run (gemm, moe, telemetry rows and the ceilings in run.json) and the
routing model of `fp4lab.moe`; nothing is typed in. A *path* is one way to run the layer's routed
experts at the decode batch B on one device, with its measured (or, for a GEMM backend, built from
measured GEMM times) layer time:
- each MoE method of the MoE sweep (loop, grouped, padded, FP8 grouped, FP4 layer methods): the
  measured layer time at the batch nearest B;
- each GEMM backend of the GEMM sweep run as a loop of per-expert GEMMs: active experts x (gate_up
  + down time at the mean tokens per expert, interpolated over the measured M).
Each path has three floors: launches (its expert-GEMM kernels per layer x the measured launch floor;
routing and glue kernels are not counted, so it is a lower bound), reading the
active experts' weights once in the bytes the path reads (at the measured copy bandwidth), and the
arithmetic at the peak of its math dtype. The diagnosed path is the fastest (or the one named);
its largest floor is the verdict, unless the GPU sits at its power limit at the decode point.

A CPU run is a smoke run: it checks the pipeline and issues no GPU verdict.
Shape legend: `B` decode batch, `E` routed experts, `k` top-k, `P` EP degree, `m` tokens per expert.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fp4lab import params, profiles, roofline, text
from fp4lab.analysis import comm as comm_analysis
from fp4lab.analysis import gemm as gemm_analysis
from fp4lab.analysis import moe as moe_analysis
from fp4lab.analysis import power as power_analysis
from fp4lab.analysis.run import RunView, view
from fp4lab.comm import ops as comm_ops
from fp4lab.errors import ParameterError
from fp4lab.moe import presets
from fp4lab.results import RunDir

SAME_SPEED_WITHIN = 0.05
TABLE_SOURCES = {"gemm": "the GEMM sweep (chapter 01)", "moe": "the MoE sweep (chapter 03)",
                 "telemetry": "power and clocks (chapter 02)"}


MODELLED = "modelled from measured GEMM times"        # how a lever's numbers were got
MEASURED_BATCHES = "measured (MoE sweep)"
BOUND = "a bound: the memory floor at the measured copy bandwidth"
KERNEL_GAP = 0.8     # a memory floor under this share of the layer: the kernel, not HBM, sets the rest


@dataclass(frozen=True)
class DiagnosisConfig:
    preset: str = "glm-5"
    decode_batch: int = 512            # B: concurrent decode requests, one token each
    backend: str = "auto"              # the path to diagnose; auto: the fastest at decode
    routing: str = "uniform"
    steps: int = 64                    # routing steps drawn for the load statistics
    seed: int = 0
    power_bound_fraction: float = 0.9  # decode-point power over the limit that counts as power-bound
    ep_degrees: tuple[int, ...] = (1, 2, 4, 8)

    @classmethod
    def from_profile(cls, profile: str, **overrides) -> "DiagnosisConfig":
        values = {**profiles.section(profiles.resolve(profile), "diagnosis"),
                  **{k: v for k, v in overrides.items() if v is not None}}
        return cls(**values).check()

    def check(self) -> "DiagnosisConfig":
        from fp4lab.moe import routing

        try:
            model = presets.get(params.check_text("preset", self.preset, allow_empty=False))
            spec = routing.parse_routing(params.check_text("routing", self.routing, allow_empty=False))
        except ParameterError:
            raise
        except ValueError as exc:
            raise ParameterError(str(exc)) from None
        decode_batch = params.check_int("decode_batch", self.decode_batch, 1, 1 << 20)
        steps = params.check_int("steps", self.steps, 1, 100_000)
        if spec.kind == "trace":          # a missing or malformed file fails here, not deep in the diagnosis;
            try:                          # its T need not be the decode batch: the models regroup its tokens
                routing.load_trace(spec.trace_path, model.experts, model.top_k)
            except ValueError as exc:
                raise ParameterError(f"routing: {exc}") from None
        return dataclasses.replace(
            self, decode_batch=decode_batch,
            backend=params.check_text("backend", self.backend, allow_empty=False),
            steps=steps,
            seed=params.check_int("seed", self.seed, 0),
            power_bound_fraction=params.check_float("power_bound_fraction", self.power_bound_fraction,
                                                    0, 1, strict_minimum=True),
            ep_degrees=params.check_int_list("ep_degrees", list(self.ep_degrees)))


@dataclass
class Diagnosis:
    config: DiagnosisConfig
    view: RunView
    gemm: gemm_analysis.GemmResults | None
    moe: moe_analysis.MoeResults | None
    power: power_analysis.RunPower | None
    load: dict[str, Any]
    paths: pd.DataFrame                          # every path at decode, fastest first, with floors
    chosen: dict[str, Any] | None                # the diagnosed path (a row of `paths`)
    chosen_reason: str
    verdict: dict[str, Any] | None
    decode_power: dict[str, Any] | None
    seed_backend: str | None
    seed: pd.DataFrame
    seed_loop: dict[str, Any] | None             # the seed backend's modelled (and measured) loop
    fp4: dict[str, Any] | None
    levers: pd.DataFrame
    concurrency: pd.DataFrame                    # batch, layer_us, us_per_token (see concurrency_basis)
    ep: pd.DataFrame                             # ep, layer_us, us_per_token (see ep_basis)
    graphs: pd.DataFrame
    gate: pd.DataFrame
    missing: list[str] = field(default_factory=list)
    chosen_anatomy: dict[str, Any] | None = None  # the diagnosed path dissected by build, if it was
    concurrency_basis: str = MODELLED
    ep_basis: str = MODELLED
    chosen_clock: dict[str, Any] | None = None   # the diagnosed path's timed SM clock, where it fell
    chosen_power: dict[str, Any] | None = None   # the diagnosed path's own energy window, if any
    call_times: pd.DataFrame = field(default_factory=pd.DataFrame)   # every timing of its call

    @property
    def smoke(self) -> bool:
        return self.view.is_smoke

    @property
    def bandwidth_tbps(self) -> float | None:
        return self.gemm.bandwidth_tbps if self.gemm else None


# -- the GEMM backends as loops ---------------------------------------------------------------------

def measured_shape(rows: pd.DataFrame, n: int, k: int) -> tuple[int, int, bool]:
    """(n, k) when `rows` measured it, else the measured shape closest in weight size."""
    shapes = rows[["n", "k"]].drop_duplicates()
    if ((shapes["n"] == n) & (shapes["k"] == k)).any():
        return n, k, True
    nearest = (np.log(shapes["n"].astype(float) * shapes["k"].astype(float)) - np.log(n * k)).abs().idxmin()
    return int(shapes.loc[nearest, "n"]), int(shapes.loc[nearest, "k"]), False


def gemm_time_at(ok: pd.DataFrame, backend: str, n: int, k: int, m: float) -> dict[str, Any] | None:
    """The measured GEMM time of `backend` at (n, k) and M = m, linear between measured Ms
    (nvfp4 rows when the backend measured both formats); nearest M outside the measured range."""
    rows = ok[ok["backend"] == backend]
    if (rows["fmt"] == "nvfp4").any():
        rows = rows[rows["fmt"] == "nvfp4"]
    if not len(rows):
        return None
    sn, sk, exact = measured_shape(rows, n, k)
    curve = rows[(rows["n"] == sn) & (rows["k"] == sk)].groupby("m")["median_us"].median().sort_index()
    formats = rows["fmt"].dropna().unique()
    return {"us": float(np.interp(m, curve.index.to_numpy(float), curve.to_numpy(float))),
            "n": sn, "k": sk, "exact": exact, "fmt": str(formats[0]) if len(formats) == 1 else None,
            "inside": bool(curve.index.min() <= m <= curve.index.max())}


def gemm_time_function(gemm: gemm_analysis.GemmResults, backend: str):
    """gemm_us(n, k, m) for the layout model of chapter 05: `backend`'s measured time at the
    nearest measured shape and M, scaled by weight size to (n, k) (a sharded expert GEMM is a
    weight read at decode sizes, so its time scales with its bytes)."""
    ok = gemm.ok

    def gemm_us(n: int, k: int, m: int) -> float:
        found = gemm_time_at(ok, backend, n, k, float(m))
        if found is None:
            raise ValueError(f"the run has no correct {backend} GEMM points to time ({n}, {k}) from")
        return found["us"] * (n * k) / (found["n"] * found["k"])
    return gemm_us


def loop_layer_us(ok: pd.DataFrame, backend: str, model: presets.ModelPreset, load: dict) -> dict | None:
    """One layer as a loop of `backend`'s GEMMs: active experts x (gate_up + down at mean m)."""
    times = {}
    for name, (n, k) in model.gemm_shapes().items():
        times[name] = gemm_time_at(ok, backend, n, k, max(load["mean_m"], 1.0))
        if times[name] is None:
            return None
    notes = [f"nearest measured shape {t['n']}x{t['k']} for {name}" for name, t in times.items() if not t["exact"]]
    return {"layer_us": load["active_experts"] * sum(t["us"] for t in times.values()),
            "shape_note": "; ".join(notes), "exact": all(t["exact"] for t in times.values()),
            "fmt": next(iter(times.values()))["fmt"]}


# -- every path at decode ---------------------------------------------------------------------------

def _floors(weight_dtype: str, math_dtype: str, weight_bytes: float, kernels: float, flops: float,
            gemm: gemm_analysis.GemmResults | None) -> dict[str, float]:
    basis = (gemm.measured or gemm.spec) if gemm else None
    bandwidth = gemm.bandwidth_tbps if gemm else None
    peak = (basis.peak_tflops.get(math_dtype) if basis else None) if math_dtype else None
    launch = gemm.launch_us if gemm else None
    return {"launch_floor_us": kernels * launch if launch else np.nan,
            "memory_floor_us": weight_bytes / (bandwidth * 1e6) if bandwidth else np.nan,
            "compute_floor_us": flops / (peak * 1e6) if peak else np.nan}


def expert_weight_bytes(model: presets.ModelPreset, dtype: str, fmt: str = "nvfp4") -> float:
    """Bytes of one expert's gate_up and down weights stored as `dtype`."""
    return float(sum(roofline.operand_bytes(n, k, dtype, fmt) for n, k in model.gemm_shapes().values()))


def layer_flops(model: presets.ModelPreset, batch: int) -> float:
    """Useful FLOPs of one layer's routed experts at decode batch B: 2 x B x k x values per expert."""
    return 2.0 * batch * model.top_k * sum(n * k for n, k in model.gemm_shapes().values())


def decode_paths(gemm: gemm_analysis.GemmResults | None, moe: moe_analysis.MoeResults | None,
                 model: presets.ModelPreset, load: dict, config: DiagnosisConfig) -> pd.DataFrame:
    """Every way this run measured to run the layer at decode, fastest first, with floors."""
    rows = []
    active, flops = load["active_experts"], layer_flops(model, load["batch"])
    measured_loops = set()
    if moe is not None:
        # loops of a GEMM backend that the MoE sweep timed itself
        measured_loops = set(moe.ok[moe.ok["batch"].notna()]["gemm_backend"].dropna())
        for r in moe_analysis.layer_times(moe, config.decode_batch, config.routing).itertuples(index=False):
            method_rows = moe.ok[(moe.ok["method"] == r.method)]
            math = method_rows["math_dtype"].iloc[0]
            kernels = 2 * active if "loop" in str(r.method).split("-") else 2     # layer-loop-bf16 too
            rows.append({"path": r.method, "source": "MoE sweep", "kind": r.kind, "fmt": r.fmt,
                         "weight_dtype": r.weight_dtype, "math_dtype": math, "batch": int(r.batch),
                         "layer_us": r.layer_us, "layer_p20_us": r.layer_p20_us,
                         "layer_p80_us": r.layer_p80_us, "weight_bytes": r.weight_bytes, "kernels": kernels,
                         "sm_clock_mhz": r.sm_clock_mhz, "sm_clock_start_mhz": r.sm_clock_start_mhz,
                         "sm_clock_end_mhz": r.sm_clock_end_mhz, "note": f"measured at B={int(r.batch)}",
                         **_floors(r.weight_dtype, math, r.weight_bytes, kernels, flops, gemm)})
    if gemm is not None and model.scaled is False:
        ok = gemm.ok
        for backend, group in ok.groupby("backend"):
            if backend in measured_loops:
                continue              # the MoE sweep measured this loop: measurement over model
            loop = loop_layer_us(ok, backend, model, load)
            if loop is None:
                continue
            weight, math = group["weight_dtype"].iloc[0], group["math_dtype"].iloc[0]
            weight_bytes = active * expert_weight_bytes(model, weight)
            rows.append({"path": f"{backend} loop", "source": "GEMM sweep", "kind": "gemm-loop",
                         "fmt": "nvfp4" if weight in ("fp4",) else None, "weight_dtype": weight,
                         "math_dtype": math, "batch": load["batch"], "layer_us": loop["layer_us"],
                         "weight_bytes": weight_bytes, "kernels": 2 * active, "backend": backend,
                         "note": "built from GEMM times at the mean expert load" +
                                 (f" ({loop['shape_note']})" if loop["shape_note"] else ""),
                         **_floors(weight, math, weight_bytes, 2 * active, flops, gemm)})
    frame = pd.DataFrame(rows)
    return frame.sort_values("layer_us").reset_index(drop=True) if len(frame) else frame


def fastest_gemm_backend(gemm: gemm_analysis.GemmResults | None, model: presets.ModelPreset,
                         load: dict) -> str | None:
    """The GEMM backend whose loop runs the layer fastest at decode, of those that ran every M
    of the run: the one whose seed table, power and concurrency the diagnosis reads."""
    if gemm is None or model.scaled or not len(gemm.ok):
        return None
    times = {backend: loop["layer_us"] for backend in every_m_backends(gemm.ok)
             if (loop := loop_layer_us(gemm.ok, backend, model, load)) is not None}
    return min(times, key=times.get) if times else None


def every_m_backends(ok: pd.DataFrame) -> list[str]:
    """The backends with a correct point at the run's largest M: the ones a layer model may time
    any expert load with (the models ask for busy experts' and expert parallelism's larger M; a
    decode-only kernel, cuda-w4a16 at M <= 64, would be read at its largest M instead, too fast)."""
    largest = ok.groupby("backend")["m"].max()
    return list(largest.index[largest == largest.max()])


def decode_layer(config: DiagnosisConfig) -> tuple[presets.ModelPreset, dict]:
    """The diagnosed layer's model and its expert load at the decode batch."""
    model = presets.get(config.preset)
    return model, moe_analysis.tokens_per_expert(model, config.decode_batch, config.routing, config.steps,
                                                 config.seed)


def seed_choice(gemm: gemm_analysis.GemmResults | None,
                config: DiagnosisConfig) -> tuple[str | None, dict[str, Any] | None]:
    """For the pages that show the seed table without the diagnosis (chapter 01): the GEMM backend
    whose seed table the book shows (the one the diagnosed layer's model times its experts with,
    `layer_backend`) and its modelled loop (`seed_loop`, without the MoE sweep's timing)."""
    model, load = decode_layer(config)
    backend = layer_backend(gemm, model, load)
    return backend, seed_loop(gemm, pd.DataFrame(), backend, model, load)


def seed_loop(gemm: gemm_analysis.GemmResults | None, paths: pd.DataFrame, backend: str | None,
              model: presets.ModelPreset, load: dict) -> dict[str, Any] | None:
    """What made `backend` the seed's: its modelled loop of expert GEMMs at decode ("modelled_us",
    from its GEMM times, the layer model's basis), and where the MoE sweep timed that loop itself
    ("measured_us", "measured_fmt": in the modelled format where it was timed in it, else its
    fastest; "shown_us", "shown_fmt": its fastest format, the time the paths table shows, so
    without it a reader finds a faster-looking loop there). None without a backend or a model."""
    if gemm is None or backend is None:
        return None
    loop = loop_layer_us(gemm.ok, backend, model, load) if not (model.scaled or gemm.view.is_smoke) else None
    if loop is None:
        return None
    measured = paths[(paths["source"] == "MoE sweep") & (paths["path"] == f"loop-{backend}")] \
        if len(paths) else paths
    fastest = measured.loc[measured["layer_us"].idxmin()] if len(measured) else None
    # the model against the measurement in one format: the formats' times differ by more than
    # the model's error
    same = measured[measured["fmt"] == loop["fmt"]] if len(measured) else measured
    like = same.loc[same["layer_us"].idxmin()] if len(same) else fastest
    return {"modelled_us": float(loop["layer_us"]), "modelled_fmt": loop["fmt"],
            "measured_us": float(like["layer_us"]) if like is not None else None,
            "measured_fmt": str(like["fmt"]) if like is not None else None,
            "shown_us": float(fastest["layer_us"]) if fastest is not None else None,
            "shown_fmt": str(fastest["fmt"]) if fastest is not None else None}


def layer_backend(gemm: gemm_analysis.GemmResults | None, model: presets.ModelPreset,
                  load: dict) -> str | None:
    """The GEMM backend a layer model of `model` times its experts with (chapter 04's seed,
    chapter 05's layouts: one choice, so both model a run's layer with the same GEMM): the one
    whose loop runs the layer fastest at decode; on a smoke run (a CPU run, or `model` a scaled
    stand-in), whose shapes say nothing about the model, the fastest at the smallest M."""
    if gemm is None or not len(gemm.ok):
        return None
    if not (model.scaled or gemm.view.is_smoke):
        return fastest_gemm_backend(gemm, model, load)
    ok = gemm.ok[gemm.ok["backend"].isin(every_m_backends(gemm.ok))]
    smallest = ok[ok["m"] == ok["m"].min()]
    return str(smallest.groupby("backend")["median_us"].median().idxmin())


def choose(paths: pd.DataFrame, wanted: str) -> tuple[dict | None, str]:
    """The path to diagnose and why: the named one, else the fastest."""
    if not len(paths):
        return None, "no path measured the layer at decode, so none is diagnosed"
    if wanted != "auto":
        named = paths[(paths["path"] == wanted) | (paths.get("backend") == wanted)]
        if not len(named):
            raise ParameterError(f"backend={wanted!r}: no measured path of that name at decode; measured: "
                                 f"{', '.join(paths['path'])}")
        return named.iloc[0].to_dict(), "the backend parameter names it"
    best = paths.iloc[0].to_dict()
    return best, "it runs the layer fastest of the paths this run measured"


def verdict(path: dict, power: dict | None, config: DiagnosisConfig) -> dict[str, Any]:
    """Power-bound when the GPU sits at its limit at the decode point, else the largest floor;
    `explained` is that floor's share of the measured layer time; `kernel_limited`: the memory
    floor is the largest but under KERNEL_GAP of the layer, so the rest is the kernel's own time."""
    if power and power["fraction"] >= config.power_bound_fraction:
        return {"verdict": "power-bound", "floor": None, "floor_us": np.nan, "explained": np.nan,
                "kernel_limited": False}
    floors = {name: path[f"{name}_floor_us"] for name in ("launch", "memory", "compute")
              if np.isfinite(path.get(f"{name}_floor_us", np.nan))}
    if not floors:
        return {"verdict": "unclassified", "floor": None, "floor_us": np.nan, "explained": np.nan,
                "kernel_limited": False}
    name = max(floors, key=floors.get)
    explained = floors[name] / path["layer_us"]
    return {"verdict": f"{name}-bound", "floor": name, "floor_us": floors[name],
            "explained": explained, "reliable": explained <= 1 + SAME_SPEED_WITHIN,
            "kernel_limited": name == "memory" and explained < KERNEL_GAP}


# -- power at the decode point ----------------------------------------------------------------------

def decode_m_values(measured, mean_m: float, busiest_m: float) -> list[int]:
    """The measured Ms a decode step runs at: those in [mean, busiest], else the one nearest the mean."""
    measured = np.sort(np.asarray(measured, dtype=float))
    inside = measured[(measured >= mean_m) & (measured <= busiest_m)]
    return [int(m) for m in inside] if len(inside) else [int(measured[np.abs(measured - mean_m).argmin()])]


def decode_power(power: power_analysis.RunPower | None, backend: str | None, model: presets.ModelPreset,
                 load: dict) -> dict[str, Any] | None:
    """The backend's energy-window power at the expert shapes and the decode Ms, against the limit."""
    if power is None or backend is None or not power.power_limit_w or not len(power.points):
        return None
    points = power.points[power.points["backend"] == backend]
    if not len(points):
        return None
    picked, m_values = [], set()
    for n, k in model.gemm_shapes().values():
        sn, sk, _ = measured_shape(points, n, k)
        shape = points[(points["n"] == sn) & (points["k"] == sk)]
        at = decode_m_values(shape["m"].unique(), load["mean_m"], load["busiest_m"])
        picked.append(shape[shape["m"].isin(at)])
        m_values.update(at)
    chosen = pd.concat(picked)
    watts = float(chosen["avg_power_w"].median())
    return {"backend": backend, "avg_power_w": watts, "power_limit_w": float(power.power_limit_w),
            "fraction": watts / float(power.power_limit_w), "m_values": sorted(m_values),
            "points": len(chosen)}


def fallen_clock(chosen: dict | None, run_view: RunView) -> dict[str, Any] | None:
    """The SM clock the diagnosed path's own timing read (the lowest of its rows), against the
    GPU's maximum, where it was under the share of it the MoE sweep's timer calls steady (its
    `min_clock_ratio`, as run.json records it): the clock fell while that path ran. None where it
    held, or where the run records no clock of the path, no maximum or no such share."""
    top = run_view.max_sm_clock_mhz
    steady = (((run_view.info.get("moe") or {}).get("config") or {}).get("timer") or {}).get("min_clock_ratio")
    clock = chosen.get("sm_clock_mhz") if chosen else None
    if not top or not steady or clock is None or not np.isfinite(clock) or clock >= steady * top:
        return None
    return {"path": chosen["path"], "fmt": chosen.get("fmt"), "sm_clock_mhz": float(clock),
            "max_sm_clock_mhz": float(top), "fraction": float(clock) / float(top)}


def path_anatomy(anatomy: pd.DataFrame, chosen: dict | None) -> dict[str, Any] | None:
    """The diagnosed path's own builds (loads only, decoded, whole, its math alone where timed: a
    row of `anatomy`, `moe_analysis.fused_anatomy`) at its measured batch and format, with
    `math_elsewhere` (`moe_analysis.math_in_other_format`) where only the other format timed its
    math; None where the run did not dissect that call."""
    if chosen is None or chosen.get("source") != "MoE sweep" or not len(anatomy):
        return None
    rows = anatomy[(anatomy["method"] == chosen["path"]) & (anatomy["fmt"] == chosen.get("fmt"))
                   & (anatomy["batch"] == chosen["batch"])]
    if not len(rows):
        return None
    return {**rows.iloc[0].to_dict(), "math_elsewhere": moe_analysis.math_in_other_format(anatomy, rows.iloc[0])}


def math_alone(anatomy: dict[str, Any] | None) -> dict[str, Any] | None:
    """The diagnosed call's math without the weights' read (its compute build, else the same
    call's in the other format: `fmt` says which, None for its own): the time, the loads alone of
    the same format and the ratio, and whether the math is as long as them (`math_bound`: overlap
    alone cannot reach the loads). None where neither format timed it."""
    if anatomy is None:
        return None
    if not pd.isna(anatomy.get("compute")):
        return {"compute_us": float(anatomy["compute"]), "load_us": float(anatomy["load"]),
                "math_to_load": float(anatomy["math_to_load"]), "math_bound": bool(anatomy["math_bound"]),
                "fmt": None}
    other = anatomy.get("math_elsewhere")
    if other is None:
        return None
    return {"compute_us": other["compute"], "load_us": other["load"], "math_to_load": other["math_to_load"],
            "math_bound": other["math_bound"], "fmt": other["fmt"]}


CALL_TIME_COLUMNS = ["timing", "fmt", "us", "how"]


def call_times(paths: pd.DataFrame, anatomy: pd.DataFrame, chosen: dict | None,
               power: dict[str, Any] | None) -> pd.DataFrame:
    """Every time the run measured for the diagnosed path's call at its batch, fastest first, so a
    reader sees side by side the numbers the pages state apart: the MoE sweep's layer table (the
    timer's burst; each format it timed, the verdict's marked), the same call in the worker that
    dissected it (`anatomy`, `moe_analysis.fused_anatomy`: its whole build), and a call replayed
    back to back in its energy window (`path_power`). Empty without a measured path."""
    if chosen is None or chosen.get("source") != "MoE sweep":
        return pd.DataFrame(columns=CALL_TIME_COLUMNS)
    rows = []
    own = paths[(paths["source"] == "MoE sweep") & (paths["path"] == chosen["path"])]
    for r in own.itertuples(index=False):
        diagnosed = r.fmt == chosen.get("fmt")
        how = "the MoE sweep's timer: a burst of graph replays, L2 kept cold by rotated copies, in the sweep's worker"
        rows.append({"timing": "layer table" + (" (the verdict's)" if diagnosed else ""), "fmt": r.fmt,
                     "us": r.layer_us, "how": how + burst_words(r.sm_clock_mhz, r.layer_p20_us, r.layer_p80_us,
                                                                 r.sm_clock_start_mhz, r.sm_clock_end_mhz)})
    for r in anatomy[(anatomy["method"] == chosen["path"]) & (anatomy["batch"] == chosen["batch"])
                     ].itertuples(index=False):
        how = "the same timer in the worker that times its anatomy builds (another process, another burst)"
        rows.append({"timing": "dissecting worker", "fmt": r.fmt, "us": r.full,
                     "how": how + burst_words(r.full_sm_clock_mhz, r.full_p20_us, r.full_p80_us,
                                              r.full_sm_clock_start_mhz, r.full_sm_clock_end_mhz)})
    if power is not None:
        rows.append({"timing": "back to back", "fmt": power["fmt"], "us": power["window_us_per_call"],
                     "how": f"replayed back to back{window_length(power)} (its energy window): "
                            f"{power['avg_power_w']:.0f} W on average against the "
                            f"{power['power_limit_w']:.0f} W limit, the SM clock down to "
                            f"{power['window_sm_clock_mhz']:.0f} MHz"})
    frame = pd.DataFrame(rows, columns=CALL_TIME_COLUMNS)
    return frame.sort_values("us", kind="stable").reset_index(drop=True)


def burst_words(clock_mhz, p20_us, p80_us, start_mhz=None, end_mhz=None) -> str:
    """'; its SM clock fell from 1980 to 1605 MHz during its burst; its samples' 20th-80th
    percentiles 1.70-1.95 ms': a burst already under the power cap is slower, and one that
    straddles the cap's onset splits its samples. Rows from before the timer kept both readings
    hold only their mean, and say so (each part left out where the row has no value)."""
    words = ""
    if pd.notna(start_mhz) and pd.notna(end_mhz):
        start, end = float(start_mhz), float(end_mhz)
        if end < moe_analysis.SLOW_CLOCK_SHARE * start:
            words += f"; its SM clock fell from {start:.0f} to {end:.0f} MHz during its burst"
        elif start == end:
            words += f"; its SM clock read {end:.0f} MHz before and after its burst"
        else:
            words += f"; its SM clock read {start:.0f} MHz before its burst and {end:.0f} after"
    elif pd.notna(clock_mhz):
        words += f"; the SM clock read before and after its burst averaged {float(clock_mhz):.0f} MHz"
    if pd.notna(p20_us) and pd.notna(p80_us):
        words += f"; its samples' {text.percentile_spread(float(p20_us), float(p80_us))}"
    return words


POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")   # clock events that are the power limit


def window_length(power: dict) -> str:
    """' for 0.6 s': how long the path's energy window replayed it, where the run stored it."""
    return f" for {power['window_s']:.2g} s" if power.get("window_s") else ""


def path_power(moe: moe_analysis.MoeResults | None, chosen: dict | None, run_view: RunView,
               config: DiagnosisConfig) -> dict[str, Any] | None:
    """The diagnosed path's own energy window at its measured batch (EP 1, the MoE sweep's
    `energy_batches`): the most power any of its rows drew against the board's limit, the lowest
    SM clock inside the windows, their clock-event reasons (the benign "none" left out where
    another was read), and the time a call took there (energy per call over power, summed over
    the path's rows) against the timer's: `window_over_timed`, the share longer;
    `clock_stretch`, the most the SM clock's fall from the timer's to the window's could lengthen
    a call (one bound by its SM clock alone: loads do not slow with it). `capped`:
    at the power-bound share of the limit, or a power clock event. Where only the path's other
    format has a window (a re-measure of one format), that one, `other_format` True and `fmt`
    saying which. None where the run has none."""
    limit = run_view.power_limit_w
    if moe is None or chosen is None or chosen.get("source") != "MoE sweep" or not limit:
        return None
    ok = moe.ok
    windows = ok[(ok["method"] == chosen["path"]) & (ok["batch"] == chosen["batch"]) & (ok["ep"].fillna(1) == 1)
                 & (ok["routing"] == config.routing) & ok["avg_power_w"].notna() & ok["energy_per_call_j"].notna()]
    if not len(windows):
        return None
    fmts, own_fmt = windows["fmt"].fillna(""), chosen.get("fmt") or ""
    rows = windows[fmts == (own_fmt if (fmts == own_fmt).any() else fmts.iloc[0])]
    fmt = rows["fmt"].iloc[0] if isinstance(rows["fmt"].iloc[0], str) else None
    other_format = (fmt or "") != own_fmt
    watts = float(rows["avg_power_w"].max())
    seen = power_analysis.reason_counts(rows["throttle_reasons"])
    # "none" in some samples says nothing once another reason was read in the rest
    reasons = sorted(seen) if set(seen) <= power_analysis.BENIGN_REASONS else sorted(
        set(seen) - power_analysis.BENIGN_REASONS)
    fraction = watts / float(limit)
    window_us = float((rows["energy_per_call_j"] / rows["avg_power_w"]).sum() * 1e6)
    timed_us = float(rows["median_us"].sum()) if other_format else float(chosen["layer_us"])
    # how long the replays ran: the shortest of the rows' windows (NaN where an older run stored none)
    spans = rows["window_end_s"] - rows["window_start_s"]
    window_s = float(spans.min()) if spans.notna().any() else None
    window_clock, timed_clock = float(rows["window_sm_clock_mhz"].min()), float(rows["sm_clock_mhz"].median())
    return {"path": chosen["path"], "fmt": fmt, "other_format": other_format, "avg_power_w": watts,
            "window_s": window_s,
            "power_limit_w": float(limit), "fraction": fraction,
            "window_sm_clock_mhz": window_clock, "timed_sm_clock_mhz": timed_clock,
            "clock_stretch": timed_clock / window_clock - 1 if timed_clock > 0 and window_clock > 0 else None,
            "throttle_reasons": reasons, "window_us_per_call": window_us, "timed_us": timed_us,
            "window_over_timed": window_us / timed_us - 1,
            "capped": fraction >= config.power_bound_fraction or any(r in POWER_REASONS for r in reasons)}


# -- levers -----------------------------------------------------------------------------------------

def fp4_lever(paths: pd.DataFrame, model: presets.ModelPreset, load: dict,
              bandwidth: float | None) -> dict[str, Any] | None:
    """The fastest measured FP4-weight path against its read floor and the best bf16 and fp8 paths.
    The floor is that path's own memory floor (its format's bytes: the number the verdict reads
    when it is the diagnosed path); with no FP4 path, the NVFP4 weights' floor."""
    if not len(paths):
        return None
    fp4 = paths[paths["weight_dtype"] == "fp4"]
    best_fp4 = fp4.iloc[0].to_dict() if len(fp4) else None
    fmt = str(best_fp4["fmt"]) if best_fp4 is not None and isinstance(best_fp4.get("fmt"), str) else "nvfp4"
    if best_fp4 is not None and np.isfinite(best_fp4.get("memory_floor_us", np.nan)):
        floor = float(best_fp4["memory_floor_us"])
    else:
        floor = (load["active_experts"] * expert_weight_bytes(model, "fp4", fmt) / (bandwidth * 1e6)
                 if bandwidth else np.nan)
    best = {dtype: paths[paths["weight_dtype"] == dtype].iloc[0].to_dict()
            for dtype in ("bf16", "fp8") if (paths["weight_dtype"] == dtype).any()}
    return {"floor_us": floor, "fmt": fmt, "best": best_fp4,
            "bf16": best.get("bf16"), "fp8": best.get("fp8")}


def sweep_layer_times(moe: moe_analysis.MoeResults | None, chosen: dict | None,
                      routing_spec: str) -> pd.DataFrame | None:
    """Every method's layer time at every batch the MoE sweep measured (one GPU, EP 1), which the
    batch levers read; None where the diagnosed path did not come from the MoE sweep."""
    if moe is None or chosen is None or chosen.get("source") != "MoE sweep":
        return None
    return moe_analysis.layer_times_by_batch(moe, routing_spec)


def measured_batches(table: pd.DataFrame | None, chosen: dict | None) -> pd.DataFrame:
    """The diagnosed path's own layer time at every decode batch the MoE sweep measured (`table`:
    `sweep_layer_times`): the concurrency lever as measured, when the path came from the sweep."""
    if table is None:
        return pd.DataFrame()
    fmt = chosen.get("fmt") if isinstance(chosen.get("fmt"), str) else None
    mine = table[(table["method"] == chosen["path"]) & (table["fmt"].fillna("").eq(fmt or ""))]
    rows = mine.sort_values("batch")[["batch", "layer_us"]].reset_index(drop=True)
    return rows.assign(us_per_token=rows["layer_us"] / rows["batch"])


def measured_ep(moe: moe_analysis.MoeResults | None, chosen: dict | None, config: DiagnosisConfig,
                comm: "comm_analysis.CommTable | None" = None) -> pd.DataFrame:
    """Expert parallelism as measured on the diagnosed path itself (`moe.expert_parallel_times`:
    its busiest rank at P x B tokens a step, P GPUs each bringing the decode batch B, against
    itself alone at B), as `what_if_ep`'s columns from EP 1 up. Empty when the path did not come
    from the MoE sweep or the sweep did not time it at EP 1 and above."""
    if moe is None or chosen is None or chosen.get("source") != "MoE sweep":
        return pd.DataFrame()
    fmt = chosen.get("fmt") if isinstance(chosen.get("fmt"), str) else ""
    spread = moe_analysis.expert_parallel_times(moe, config.decode_batch, config.routing)
    mine = spread[(spread["method"] == chosen["path"]) & spread["fmt"].fillna("").eq(fmt)
                  & spread["alone_layer_us"].notna()]
    if not len(mine):
        return pd.DataFrame()
    degrees = [(1, float(mine["alone_layer_us"].iloc[0]))] + list(zip(mine["ep"], mine["layer_us"]))
    rows = []
    for ep, layer_us in degrees:
        comm_us = _all_to_all_us(comm, int(ep), config.decode_batch, moe.model, config.routing)
        rows.append({"ep": int(ep), "tokens_per_step": int(ep) * config.decode_batch, "layer_us": layer_us,
                     "us_per_token": layer_us / config.decode_batch, "comm_us": comm_us,
                     "us_per_token_with_comm": (layer_us + comm_us) / config.decode_batch})
    return pd.DataFrame(rows)


def fastest_ep(moe: moe_analysis.MoeResults | None, chosen: dict | None, config: DiagnosisConfig,
               comm: "comm_analysis.CommTable | None" = None) -> dict[str, Any] | None:
    """The fastest method on a busiest EP rank (`moe.fastest_spread`, chapter 03's number) where
    it is not the diagnosed path itself: at P x the tokens an expert another kernel can win, so
    the path's own EP lever understates what expert parallelism gives. Its time per token against
    the fastest method alone at the decode batch, the measured all-to-all added where the run has
    it. None where the path is also the fastest spread, or nothing was spread."""
    if moe is None or chosen is None or chosen.get("source") != "MoE sweep":
        return None
    found = moe_analysis.fastest_spread(moe, config.decode_batch, config.routing)
    if found is None:
        return None
    best, alone = found["spread"], found["alone"]
    fmt = best["fmt"] if isinstance(best.get("fmt"), str) else None
    if best["method"] == chosen["path"] and fmt == chosen.get("fmt"):
        return None
    ep = int(best["ep"])
    comm_us = _all_to_all_us(comm, ep, config.decode_batch, moe.model, config.routing)
    with_comm = bool(np.isfinite(comm_us))
    return {"method": best["method"], "fmt": fmt, "ep": ep, "alone_method": alone["method"],
            "now_us": float(alone["us_per_token"]),
            "with_us": float(best["us_per_token"]) + (comm_us / config.decode_batch if with_comm else 0.0),
            "with_comm": with_comm}


def fastest_batch(table: pd.DataFrame | None, chosen: dict | None,
                  model: presets.ModelPreset) -> dict[str, Any] | None:
    """The lowest time per token over every method and batch the MoE sweep measured (one GPU,
    EP 1) where it is another method than the diagnosed path: at a larger batch another kernel
    can win (on Hopper grouped fp8, whose fp8 MMAs run at twice the bf16 rate, once the FP4
    weight-only kernels' bf16 MMAs outweigh their read), so the path's own batch lever understates
    what concurrency gives. Against the path's time per token at its batch; None where the path
    is itself the fastest per token, or nothing was measured. `bytes_over_fp4`: its weights'
    bytes over the path's FP4 ones (the memory a switch to fp8 weights costs). `table`:
    `sweep_layer_times`."""
    if table is None or not len(table):
        return None
    table = table.assign(us_per_token=table["layer_us"] / table["batch"])
    best = table.loc[table["us_per_token"].idxmin()]
    fmt = best["fmt"] if isinstance(best.get("fmt"), str) else None
    if best["method"] == chosen["path"] and fmt == chosen.get("fmt"):
        return None
    fp4_fmt = chosen.get("fmt") if isinstance(chosen.get("fmt"), str) else "nvfp4"
    return {"method": best["method"], "fmt": fmt, "weight_dtype": best["weight_dtype"],
            "batch": int(best["batch"]), "now_us": float(chosen["layer_us"]) / float(chosen["batch"]),
            "with_us": float(best["us_per_token"]), "path_batch": int(chosen["batch"]),
            # the memory its weights take against FP4's: a lever that needs more of it says so
            "bytes_over_fp4": expert_weight_bytes(model, best["weight_dtype"], fmt or fp4_fmt)
            / expert_weight_bytes(model, "fp4", fp4_fmt)}


def what_if_concurrency(gemm, backend: str | None, model, config: DiagnosisConfig,
                        factors=(0.25, 0.5, 1, 2, 4)) -> pd.DataFrame:
    """Layer time and time per token as the decode batch changes (GEMM times, routing model)."""
    if gemm is None or backend is None:
        return pd.DataFrame()
    rows = []
    for factor in factors:
        batch = max(1, int(round(config.decode_batch * factor)))
        load = moe_analysis.tokens_per_expert(model, batch, config.routing, config.steps, config.seed)
        loop = loop_layer_us(gemm.ok, backend, model, load)
        if loop:
            rows.append({"batch": batch, "mean_m": load["mean_m"], "busiest_m": load["busiest_m"],
                         "active_experts": load["active_experts"], "layer_us": loop["layer_us"],
                         "us_per_token": loop["layer_us"] / batch})
    return pd.DataFrame(rows)


def what_if_ep(gemm, backend: str | None, model, config: DiagnosisConfig,
               comm: "comm_analysis.CommTable | None" = None) -> pd.DataFrame:
    """Expert parallelism as the seed meant it: P GPUs each bring B tokens, the router sends them
    to the rank holding their experts, so each rank's E/P experts see P x the tokens. The busiest
    rank's layer time per degree P (GEMM times, routing model) and the GPU time per token, against
    one GPU serving B alone. `comm_us` is the dispatch and combine all-to-all of B tokens per rank
    measured at P ranks (bf16, the routing's splits) where the run's comm table has them, NaN
    where it does not; `us_per_token_with_comm` adds it."""
    if gemm is None or backend is None:
        return pd.DataFrame()
    rows = []
    for ep in config.ep_degrees:
        if model.experts % ep:
            continue
        load = moe_analysis.tokens_per_expert(model, ep * config.decode_batch, config.routing,
                                              config.steps, config.seed, ep)
        loop = loop_layer_us(gemm.ok, backend, model, load)
        if loop:
            comm_us = _all_to_all_us(comm, ep, config.decode_batch, model, config.routing)
            rows.append({"ep": ep, "tokens_per_step": ep * config.decode_batch,
                         "active_experts": load["active_experts"], "mean_m": load["mean_m"],
                         "layer_us": loop["layer_us"], "us_per_token": loop["layer_us"] / config.decode_batch,
                         "comm_us": comm_us,
                         "us_per_token_with_comm": (loop["layer_us"] + comm_us) / config.decode_batch})
    return pd.DataFrame(rows)


def _all_to_all_us(comm, ranks: int, tokens: int, model, routing_spec: str) -> float:
    """Measured dispatch + combine of `tokens` per rank at `ranks` ranks; NaN when not measured."""
    if comm is None:
        return 0.0 if ranks == 1 else float("nan")
    total = 0.0
    for op in (comm_ops.DISPATCH, comm_ops.COMBINE):
        size = comm_analysis.message_size(op, tokens, model.hidden, "bf16", model.top_k)
        time_us = comm.time_us(op, ranks, size, "bf16", routing_spec)
        if time_us is None:
            return float("nan")
        total += time_us
    return total


def what_if_graphs(gemm) -> pd.DataFrame:
    """Points measured both with and without CUDA-graph replay: the speed-up graphs give."""
    if gemm is None or not len(gemm.ok):
        return pd.DataFrame()
    ok = gemm.ok.dropna(subset=["graph"])
    both = ok.pivot_table(index=["backend", "fmt", "m", "n", "k"], columns="graph", values="median_us",
                          aggfunc="median")
    if True not in both.columns or False not in both.columns:
        return pd.DataFrame()
    both = both.dropna().rename(columns={True: "graph_us", False: "eager_us"}).reset_index()
    both["speedup"] = both["eager_us"] / both["graph_us"]
    return both


def _call_words(layer_us: float) -> str:
    """A per-token lever at a larger batch also lengthens each call, the step's latency: its words."""
    return f"a call takes {text.us(layer_us)}"


def _break_even_words(now_us: float, with_us: float, batch: int) -> str:
    """An EP lever measured without its all-to-alls: the communication a layer it can afford, the
    time per token it saves times the B tokens each GPU brings (the glance shows the product's
    factors, so the budget is not a number from nowhere)."""
    saved = now_us - with_us
    return f"all-to-alls not measured: worth it under {text.us(saved * batch)} = {text.us(saved)} x {batch}"


def levers(d_paths: pd.DataFrame, chosen: dict | None, fp4: dict | None, concurrency: pd.DataFrame,
           ep: pd.DataFrame, graphs: pd.DataFrame, batch: int, *, concurrency_basis: str = MODELLED,
           ep_basis: str = MODELLED, backend: str | None = None,
           ep_fastest: dict | None = None, batch_fastest: dict | None = None,
           math: dict | None = None) -> pd.DataFrame:
    """Each measured way to a faster layer, with its gain (time now / time with it), largest first;
    `from_path` says whether "now" is the diagnosed path itself (a lever on it) or another baseline
    (the fastest bf16 path, a modelled loop); `kind` is how its numbers were got in one word
    (measured, modelled or bound; `basis` says it in full); `per` whether its times are a call's
    or a token's (the levers over batch and EP are per token: a call of theirs holds more tokens)."""
    rows = []
    if chosen is not None and len(d_paths):
        # against the fastest bf16 path, the baseline fp4_lever states too: one number for
        # "what the path gains over bf16" in every chapter
        bf16 = fp4.get("bf16") if fp4 else None
        if bf16 is not None and chosen["weight_dtype"] != "bf16":
            rows.append({"lever": f"{chosen['path']} instead of the fastest bf16 path ({bf16['path']})",
                         "gain": bf16["layer_us"] / chosen["layer_us"],
                         "basis": f"measured ({bf16['source']})", "now_us": bf16["layer_us"],
                         "with_us": chosen["layer_us"], "from_path": False, "kind": "measured"})
        if fp4 and fp4.get("best") and fp4["best"]["path"] != chosen["path"]:
            rows.append({"lever": f"FP4 weights through {fp4['best']['path']}",
                         "gain": chosen["layer_us"] / fp4["best"]["layer_us"],
                         "basis": f"measured ({fp4['best']['source']})", "now_us": chosen["layer_us"],
                         "with_us": fp4["best"]["layer_us"], "from_path": True, "kind": "measured"})
    floor = chosen.get("memory_floor_us", np.nan) if chosen is not None else np.nan
    if np.isfinite(floor) and 0 < floor < chosen["layer_us"]:
        # a call whose math alone is as long as its loads cannot reach the floor by overlap: the
        # lever says what it needs (math: `math_alone`, the call's own builds)
        needs, why = "", ""
        if math is not None and math["math_bound"]:
            needs = " (needs fewer instructions per weight)"
            why = (f"; its math alone (no weight read{', ' + math['fmt'].upper() if math['fmt'] else ''}) takes "
                   f"{text.ratio_to_one(math['math_to_load'])} as long as its loads alone (chapter 03's dissection)")
        rows.append({"lever": f"{chosen['path']} at its weight-read floor{needs}",
                     "gain": chosen["layer_us"] / floor, "basis": BOUND + why, "now_us": chosen["layer_us"],
                     "with_us": floor, "from_path": True, "kind": "bound"})
    if len(concurrency) > 1:
        now = concurrency.iloc[(concurrency["batch"] - batch).abs().argmin()]
        best = concurrency.iloc[concurrency["us_per_token"].argmin()]
        if best["batch"] != now["batch"]:
            whose = chosen["path"] if concurrency_basis == MEASURED_BATCHES and chosen else f"a loop of {backend} GEMMs"
            rows.append({"lever": f"batch {int(best['batch'])} instead of {int(now['batch'])} ({whose}; "
                                  f"{_call_words(best['layer_us'])})",
                         "gain": now["us_per_token"] / best["us_per_token"],
                         "basis": concurrency_basis, "now_us": now["us_per_token"],
                         "with_us": best["us_per_token"], "from_path": concurrency_basis == MEASURED_BATCHES,
                         "kind": "measured" if concurrency_basis == MEASURED_BATCHES else "modelled",
                         "per": "token"})
    if len(ep) > 1:
        first, last = ep.iloc[0], ep.iloc[-1]
        with_comm = bool(ep["comm_us"].notna().all())
        column = "us_per_token_with_comm" if with_comm else "us_per_token"
        degree = int(last["ep"])
        on_path = ep_basis == MEASURED_BATCHES and chosen is not None
        whose = chosen["path"] if on_path else f"a {backend} GEMM loop"
        how = ("measured (MoE sweep: the busiest rank's layer)" if on_path else MODELLED)
        rows.append({"lever": f"expert parallelism EP={degree} ({whose}"
                              + (", all-to-all included)" if with_comm else
                                 "; " + _break_even_words(first[column], last[column], batch) + ")"),
                     "gain": first[column] / last[column],
                     "basis": (how + (" and all-to-alls" if with_comm else "")
                               + f": {degree} GPUs each bring B={batch} tokens, so each rank's experts see "
                               f"{degree}x the tokens; "
                               + ("measured all-to-all included" if with_comm else "communication not included")),
                     "now_us": first[column], "with_us": last[column], "from_path": on_path,
                     "kind": "measured" if on_path else "modelled", "per": "token"})
    if ep_fastest is not None:
        through = ep_fastest["method"] + (f" ({ep_fastest['fmt']})" if ep_fastest["fmt"] else "")
        degree = ep_fastest["ep"]
        comm_words = ("all-to-all included" if ep_fastest["with_comm"] else
                      _break_even_words(ep_fastest["now_us"], ep_fastest["with_us"], batch))
        rows.append({"lever": f"expert parallelism EP={degree} through {through} ({comm_words})",
                     "gain": ep_fastest["now_us"] / ep_fastest["with_us"],
                     "basis": (f"measured (MoE sweep: the fastest method on the busiest rank, against "
                               f"{ep_fastest['alone_method']} alone on one GPU): {degree} GPUs each bring "
                               f"B={batch} tokens; "
                               + ("measured all-to-all included" if ep_fastest["with_comm"]
                                  else "communication not included")),
                     "now_us": ep_fastest["now_us"], "with_us": ep_fastest["with_us"],
                     "from_path": chosen is not None and ep_fastest["alone_method"] == chosen["path"],
                     "kind": "measured", "per": "token"})
    if batch_fastest is not None:
        through = batch_fastest["method"] + (f" ({batch_fastest['fmt']})" if batch_fastest["fmt"] else "")
        held = (f"; its {batch_fastest['weight_dtype']} weights take {batch_fastest['bytes_over_fp4']:.1f}x "
                "the FP4 weights' memory" if batch_fastest["bytes_over_fp4"] > 1 + SAME_SPEED_WITHIN else "")
        cost = (f"; {batch_fastest['bytes_over_fp4']:.1f}x the weight memory" if held else "")
        call = _call_words(batch_fastest["with_us"] * batch_fastest["batch"])
        rows.append({"lever": f"batch {batch_fastest['batch']} through {through} ({call}{cost})",
                     "gain": batch_fastest["now_us"] / batch_fastest["with_us"],
                     "basis": (f"measured (MoE sweep: the lowest time per token of every method and batch, against "
                               f"{chosen['path']} at B={batch_fastest['path_batch']}){held}"),
                     "now_us": batch_fastest["now_us"], "with_us": batch_fastest["with_us"],
                     "from_path": True, "kind": "measured", "per": "token"})
    if len(graphs):
        rows.append({"lever": "CUDA-graph replay instead of eager launches",
                     "gain": float(graphs["speedup"].median()), "basis": "measured (GEMM sweep, median)",
                     "now_us": float(graphs["eager_us"].median()), "with_us": float(graphs["graph_us"].median()),
                     "from_path": False, "kind": "measured"})
    # `per`: what now_us and with_us time, a "call" of the layer (or the GEMM) or a "token" of it
    rows = [{"per": "call", **row} for row in rows]
    frame = pd.DataFrame(rows, columns=["lever", "gain", "basis", "now_us", "with_us", "per", "from_path", "kind"])
    return frame.sort_values("gain", ascending=False).reset_index(drop=True)


# -- the whole diagnosis ----------------------------------------------------------------------------

def gate_failures(gemm: gemm_analysis.GemmResults | None) -> pd.DataFrame:
    columns = ["backend", "fmt", "points_failed", "points_total", "worst_rel_err", "example_error"]
    if gemm is None or not len(gemm.frame):
        return pd.DataFrame(columns=columns)
    frame = gemm.frame
    rows = []
    for (backend, fmt), group in frame[frame["status"] == "wrong_result"].groupby(["backend", "fmt"]):
        errors = group["error"].dropna()
        rows.append({"backend": backend, "fmt": fmt, "points_failed": len(group),
                     "points_total": int(((frame["backend"] == backend) & (frame["fmt"] == fmt)).sum()),
                     "worst_rel_err": float(group["rel_err"].max()),
                     "example_error": errors.iloc[0] if len(errors) else None})
    return pd.DataFrame(rows, columns=columns)


def diagnose(run_dir: str | RunDir, config: DiagnosisConfig) -> Diagnosis:
    """Everything the diagnosis states, for one run folder."""
    run_view = view(run_dir)
    run = run_view.run
    missing = [source for table, source in TABLE_SOURCES.items() if not run.has_table(table)]
    gemm = gemm_analysis.gemm_results(run) if run.has_table("gemm") else None
    moe = moe_analysis.moe_results(run, config.preset) if run.has_table("moe") else None
    power = power_analysis.run_power(run) if run.has_table("gemm") or run.has_table("telemetry") else None
    model, load = decode_layer(config)
    paths = decode_paths(gemm, moe if moe is not None and not moe.model.scaled else None, model, load, config)
    seed_backend_name = layer_backend(gemm, model, load)
    chosen, reason = choose(paths, config.backend)
    power_now = decode_power(power, seed_backend_name, model, load)
    by_batch = sweep_layer_times(moe, chosen, config.routing)
    concurrency, basis = measured_batches(by_batch, chosen), MEASURED_BATCHES
    if len(concurrency) < 2:
        concurrency, basis = what_if_concurrency(gemm, seed_backend_name, model, config), MODELLED
    comm = comm_analysis.CommTable(run.read_table("comm")) if run.has_table("comm") else None
    ep, ep_basis = measured_ep(moe, chosen, config, comm), MEASURED_BATCHES
    if len(ep) < 2:
        ep, ep_basis = what_if_ep(gemm, seed_backend_name, model, config, comm), MODELLED
    graphs = what_if_graphs(gemm)
    fp4 = fp4_lever(paths, model, load, gemm.bandwidth_tbps if gemm else None)
    dissected = moe_analysis.fused_anatomy(moe) if moe is not None else pd.DataFrame(
        columns=moe_analysis.FUSED_ANATOMY_COLUMNS)
    anatomy = path_anatomy(dissected, chosen)
    own_power = path_power(moe, chosen, run_view, config) if not run_view.is_smoke else None
    return Diagnosis(
        config=config, view=run_view, gemm=gemm, moe=moe, power=power, load=load, paths=paths,
        chosen=chosen, chosen_reason=reason,
        verdict=verdict(chosen, power_now, config) if chosen and not run_view.is_smoke else None,
        decode_power=power_now, seed_backend=seed_backend_name,
        seed=gemm_analysis.seed_table(gemm, seed_backend_name) if seed_backend_name else pd.DataFrame(),
        seed_loop=seed_loop(gemm, paths, seed_backend_name, model, load),
        fp4=fp4, levers=levers(paths, chosen, fp4, concurrency, ep, graphs, config.decode_batch,
                               concurrency_basis=basis, ep_basis=ep_basis, backend=seed_backend_name,
                               ep_fastest=fastest_ep(moe, chosen, config, comm),
                               batch_fastest=fastest_batch(by_batch, chosen, moe.model if moe else model),
                               math=math_alone(anatomy)),
        concurrency=concurrency, ep=ep, graphs=graphs, gate=gate_failures(gemm), missing=missing,
        chosen_anatomy=anatomy,
        concurrency_basis=basis, ep_basis=ep_basis,
        chosen_clock=fallen_clock(chosen, run_view) if not run_view.is_smoke else None,
        chosen_power=own_power, call_times=call_times(paths, dissected, chosen, own_power))
