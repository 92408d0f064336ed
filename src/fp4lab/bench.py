"""The one timer fp4lab uses: tests, notebooks, the sweep and the CLI all time through `time_call`.

On CUDA a measured point is: warm the GPU until the SM clock is steady (skipped for a few seconds
after a point whose burst ended at that clock, never after one that ended under it), clone the call's inputs
enough times that the copies overflow the L2 several times (cold L2, as in decode where each
layer's weights are read once per step), capture one CUDA graph that runs the call over the copies
in turn, then replay it `repeats` times with CUDA events around each replay. A replay holds many
calls (at least `min_replay_ms` of work), so graph-launch and event overhead are amortised the
way `triton.testing.do_bench_cudagraph` amortises them; per-call time = replay time / calls.
With `max_burst_ms` set, a burst whose replays would outlast it runs fewer of them, so a call that
reaches the power limit is timed before the limit lowers the clock.
With `use_graph=False` the same calls are launched eagerly, so the launch overhead shows.

On CPU the timer is `time.perf_counter` around single calls, with the same statistics.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

MakeCall = Callable[[Any, "torch.Tensor | None"], Callable[[], Any]]

# The warm-up load: a bf16 matmul big enough to keep every SM busy and draw real power.
# The warm-up load: a memory-bound copy loop. It raises the SM clock to its boost like any sustained
# load, but unlike an 8192^3 matmul loop it stays far below the power limit, so the clock it leaves
# behind is the boost clock and not a power-throttled one (seen on the H200: after a matmul warm-up
# the first point ran at 1260 MHz instead of 1980).
WARMUP_COPY_BYTES = 256 * 2**20
# Clock readings that differ by less than this are "steady".
STEADY_CLOCK_TOLERANCE = 0.01
STEADY_CLOCK_READINGS = 3
# The fewest replays a burst cut by `max_burst_ms` keeps: enough for a 20th and 80th percentile.
MIN_BURST_REPEATS = 5
# L2 size when the device properties do not say (H200: 60 MB, as torch reads it there).
DEFAULT_L2_BYTES = 60 * 2**20


@dataclass
class TimerConfig:
    """How a point is timed. `warmup_s` is the least time spent warming clocks; the warm-up then
    continues until the SM clock is steady or `max_warmup_s` passes, and counts as fresh for
    `warm_valid_s` afterwards (so a sweep does not re-warm before every point)."""

    repeats: int = 50
    warmup_s: float = 1.0
    cold_l2: bool = True
    use_graph: bool = True
    l2_multiple: int = 4
    min_clock_ratio: float = 0.95
    max_warmup_s: float = 5.0
    min_replay_ms: float = 2.0       # work per replay, so launch/event overhead is amortised
    memory_budget_gb: float = 8.0    # cap on the cold-L2 copies
    max_copies: int = 1024           # cap on graph size for tiny operands
    warm_valid_s: float = 5.0
    # a burst longer than this is cut to fewer replays (never under MIN_BURST_REPEATS): a call at
    # the power limit lowers the SM clock ~0.1 s into sustained load (NOTES, calls 109-110 and
    # 159), and a burst that outlasts that onset mixes boost-clock samples with capped ones.
    # None: no cut, `repeats` replays whatever they last.
    max_burst_ms: float | None = None

    def __post_init__(self):
        positive_ints = {"repeats": self.repeats, "l2_multiple": self.l2_multiple,
                         "max_copies": self.max_copies}
        for name, value in positive_ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TimerConfig.{name} must be an integer >= 1, got {value!r}")
        non_negative = {"warmup_s": self.warmup_s, "max_warmup_s": self.max_warmup_s,
                        "min_replay_ms": self.min_replay_ms, "warm_valid_s": self.warm_valid_s}
        for name, value in non_negative.items():
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"TimerConfig.{name} must be a number >= 0, got {value!r}")
        if not 0 < self.min_clock_ratio <= 1:
            raise ValueError(f"TimerConfig.min_clock_ratio must be in (0, 1], "
                             f"got {self.min_clock_ratio!r}")
        if self.max_burst_ms is not None and not (
                isinstance(self.max_burst_ms, (int, float)) and not isinstance(self.max_burst_ms, bool)
                and self.max_burst_ms > 0):
            raise ValueError(f"TimerConfig.max_burst_ms must be a number > 0 or None, "
                             f"got {self.max_burst_ms!r}")
        if not self.memory_budget_gb > 0:
            raise ValueError(f"TimerConfig.memory_budget_gb must be > 0, "
                             f"got {self.memory_budget_gb!r}")

    @classmethod
    def from_dict(cls, values: dict, name: str = "timer") -> "TimerConfig":
        """A TimerConfig from settings such as a profile's `timer:` section; an unknown setting
        or a bad value is one line naming it (a typo never reaches a worker)."""
        from fp4lab.errors import ParameterError

        if isinstance(values, TimerConfig):
            return values
        if not isinstance(values, dict):
            raise ParameterError(f"{name}={values!r}: expected a mapping of timer settings")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ParameterError(f"{name}: unknown setting {unknown[0]!r} (known: {', '.join(known)})")
        try:
            return cls(**values)
        except ValueError as exc:
            raise ParameterError(f"{name}: {exc}") from None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def smoke(cls) -> "TimerConfig":
        """Quick: CPU tests and the smoke profile."""
        return cls(repeats=10, warmup_s=0.2, max_warmup_s=2.0, min_replay_ms=0.5)

    @classmethod
    def full(cls) -> "TimerConfig":
        """The reference run: many repeats, a real warm-up."""
        return cls(repeats=100, warmup_s=1.0, max_warmup_s=5.0, min_replay_ms=2.0)


@dataclass
class Timing:
    """Per-call time of one measured point; `samples_us` are per-call times of each replay."""

    median_us: float
    p20_us: float
    p80_us: float
    n: int
    graph: bool
    cold_l2: bool
    samples_us: list[float] = field(repr=False)
    sm_clock_mhz: float | None
    note: str = ""
    copies: int = 1          # distinct input copies rotated (1 = warm L2)
    calls_per_sample: int = 1
    # the two readings sm_clock_mhz is the median of: a burst that reaches the power limit runs
    # its first samples at one clock and its last at a lower one, and their mean is neither
    sm_clock_start_mhz: float | None = None
    sm_clock_end_mhz: float | None = None


def burst_repeats(config: TimerConfig, replay_ms: float) -> int:
    """Replays in one timed burst: `repeats`, cut to fit `max_burst_ms` of estimated work."""
    if config.max_burst_ms is None or replay_ms <= 0:
        return config.repeats
    fitting = math.floor(config.max_burst_ms / replay_ms)
    return min(config.repeats, max(MIN_BURST_REPEATS, fitting))


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no samples")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples_us: list[float], **fields) -> Timing:
    """A Timing from per-call samples: median, p20, p80 and n."""
    return Timing(median_us=statistics.median(samples_us), p20_us=percentile(samples_us, 20),
                  p80_us=percentile(samples_us, 80), n=len(samples_us),
                  samples_us=list(samples_us), **fields)


# -- cloning inputs for cold L2 -----------------------------------------------------------------

def clone_args(obj):
    """A deep copy of every tensor in `obj` (tensors, dataclasses, tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: clone_args(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(clone_args(item) for item in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(clone_args(item) for item in obj)
    if isinstance(obj, dict):
        return {key: clone_args(value) for key, value in obj.items()}
    return obj


def tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in tensors_in(value)]
    return []


def args_nbytes(obj) -> int:
    """Bytes of the distinct tensors in `obj` (a tensor listed twice counts once)."""
    distinct = {(t.data_ptr(), t.nbytes): t.nbytes for t in tensors_in(obj)}
    return sum(distinct.values())


def cold_l2_copies(bytes_per_copy: int, l2_bytes: int, l2_multiple: int, budget_bytes: int,
                   max_copies: int) -> tuple[int, str]:
    """How many input copies make the rotation read >= l2_multiple x L2 between two reads of the
    same copy; (count, note) where note says why it was capped ("" when not)."""
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy must be > 0, got {bytes_per_copy}")
    wanted = max(1, math.ceil(l2_multiple * l2_bytes / bytes_per_copy))
    by_budget = max(1, budget_bytes // bytes_per_copy)
    count = min(wanted, by_budget, max_copies)
    if count == wanted:
        return count, ""
    limit = "memory budget" if by_budget <= max_copies else "max_copies"
    ratio = count * bytes_per_copy / l2_bytes
    return count, (f"cold L2 capped by {limit}: {count} copies = {ratio:.1f}x L2 "
                   f"(wanted {l2_multiple}x)")


# -- clocks -------------------------------------------------------------------------------------

class SmClock:
    """A GPU's SM clock through fp4lab.nvml's reader; `read()` is None when NVML cannot answer."""

    def __init__(self, index: int):
        from fp4lab import nvml

        self.reader = None
        pynvml, _ = nvml.load_nvml()
        if pynvml is not None:
            try:
                self.reader = nvml.GpuReader(pynvml, index)
            except Exception:  # noqa: BLE001 - no NVML means no clock readings, never a failure
                self.reader = None

    def read(self) -> float | None:
        return None if self.reader is None else self.reader.sm_clock_mhz()

    def max(self) -> float | None:
        return None if self.reader is None else self.reader.max_clock_mhz("sm")


@functools.lru_cache(maxsize=None)
def sm_clock(index: int) -> SmClock:
    """One NVML reader per GPU index, kept for the process (nvmlInit is not free)."""
    return SmClock(index)


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_warm_until: dict[int, tuple[float, float | None]] = {}  # device index -> (deadline, clock)


def clock_is_steady(readings: list[float], max_clock: float | None, min_ratio: float) -> bool:
    """Steady: at min_ratio of the max clock, or the last few readings stopped rising."""
    if not readings:
        return False
    if max_clock and readings[-1] >= min_ratio * max_clock:
        return True
    recent = readings[-STEADY_CLOCK_READINGS:]
    return (len(recent) == STEADY_CLOCK_READINGS
            and max(recent) - min(recent) <= STEADY_CLOCK_TOLERANCE * max(recent))


def warm_up_clocks(device, config: TimerConfig) -> float | None:
    """Run a copy loop until the SM clock is steady; return that clock (MHz).

    None on CPU, or on a GPU without NVML (then the loop simply runs for `warmup_s`).
    A warm-up (or a timed point) in the last `warm_valid_s` seconds counts: no re-warming.
    """
    device = torch_device(device)
    if device.type != "cuda":
        return None
    index = device_index(device)
    clock = sm_clock(index)
    deadline, last_clock = _warm_until.get(index, (0.0, None))
    if time.monotonic() < deadline:
        return clock.read() or last_clock
    source = torch.ones(WARMUP_COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    max_clock, readings = clock.max(), []
    start = time.monotonic()
    while True:
        for _ in range(20):
            target.copy_(source)
        torch.cuda.synchronize(device)
        reading = clock.read()
        if reading is not None:
            readings.append(reading)
        elapsed = time.monotonic() - start
        if elapsed >= config.max_warmup_s:
            break
        if elapsed >= config.warmup_s and (reading is None or clock_is_steady(
                readings, max_clock, config.min_clock_ratio)):
            break
    steady = readings[-1] if readings else None
    mark_warm(index, config, steady)
    return steady


def mark_warm(index: int, config: TimerConfig, clock_mhz: float | None) -> None:
    _warm_until[index] = (time.monotonic() + config.warm_valid_s, clock_mhz)


def mark_burst_end(index: int, config: TimerConfig, clock_mhz: float | None,
                   max_clock_mhz: float | None) -> None:
    """After a timed burst: one that ended at the warm clock counts as a warm-up for the next point;
    one that ended under `min_clock_ratio` of the maximum (a call at the power limit lowers the
    clock within ~0.1 s of sustained load: NOTES, calls 109-110) does not, so the next point warms
    up again and its burst too starts at the boost clock, not where the last one left the board."""
    if clock_mhz is not None and max_clock_mhz and clock_mhz < config.min_clock_ratio * max_clock_mhz:
        _warm_until.pop(index, None)
    else:
        mark_warm(index, config, clock_mhz)


# -- the timer ----------------------------------------------------------------------------------

def torch_device(device) -> torch.device:
    """"auto" | "cpu" | "cuda" | "cuda:N" | torch.device -> torch.device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU")
    return resolved


def time_call(make_call: MakeCall, args, out, config: TimerConfig | None = None,
              device="auto") -> Timing:
    """Time `make_call(args, out)()`: per-call median / p20 / p80 over `config.repeats` samples."""
    config = config or TimerConfig()
    device = torch_device(device)
    if device.type == "cuda":
        return _time_cuda(make_call, args, out, config, device)
    return _time_cpu(make_call(args, out), config)


def _time_cpu(call: Callable[[], Any], config: TimerConfig) -> Timing:
    # One intra-op thread: on a small shared machine (CI's 2 cores, a papermill kernel beside its
    # parent) two OpenMP threads wait for each other at every barrier until the scheduler's next
    # tick, and a 30 us matmul read 8 ms, in 4 ms steps. One thread measures the kernel instead.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        call()  # first call pays one-time costs (allocation, dispatch caches)
        samples = []
        for _ in range(config.repeats):
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        torch.set_num_threads(threads)
    return summarize(samples, graph=False, cold_l2=False, sm_clock_mhz=None,
                     note="CPU: time.perf_counter around single calls, one thread; caches not flushed")


def l2_bytes(device: torch.device) -> int:
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES


def _input_sets(args, out, config: TimerConfig, device: torch.device) -> tuple[list, list, str]:
    """The (args, out) copies the calls rotate through: one set when warm, enough when cold."""
    if not config.cold_l2:
        return [args], [out], ""
    per_copy = args_nbytes(args) + (out.nbytes if out is not None else 0)
    count, note = cold_l2_copies(per_copy, l2_bytes(device), config.l2_multiple,
                                 int(config.memory_budget_gb * 2**30), config.max_copies)
    arg_sets = [args] + [clone_args(args) for _ in range(count - 1)]
    out_sets = [out] + [clone_args(out) for _ in range(count - 1)]
    return arg_sets, out_sets, note


def _estimate_call_us(calls: list[Callable[[], Any]], device: torch.device) -> float:
    """Eager per-call estimate over one pass of the rotation (GPU time between events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e3 / len(calls)


def capture_graph(run_replay: Callable[[], None], device: torch.device):
    """(graph, "") or (None, why capture failed): some libraries cannot be captured."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run_replay()
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any capture failure means: time eagerly, say so
        torch.cuda.synchronize(device)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"graph capture failed ({type(exc).__name__}: {message[:160]}); timed eagerly"
    return graph, ""


def _time_cuda(make_call: MakeCall, args, out, config: TimerConfig, device: torch.device) -> Timing:
    warm_up_clocks(device, config)
    arg_sets, out_sets, note = _input_sets(args, out, config, device)
    calls = [make_call(a, o) for a, o in zip(arg_sets, out_sets)]
    copies = len(calls)

    side_stream = torch.cuda.Stream(device)  # warm-up off the default stream, as capture wants
    side_stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side_stream):
        for call in calls:  # first calls pay one-time costs: JIT, autotuning, workspaces
            call()
        estimate_us = _estimate_call_us(calls, device)
    torch.cuda.current_stream(device).wait_stream(side_stream)

    passes = max(1, math.ceil(config.min_replay_ms * 1e3 / max(estimate_us * copies, 1e-3)))
    calls_per_replay = passes * copies
    repeats = burst_repeats(config, estimate_us * calls_per_replay / 1e3)
    if repeats < config.repeats:
        note = "; ".join(filter(None, [note, f"burst cut to {repeats} replays ({config.max_burst_ms:g} ms)"]))

    def run_replay():
        for _ in range(passes):
            for call in calls:
                call()

    graph = None
    if config.use_graph:
        graph, failure = capture_graph(run_replay, device)
        note = "; ".join(filter(None, [note, failure]))
    step = graph.replay if graph is not None else run_replay
    step()  # one untimed replay: graph upload, clocks settle on this exact work
    torch.cuda.synchronize(device)

    index = device_index(device)
    clock = sm_clock(index)
    clock_before = clock.read()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    clock_after = clock.read()
    mark_burst_end(index, config, clock_after, clock.max())

    samples = [start.elapsed_time(end) * 1e3 / calls_per_replay for start, end in events]
    readings = [c for c in (clock_before, clock_after) if c is not None]
    return summarize(samples, graph=graph is not None, cold_l2=config.cold_l2,
                     sm_clock_mhz=statistics.median(readings) if readings else None, note=note,
                     copies=copies, calls_per_sample=calls_per_replay,
                     sm_clock_start_mhz=clock_before, sm_clock_end_mhz=clock_after)


def empty_kernel_launch_us(device="auto", config: TimerConfig | None = None) -> float:
    """The launch floor: per-kernel time of a one-element add, replayed from a CUDA graph
    (on CPU: the dispatch time of the same op, the floor of any torch call there)."""
    config = dataclasses.replace(config or TimerConfig.smoke(), cold_l2=False, use_graph=True)
    device = torch_device(device)
    counter = torch.zeros(1, device=device)
    return time_call(lambda args, _out: lambda: args[0].add_(1), (counter,), None, config,
                     device).median_us


def format_timing_line(label: str, timing: Timing) -> str:
    """One fixed-width line for a timed point: label, median, p20-p80, n, graph/eager, L2, clock."""
    clock = f"{timing.sm_clock_mhz:5.0f} MHz" if timing.sm_clock_mhz else "    - MHz"
    return (f"{label:<36.36} {timing.median_us:>11.2f} us  p20-p80 {timing.p20_us:>10.2f}-"
            f"{timing.p80_us:<10.2f} n {timing.n:>4}  {'graph' if timing.graph else 'eager'} "
            f"{'cold' if timing.cold_l2 else 'warm'} x{timing.copies:<4} {clock}")
