"""Routing models: which `k` experts each token of a decode batch picks, step after step.

Shape legend: `S` decode steps, `T` tokens in the batch (the concurrency B), `k` top-k,
`E` routed experts. A routing draw is an int array `ids: [S, T, k]` of expert ids, distinct
within a token; `tokens_per_expert(ids, E)` turns it into the per-step loads `[S, E]`.

Specs (strings, so they travel through papermill and the CLI):
- `uniform`: every token picks k distinct experts uniformly at random (an ideal router).
- `zipf:S`: expert popularity ~ 1/rank^S; k distinct experts drawn by popularity, without
  replacement (Gumbel top-k). Which expert holds which rank is a seeded shuffle, so hot experts
  are scattered across expert-parallel ranks as in real models, not all on rank 0.
- `trace:PATH`: replay a `.npy` int array `[S, T, k]` of expert ids recorded from a real router.
  A measurement replays it as recorded (its T is the batch); a model of another batch size
  (`modelled_loads`: the diagnosis's what-ifs, the projection) regroups its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# draws are made in chunks of steps so that [chunk, T, E] random keys stay under ~64 MB
_KEY_BUDGET = 8_000_000


@dataclass(frozen=True)
class RoutingSpec:
    kind: str                   # "uniform" | "zipf" | "trace"
    zipf_s: float = 0.0         # popularity exponent for "zipf"
    trace_path: str = ""        # the .npy file for "trace"

    def __str__(self) -> str:
        if self.kind == "zipf":
            return f"zipf:{self.zipf_s:g}"
        if self.kind == "trace":
            return f"trace:{self.trace_path}"
        return self.kind


def parse_routing(spec: str | RoutingSpec) -> RoutingSpec:
    """`"uniform"`, `"zipf:1.2"` or `"trace:/path/ids.npy"` -> RoutingSpec."""
    if isinstance(spec, RoutingSpec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"routing {spec!r}: expected a string like 'uniform', 'zipf:1.0' or 'trace:PATH'")
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "uniform" and not arg:
        return RoutingSpec("uniform")
    if kind == "zipf":
        try:
            exponent = float(arg)
        except ValueError:
            raise ValueError(f"routing {spec!r}: zipf needs a number, e.g. 'zipf:1.0'") from None
        if not np.isfinite(exponent) or exponent < 0:
            raise ValueError(f"routing {spec!r}: the zipf exponent must be a finite number >= 0")
        return RoutingSpec("zipf", zipf_s=exponent)
    if kind == "trace" and arg:
        return RoutingSpec("trace", trace_path=arg)
    raise ValueError(f"routing {spec!r}: expected 'uniform', 'zipf:S' (S >= 0) or 'trace:PATH'")


def _check_sizes(experts: int, top_k: int, batch: int, steps: int) -> None:
    for name, value in (("experts", experts), ("top_k", top_k), ("batch", batch), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if top_k > experts:
        raise ValueError(f"top_k={top_k} exceeds experts={experts}: a token picks distinct experts")


def popularity(experts: int, zipf_s: float, rng: np.random.Generator) -> np.ndarray:
    """Probability per expert [E]: 1/rank^s over a seeded shuffle of the experts."""
    weights = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** zipf_s
    return rng.permutation(weights / weights.sum())


def sample_expert_ids(spec: str | RoutingSpec, experts: int, top_k: int, batch: int,
                      steps: int, seed: int = 0) -> np.ndarray:
    """Expert ids `[S, T, k]` (int64) drawn by the routing model, reproducible from `seed`."""
    spec = parse_routing(spec)
    if spec.kind == "trace":
        return load_trace(spec.trace_path, experts, top_k, batch=batch, steps=steps)
    _check_sizes(experts, top_k, batch, steps)
    rng = np.random.default_rng(seed)
    # Gumbel top-k: the k largest of log(p) + Gumbel noise are k draws without replacement,
    # each proportional to p among the experts left; uniform is the case p = 1/E.
    log_p = np.log(popularity(experts, spec.zipf_s, rng)) if spec.kind == "zipf" else np.zeros(experts)
    chunk = max(1, _KEY_BUDGET // (batch * experts))
    parts = []
    for start in range(0, steps, chunk):
        count = min(chunk, steps - start)
        noise = rng.gumbel(size=(count, batch, experts)) if spec.kind == "zipf" \
            else rng.random((count, batch, experts))                       # uniform: any iid keys do
        keys = log_p + noise                                               # [s, T, E]
        parts.append(np.argpartition(-keys, top_k - 1, axis=-1)[..., :top_k])  # [s, T, k]
    return np.concatenate(parts).astype(np.int64)


def load_trace(path: str | Path, experts: int, top_k: int, batch: int | None = None,
               steps: int | None = None) -> np.ndarray:
    """A recorded routing `[S, T, k]`, checked: int ids in [0, E), distinct per token, k as asked.

    `batch` (if given) must equal the trace's T; `steps` (if given) takes the first S steps.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"routing trace {path}: no such file")
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ValueError(f"routing trace {path}: not a readable .npy array ({exc})") from None
    if ids.ndim != 3:
        raise ValueError(f"routing trace {path}: expected an int array [steps, batch, top_k], "
                         f"got {ids.ndim} dimensions {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"routing trace {path}: expected integer expert ids, got dtype {ids.dtype}")
    trace_steps, trace_batch, trace_k = ids.shape
    if trace_k != top_k:
        raise ValueError(f"routing trace {path}: has top_k={trace_k} per token, expected top_k={top_k}")
    _check_sizes(experts, top_k, trace_batch, max(trace_steps, 1))
    if batch is not None and batch != trace_batch:
        raise ValueError(f"routing trace {path}: has batch={trace_batch}, asked for batch={batch}")
    if steps is not None:
        if steps > trace_steps:
            raise ValueError(f"routing trace {path}: has {trace_steps} steps, asked for steps={steps}")
        ids = ids[:steps]
    if ids.size and (ids.min() < 0 or ids.max() >= experts):
        raise ValueError(f"routing trace {path}: expert ids must lie in [0, {experts}), "
                         f"found {ids.min()}..{ids.max()}")
    ordered = np.sort(ids, axis=-1)
    repeats = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)        # [S, T]
    if repeats.any():
        step, token = np.argwhere(repeats)[0]
        raise ValueError(f"routing trace {path}: token {token} of step {step} picks the same "
                         f"expert twice: {ids[step, token].tolist()}")
    return ids.astype(np.int64)


