"""NVFP4 and MXFP4: encode, decode, nibble packing and the 128x4 scale swizzle, in plain torch.

Both formats store 4-bit e2m1 values (sign bit + 2 exponent bits + 1 mantissa bit; magnitudes
0, 0.5, 1, 1.5, 2, 3, 4, 6) in blocks along the last dimension K, each block with one scale:

- NVFP4: blocks of 16, an e4m3 block scale, and a float32 global scale per tensor. The global
  scale kept here is the *encode* scale `448 * 6 / amax(|x|)` that FlashInfer and sgl-kernel
  take: an element decodes as `e2m1 * float(block_scale) / global_scale`.
- MXFP4 (OCP MX v1.0): blocks of 32, an e8m0 block scale (a biased power of two), no global scale.

Shape legend: `...` leading dims (rows, or experts x rows), `K` the quantized (last) dim,
`B` the block size (16 or 32), `R` all leading dims flattened.

The work runs in row chunks so that quantizing a [256, 4096, 6144] expert stack on a GPU needs
float32 temporaries of one chunk, not of the whole tensor.
"""

from __future__ import annotations

import functools

import math
from dataclasses import dataclass, replace

import torch

BLOCK_SIZE = {"nvfp4": 16, "mxfp4": 32}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of e2m1 codes 0..7
E2M1_MAX = 6.0
E2M1_EMAX = 2            # exponent of the largest e2m1 power of two (4 = 2^2): OCP MX's emax_elem
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127   # code 255 is NaN in e8m0 and is never produced

# Rounding thresholds between neighbouring e2m1 magnitudes, with the direction of a tie:
# a tie goes to the even code, so at a threshold below an even code we round up (>=),
# at one below an odd code we stay down (>).
_E2M1_THRESHOLDS = tuple(
    (0.5 * (lo + hi), (code + 1) % 2 == 0)   # (midpoint, tie rounds up)
    for code, (lo, hi) in enumerate(zip(E2M1_VALUES, E2M1_VALUES[1:]))
)

CHUNK_ELEMENTS = 1 << 24   # elements per row chunk: 64 MiB of float32 temporaries


@dataclass
class QuantizedTensor:
    """An FP4 tensor: packed nibbles, block scales and (NVFP4) a global scale."""

    packed: torch.Tensor               # uint8 [..., K/2], element 2i low nibble, 2i+1 high nibble
    scales: torch.Tensor               # nvfp4: float8_e4m3fn [..., K/16]; mxfp4: uint8 e8m0 [..., K/32]
    global_scale: torch.Tensor | None  # nvfp4: float32 encode scale, scalar ([E] for an expert
                                       # stack [E, N, K]); mxfp4: None
    fmt: str
    shape: tuple[int, ...]             # the original shape [..., K]

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE[self.fmt]

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads for this tensor: packed values plus block scales."""
        return self.packed.numel() * self.packed.element_size() + \
            self.scales.numel() * self.scales.element_size()

    def to(self, device: str | torch.device) -> "QuantizedTensor":
        return replace(
            self,
            packed=self.packed.to(device),
            scales=self.scales.to(device),
            global_scale=None if self.global_scale is None else self.global_scale.to(device),
        )


# -- validation ---------------------------------------------------------------------------

def check_fmt(fmt: str) -> str:
    if fmt not in BLOCK_SIZE:
        raise ValueError(f"unknown FP4 format {fmt!r}: use one of {sorted(BLOCK_SIZE)}")
    return fmt


def _check_input(x, fmt: str) -> torch.Tensor:
    """The input as [R, K]; raises ValueError naming what is wrong with it."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fmt} quantization needs a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{fmt} quantization needs a tensor [..., K]; got a 0-d tensor (a scalar)")
    if x.numel() == 0:
        raise ValueError(f"{fmt} quantization got an empty tensor of shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{fmt} quantization needs a floating-point tensor, got dtype {x.dtype}")
    block = BLOCK_SIZE[fmt]
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"last dimension K={k} of shape {tuple(x.shape)} is not a multiple of "
                         f"the {fmt} block size {block}")
    return x.reshape(-1, k)


