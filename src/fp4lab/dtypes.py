"""The dtype vocabulary every layer shares: what a weight costs in bytes, what the math runs in.

A GEMM point reads weights stored as `weight_dtype` and feeds activations to the math units as
`act_dtype`; the pair decides the dtype the math runs in (`math_dtype`), whose peak "% of peak"
is measured against. Weight-only kernels (FP4 or int4 weights decoded in registers, as on Hopper)
do bf16 math; native W4A4 kernels do FP4 math.

- "fp4": e2m1 codes, 0.5 B per value plus one block-scale byte per 16 (nvfp4) or 32 (mxfp4);
- "int4": 0.5 B per value plus a bf16 scale and a bf16 zero per group of 128 (tinygemm's layout:
  the same bytes as FP4, not FP4);
- "fp8": e4m3, 1 B per value plus a float32 scale per row;
- "bf16": 2 B per value.
"""

from __future__ import annotations

WEIGHT_DTYPES = ("fp4", "int4", "fp8", "bf16")
BYTES_PER_VALUE = {"fp4": 0.5, "int4": 0.5, "fp8": 1, "bf16": 2}
INT4_GROUP = 128                       # tinygemm's group size along K
INT4_GROUP_BYTES = 4                   # one bf16 scale and one bf16 zero per group

MATH_DTYPE = {
    ("fp4", "fp4"): "fp4",
    ("fp4", "fp8"): "fp8",
    ("fp4", "bf16"): "bf16",
    ("int4", "bf16"): "bf16",
    ("fp8", "fp8"): "fp8",
    ("fp8", "bf16"): "bf16",
    ("bf16", "bf16"): "bf16",
}

# One-line labels for weight dtypes wherever the book names them.
WEIGHT_LABELS = {"fp4": "FP4", "int4": "int4 (not FP4)", "fp8": "FP8", "bf16": "bf16"}


def math_dtype(weight_dtype: str, act_dtype: str | None = None) -> str:
    """The dtype the math runs in for weights `weight_dtype` and activations `act_dtype`
    (default: the weights' own dtype)."""
    key = (weight_dtype, act_dtype or weight_dtype)
    if key not in MATH_DTYPE:
        raise ValueError(f"no math dtype for weights {key[0]!r} with activations {key[1]!r}; "
                         f"known pairs: {sorted(MATH_DTYPE)}")
    return MATH_DTYPE[key]