def tokens_per_expert(ids: np.ndarray, experts: int) -> np.ndarray:
    """Per-step loads `[S, E]`: how many tokens of each step's batch each expert receives."""
    steps = ids.shape[0]
    flat = (ids.reshape(steps, -1) + experts * np.arange(steps)[:, None]).ravel()
    return np.bincount(flat, minlength=steps * experts).reshape(steps, experts)


def expert_loads(spec: str | RoutingSpec, experts: int, top_k: int, batch: int, steps: int,
                 seed: int = 0) -> np.ndarray:
    """Per-step tokens per expert `[S, E]` under a routing model."""
    return tokens_per_expert(sample_expert_ids(spec, experts, top_k, batch, steps, seed), experts)


def regroup_trace(ids: np.ndarray, batch: int, steps: int) -> np.ndarray:
    """A trace's tokens `[S, T, k]` in recorded order, cut into `steps` batches of `batch` tokens
    (wrapping round where the trace holds fewer): its expert choices at another concurrency.
    Which experts are popular is kept; which tokens shared a step is not."""
    _check_sizes(1, 1, batch, steps)
    tokens = ids.reshape(-1, ids.shape[-1])                                  # [S*T, k]
    picks = np.arange(steps * batch) % len(tokens)
    return tokens[picks].reshape(steps, batch, ids.shape[-1])                # [steps, batch, k]


def modelled_loads(spec: str | RoutingSpec, experts: int, top_k: int, batch: int, steps: int,
                   seed: int = 0) -> np.ndarray:
    """`expert_loads` for a model at any batch: a trace recorded at another T is regrouped."""
    spec = parse_routing(spec)
    if spec.kind == "trace":
        ids = regroup_trace(load_trace(spec.trace_path, experts, top_k), batch, steps)
        return tokens_per_expert(ids, experts)
    return expert_loads(spec, experts, top_k, batch, steps, seed)