def _abs_max(rows: torch.Tensor) -> float:
    """max |x| over all rows, chunked; NaN or Inf anywhere raises (FP4 cannot encode them)."""
    amax = 0.0
    for chunk in _row_chunks(rows):
        chunk_max = chunk.abs().amax().float().item()  # torch's amax propagates NaN
        if not math.isfinite(chunk_max):
            raise ValueError("input contains NaN or Inf: FP4 formats cannot encode them")
        amax = max(amax, chunk_max)
    return amax


def _row_chunks(rows: torch.Tensor):
    step = max(1, CHUNK_ELEMENTS // rows.shape[1])
    for start in range(0, rows.shape[0], step):
        yield rows[start:start + step]


# -- e2m1 codes and nibbles ---------------------------------------------------------------

def e2m1_encode(values: torch.Tensor) -> torch.Tensor:
    """Nibbles (uint8, sign in bit 3) of float32 values already divided by their block scale.

    Round to nearest, ties to the even code, saturate at 6 (anything above 5 becomes code 7).
    """
    magnitude = values.abs()
    code = torch.zeros(values.shape, dtype=torch.uint8, device=values.device)
    for midpoint, tie_up in _E2M1_THRESHOLDS:
        code += (magnitude >= midpoint) if tie_up else (magnitude > midpoint)
    sign = torch.signbit(values).to(torch.uint8) << 3
    return code | sign


@functools.lru_cache(maxsize=None)
def _e2m1_table(device: torch.device) -> torch.Tensor:
    """float32 [16] value of every code, made once per device: building it inside a call would
    copy from the host, which a CUDA-graph capture of that call (the timer's) does not allow."""
    magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([magnitudes, -magnitudes])   # codes 8..15 are the negatives


def e2m1_decode(nibbles: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 nibbles (0..15)."""
    return _e2m1_table(nibbles.device)[nibbles.long()]


def pack_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., K] nibbles -> [..., K/2] bytes, element 2i in the low nibble, 2i+1 in the high."""
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] nibbles."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


# -- block scales -------------------------------------------------------------------------

def _nvfp4_block_scales(blocks: torch.Tensor, global_scale: float):
    """blocks: float32 [r, K/B, B] -> (e4m3 scales [r, K/B], float32 decode scale [r, K/B])."""
    block_max = blocks.abs().amax(dim=-1)
    # Clamp: rounding (or a caller's global scale) may push the ideal scale past e4m3's 448.
    scales = (block_max * (global_scale / E2M1_MAX)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    return scales, scales.float() / global_scale


def _mxfp4_block_scales(blocks: torch.Tensor):
    """blocks: float32 [r, K/B, B] -> (e8m0 codes uint8 [r, K/B], exponent int32 [r, K/B])."""
    block_max = blocks.abs().amax(dim=-1)
    _, exponent = torch.frexp(block_max)         # block_max = m * 2^exponent, m in [0.5, 1): exact
    shared = (exponent - 1) - E2M1_EMAX          # floor(log2(block_max)) - emax_elem
    shared = torch.where(block_max > 0, shared, torch.full_like(shared, E8M0_MIN_EXP))
    shared = shared.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return (shared + E8M0_BIAS).to(torch.uint8), shared


def exp2_exact(exponent: torch.Tensor) -> torch.Tensor:
    """float32 2^e for int32 e in [-149, 127], built from the bits so it is exact on any device
    (2^-127, the e8m0 minimum, is a float32 subnormal)."""
    normal = (exponent + 127) << 23
    subnormal = torch.ones_like(exponent) << (exponent + 149).clamp(0, 22)
    return torch.where(exponent >= -126, normal, subnormal).view(torch.float32)


# -- quantize / dequantize ----------------------------------------------------------------

def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The encode scale 448 * 6 / amax(|x|) (1 for an all-zero tensor), float32 scalar."""
    amax = _abs_max(_check_input(x, "nvfp4"))
    value = E4M3_MAX * E2M1_MAX / amax if amax > 0 else 1.0
    return torch.tensor(value, dtype=torch.float32, device=x.device)


def nvfp4_quantize(x: torch.Tensor, global_scale=None) -> QuantizedTensor:
    """NVFP4 of x [..., K]: e2m1 nibbles, e4m3 scales per 16, encode global scale."""
    rows = _check_input(x, "nvfp4")                                    # [R, K]
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    else:
        _abs_max(rows)   # NaN/Inf check even when the caller brings the scale
        global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
        if not (torch.isfinite(global_scale) and global_scale > 0):
            raise ValueError(f"global_scale must be a finite positive number, got {global_scale.item()}")
    gs = global_scale.item()

    def block_scales(blocks):                                               # [r, K/B, B]
        stored, decode_scale = _nvfp4_block_scales(blocks, gs)              # [r, K/B]
        # A zero scale (zero block, or values below e4m3's smallest subnormal) encodes zeros.
        inverse = torch.where(decode_scale > 0, 1.0 / decode_scale, torch.zeros_like(decode_scale))
        return stored, inverse

    packed, scales = _quantize_rows(rows, BLOCK_SIZE["nvfp4"], torch.float8_e4m3fn, block_scales)
    return _quantized(x, packed, scales, global_scale, "nvfp4")


def mxfp4_quantize(x: torch.Tensor) -> QuantizedTensor:
    """MXFP4 (OCP MX v1.0) of x [..., K]: e2m1 nibbles, e8m0 power-of-two scales per 32."""
    rows = _check_input(x, "mxfp4")                                    # [R, K]
    _abs_max(rows)

    def block_scales(blocks):                                               # [r, K/B, B]
        codes, exponent = _mxfp4_block_scales(blocks)                       # [r, K/B]
        # Multiply by 2^-e (exact, a power of two) rather than divide by a subnormal 2^e.
        return codes, exp2_exact(-exponent)

    packed, scales = _quantize_rows(rows, BLOCK_SIZE["mxfp4"], torch.uint8, block_scales)
    return _quantized(x, packed, scales, None, "mxfp4")


def _quantize_rows(rows: torch.Tensor, block: int, scale_dtype: torch.dtype, block_scales):
    """rows [R, K] -> (packed uint8 [R, K/2], stored scales [R, K/B]), a chunk of rows at a time.

    `block_scales(blocks [r, K/B, B])` returns (stored scales [r, K/B], the factor [r, K/B] that
    brings each block into e2m1's range)."""
    n_rows, k = rows.shape
    packed = torch.empty(n_rows, k // 2, dtype=torch.uint8, device=rows.device)
    scales = torch.empty(n_rows, k // block, dtype=scale_dtype, device=rows.device)
    start = 0
    for chunk in _row_chunks(rows):
        blocks = chunk.float().reshape(chunk.shape[0], k // block, block)   # [r, K/B, B]
        stored, factor = block_scales(blocks)
        nibbles = e2m1_encode(blocks * factor.unsqueeze(-1)).reshape(chunk.shape[0], k)
        end = start + chunk.shape[0]
        packed[start:end] = pack_nibbles(nibbles)
        scales[start:end] = stored
        start = end
    return packed, scales


def _quantized(x: torch.Tensor, packed, scales, global_scale, fmt: str) -> QuantizedTensor:
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    return QuantizedTensor(packed.reshape(*lead, k // 2), scales.reshape(*lead, k // BLOCK_SIZE[fmt]),
                           global_scale, fmt, tuple(x.shape))


def quantize(x: torch.Tensor, fmt: str) -> QuantizedTensor:
    return {"nvfp4": nvfp4_quantize, "mxfp4": mxfp4_quantize}[check_fmt(fmt)](x)


def block_decode_scales(q: QuantizedTensor) -> torch.Tensor:
    """float32 [..., K/B]: the factor each block's e2m1 values are multiplied by."""
    if q.fmt == "nvfp4":
        global_scale = q.global_scale.float()
        if global_scale.numel() > 1:  # a stack of experts [E, N, K]: one global scale per expert
            global_scale = global_scale.reshape(-1, *[1] * (q.scales.dim() - 1))
        return q.scales.float() / global_scale
    return exp2_exact(q.scales.to(torch.int32) - E8M0_BIAS)


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """float32 tensor of q.shape on q's device."""
    check_fmt(q.fmt)
    block = q.block_size
    k = q.shape[-1]
    packed_rows = q.packed.reshape(-1, k // 2)                          # [R, K/2]
    scale_rows = block_decode_scales(q).reshape(-1, k // block)         # [R, K/B]
    out = torch.empty(packed_rows.shape[0], k, dtype=torch.float32, device=q.device)
    start = 0
    for chunk in _row_chunks(packed_rows):
        end = start + chunk.shape[0]
        values = e2m1_decode(unpack_nibbles(chunk)).reshape(chunk.shape[0], k // block, block)
        out[start:end] = (values * scale_rows[start:end].unsqueeze(-1)).reshape(chunk.shape[0], k)
        start = end
    return out.reshape(q.shape)


def relative_error(x: torch.Tensor, q: QuantizedTensor) -> float:
    """||dequantize(q) - x||_F / ||x||_F: how much of x the round trip loses."""
    diff = dequantize(q) - x.float()
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(x.float())).item()


# -- 128x4 swizzled scale layout ----------------------------------------------------------
# CUTLASS / FlashInfer / sgl-kernel read block scales in tiles of 128 rows x 4 scale columns.
# Inside a tile, row r = 32*i + j and column c are stored at offset 16*j + 4*i + c:
# the linear [R/128, 4, 32, C/4, 4] view is permuted to [R/128, C/4, 32, 4, 4].

SWIZZLE_ROWS, SWIZZLE_COLS = 128, 4


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] or [E, rows, cols] -> the same rank, rows padded to 128 and cols to 4
    (padding is zero), memory in the 128x4 blocked order."""
    if scales.dim() not in (2, 3):
        raise ValueError(f"swizzle_scales needs [rows, cols] or [experts, rows, cols] scales, "
                         f"got shape {tuple(scales.shape)}")
    dtype = scales.dtype
    raw = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    lead, (rows, cols) = raw.shape[:-2], raw.shape[-2:]
    rows_pad, cols_pad = _round_up(rows, SWIZZLE_ROWS), _round_up(cols, SWIZZLE_COLS)
    padded = torch.nn.functional.pad(raw, (0, cols_pad - cols, 0, rows_pad - rows))
    tiles = padded.reshape(*lead, rows_pad // 128, 4, 32, cols_pad // 4, 4)
    n = len(lead)
    blocked = tiles.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).contiguous()
    blocked = blocked.reshape(*lead, rows_pad, cols_pad)
    return blocked.view(dtype) if raw is not scales else blocked


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of swizzle_scales: [..., rows_padded, cols_padded] (or flat) -> [..., rows, cols]."""
    rows_pad, cols_pad = _round_up(rows, SWIZZLE_ROWS), _round_up(cols, SWIZZLE_COLS)
    tile = rows_pad * cols_pad
    if rows <= 0 or cols <= 0 or swizzled.numel() == 0 or swizzled.numel() % tile:
        raise ValueError(f"swizzled scales of {swizzled.numel()} elements do not hold a whole "
                         f"number of {rows}x{cols} scale matrices (padded {rows_pad}x{cols_pad})")
    dtype = swizzled.dtype
    raw = swizzled.view(torch.uint8) if swizzled.element_size() == 1 else swizzled
    experts = raw.numel() // tile
    lead = (experts,) if swizzled.dim() == 3 or experts > 1 else ()
    tiles = raw.reshape(*lead, rows_pad // 128, cols_pad // 4, 32, 4, 4)
    n = len(lead)
    linear = tiles.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).reshape(*lead, rows_pad, cols_pad)
    linear = linear[..., :rows, :cols].contiguous()
    return linear.view(dtype) if raw is not swizzled else linear
