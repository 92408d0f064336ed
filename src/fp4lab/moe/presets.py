"""MoE model presets: the HF config fields that decide per-expert GEMM sizes, with their source.

Shape legend: `H` hidden, `I` moe_intermediate, `E` routed experts, `k` top-k. One routed expert
is a SwiGLU MLP: gate and up fused into one GEMM `[2I, H]` and down `[H, I]`, written `(N, K)`
as everywhere in fp4lab (weights `w: [N, K]`, activations `[M, K]`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    key: str
    name: str
    hidden: int              # H
    moe_intermediate: int    # I
    experts: int             # E, routed experts per MoE layer
    top_k: int               # k
    shared_experts: int      # always-on experts (not routed; not part of the scatter)
    layers: int              # all decoder layers
    dense_layers: int        # leading layers with a dense MLP instead of experts
    source: str
    scaled: bool = False     # True for the tiny CPU stand-ins built by `scaled_down`

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """{"gate_up": (2I, H), "down": (H, I)} as (N, K)."""
        return {"gate_up": (2 * self.moe_intermediate, self.hidden),
                "down": (self.hidden, self.moe_intermediate)}


_HF = "Hugging Face config.json / transformers defaults, as tabulated in docs/REFERENCES.md"

PRESETS: dict[str, ModelPreset] = {p.key: p for p in (
    ModelPreset("glm-5", "GLM-5", 6144, 2048, 256, 8, 1, 78, 3,
                "transformers models/glm_moe_dsa defaults (docs/REFERENCES.md)"),
    ModelPreset("glm-4.5", "GLM-4.5/4.6", 5120, 1536, 160, 8, 1, 92, 3, _HF),
    ModelPreset("deepseek-v3", "DeepSeek-V3/R1", 7168, 2048, 256, 8, 1, 61, 3, _HF),
    ModelPreset("kimi-k2", "Kimi K2", 7168, 2048, 384, 8, 1, 61, 1, _HF),
    ModelPreset("qwen3-235b-a22b", "Qwen3-235B-A22B", 4096, 1536, 128, 8, 0, 94, 0, _HF),
    ModelPreset("qwen3-30b-a3b", "Qwen3-30B-A3B", 2048, 768, 128, 8, 0, 48, 0, _HF),
    ModelPreset("gpt-oss-120b", "gpt-oss-120b", 2880, 2880, 128, 4, 0, 36, 0,
                "transformers configuration_gpt_oss.py (docs/REFERENCES.md)"),
    ModelPreset("mixtral-8x7b", "Mixtral 8x7B", 4096, 14336, 8, 2, 0, 32, 0, _HF),
)}


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


# every key also answers without its dashes and dots ("glm5", "deepseekv3", "qwen3235ba22b")
ALIASES: dict[str, str] = {
    **{key.replace("-", "").replace(".", ""): key for key in PRESETS},
    "glm-4.6": "glm-4.5", "deepseek-r1": "deepseek-v3", "kimi-k2-instruct": "kimi-k2",
    "mixtral": "mixtral-8x7b",
}


def names() -> list[str]:
    return sorted(PRESETS)


def get(name: str) -> ModelPreset:
    """A preset by key or alias ("glm-5", "GLM5", "glm5"); unknown names list the valid ones."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"model preset {name!r}: expected a name; valid: {', '.join(names())}")
    key = _normalize(name)
    key = key if key in PRESETS else ALIASES.get(key, ALIASES.get(key.replace("-", "").replace(".", "")))
    if key is None:
        raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(names())}")
    return PRESETS[key]


def scaled_down(preset: ModelPreset, experts: int = 8, hidden: int = 64,
                moe_intermediate: int = 32, top_k: int | None = None) -> ModelPreset:
    """A tiny stand-in with the same structure, for CPU runs that must finish in seconds.

    Rows measured on it carry `scaled=True`: its times say nothing about the real model.
    """
    top_k = min(preset.top_k, experts) if top_k is None else top_k
    if top_k > experts:
        raise ValueError(f"scaled preset: top_k={top_k} exceeds experts={experts}")
    return dataclasses.replace(preset, key=f"{preset.key}-scaled", name=f"{preset.name} (scaled)",
                               hidden=hidden, moe_intermediate=moe_intermediate,
                               experts=experts, top_k=top_k, scaled=True)
