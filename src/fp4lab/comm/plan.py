"""The declared communication sweep: which ops, group sizes, token counts, dtypes and routings.

A plan is data (`CommPlan`, with `smoke()` and `full()` presets, or `from_preset(model)` for a
model's hidden size, experts and top-k); `points(world)` expands it for a run of `world` ranks
into the ordered list every rank walks through in lock-step.

Token counts mean what each op's layout means by them (see `comm.ops` and `comm.splits`):
all_reduce and send_recv move `[T, H]` (the TP batch, a PP microbatch); the all-to-alls move
`T` tokens per EP rank, k rows each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fp4lab.comm.ops import ALL_TO_ALL_OPS, DTYPES, OPS
from fp4lab.moe import presets, routing

# one decode token to a large batch
FULL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# The skewed routing: zipf:0.7 gives a per-rank max/mean of about 2.6 at EP32 (E=256, k=8,
# 128 tokens per rank), near TensorRT-LLM's measured 2.56 for DeepSeek-R1 without a load
# balancer (docs/REFERENCES.md, "Expert load imbalance").
SKEWED_ROUTING = "zipf:0.7"
MIB = 2**20


@dataclass(frozen=True)
class CommPoint:
    """One measured point: an op over the first `world_size` ranks at `tokens` tokens."""

    index: int
    op: str
    world_size: int
    tokens: int
    dtype: str
    routing: str | None = None     # all-to-all only

    @property
    def label(self) -> str:
        extra = f" {self.routing}" if self.routing else ""
        return f"{self.op} n={self.world_size} {self.dtype}{extra} T={self.tokens}"


@dataclass(frozen=True)
class CommPlan:
    ops: tuple[str, ...] = OPS
    tokens: tuple[int, ...] = FULL_TOKENS
    world_sizes: tuple[int, ...] = ()    # () = powers of two from 2 up to the world, and the world
    hidden: int = 6144                   # H (GLM-5)
    experts: int = 256                   # E
    top_k: int = 8                       # k
    preset: str = "glm-5"                # where H, E, k come from ("" when given by hand)
    dtypes: tuple[str, ...] = DTYPES          # of the all-to-alls; all_reduce / send_recv: bf16
    routings: tuple[str, ...] = ("uniform", SKEWED_ROUTING)
    repeats: int = 50
    warmup_s: float = 1.0
    use_graph: bool = True
    # Each timed sample runs a fixed number of back-to-back calls (the same on every rank, so the
    # ranks stay in lock-step), enough to amortise the timer's events over small messages:
    # sample_bytes // bytes calls, at least 1, at most max_calls_per_sample.
    max_calls_per_sample: int = 16
    sample_bytes: int = 64 * MIB
    point_timeout_s: float = 120.0       # a point (measure + gather) taking longer = a stuck rank
    seed: int = 0

    def __post_init__(self):
        for name in ("hidden", "experts", "top_k", "repeats", "max_calls_per_sample",
                     "sample_bytes"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not self.ops or set(self.ops) - set(OPS):
            raise ValueError(f"ops: {','.join(self.ops) or 'none'}; choose from {', '.join(OPS)}")
        if not self.tokens:
            raise ValueError("tokens: give at least one token count")
        for value in self.tokens:
            _positive_int("tokens", value)
        for value in self.world_sizes:
            _positive_int("world_sizes", value)
        if not self.dtypes or set(self.dtypes) - set(DTYPES):
            raise ValueError(f"dtypes: {','.join(self.dtypes) or 'none'}; "
                             f"choose from {', '.join(DTYPES)}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")
        if not self.routings:
            raise ValueError("routings: give at least one routing model")
        for spec in self.routings:
            try:
                routing.parse_routing(spec)
            except ValueError as exc:
                raise ValueError(f"routings: {exc}") from None
        if not self.warmup_s >= 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s!r}")
        if not self.point_timeout_s > 0:
            raise ValueError(f"point_timeout_s must be > 0, got {self.point_timeout_s!r}")

    @classmethod
    def full(cls) -> "CommPlan":
        """The reference run: GLM-5's sizes, every op, one token to 2048."""
        return cls()

    @classmethod
    def smoke(cls) -> "CommPlan":
        """Seconds on two CPU processes (gloo): tiny sizes, few repeats."""
        return cls(tokens=(1, 4, 16), hidden=64, experts=8, top_k=2, preset="", repeats=5,
                   warmup_s=0.0, max_calls_per_sample=2, point_timeout_s=30.0)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "CommPlan":
        """A plan with a model preset's hidden size, experts and top-k."""
        model = presets.get(name)
        return cls(hidden=model.hidden, experts=model.experts, top_k=model.top_k,
                   preset=model.key, **overrides)

    def with_overrides(self, **overrides) -> "CommPlan":
        """A copy with the given fields changed (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def group_sizes(self, world: int) -> tuple[int, ...]:
        """The group sizes measured in a run of `world` ranks (each group: ranks 0..size-1)."""
        _positive_int("world size", world)
        if self.world_sizes:
            too_large = [size for size in self.world_sizes if size > world]
            if too_large:
                raise ValueError(f"world_sizes: {too_large} exceed the run's {world} ranks")
            return tuple(sorted(set(self.world_sizes)))
        if world == 1:
            return (1,)
        powers = {2**i for i in range(1, world.bit_length()) if 2**i <= world}
        return tuple(sorted(powers | {world}))

    def points(self, world: int) -> list[CommPoint]:
        """Every point of a run of `world` ranks, in the order all ranks walk them."""
        specs = []
        for size in self.group_sizes(world):
            for op in self.ops:
                if op in ALL_TO_ALL_OPS:
                    if size > self.experts:
                        continue  # fewer experts than EP ranks: no such layout
                    specs += [(op, size, t, dtype, spec) for dtype in self.dtypes
                              for spec in self.routings for t in self.tokens]
                else:
                    specs += [(op, size, t, "bf16", None) for t in self.tokens]
        return [CommPoint(i, *spec) for i, spec in enumerate(specs)]

    def calls_per_sample(self, nbytes: int) -> int:
        return max(1, min(self.max_calls_per_sample, self.sample_bytes // max(nbytes, 1)))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "CommPlan":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - fields
        if unknown:
            raise ValueError(f"comm plan: unknown field(s) {', '.join(sorted(unknown))}")
        tuples = {k: tuple(v) for k, v in values.items() if isinstance(v, list)}
        return cls(**{**values, **tuples})


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
