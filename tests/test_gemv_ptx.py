"""The gemv kernel's inline PTX, run on the CPU by a small interpreter of the instructions it uses.

Triton's CPU interpreter cannot run inline assembly, so the interpreter tests of the gemv kernel
run its plain-Triton path; here the PTX text itself (`ELEMENT_ASM`, `BIAS_ASM`) is executed
instruction by instruction, with bf16 rounding to nearest even, and compared with float64 sums of
the decoded weights times the activations: every code in both nibbles, both halves' scales, and
the accumulator carried through.
"""

import re
import struct

import pytest
import torch

from fp4lab import formats
from fp4lab.backends.triton_gemv_kernel import BIAS_ASM, ELEMENT_ASM
from fp4lab.backends.triton_w4a16_kernel import WEIGHT_SHIFT

MASK32 = 0xFFFFFFFF


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & MASK32))[0]


def bf16_bits(value: float) -> int:
    """float -> bf16 bits, rounded to nearest even (what the GPU's .rn does)."""
    return int(torch.tensor([value], dtype=torch.float64).to(torch.bfloat16)
               .view(torch.int16).item()) & 0xFFFF


def bf16(bits: int) -> float:
    return f32((bits & 0xFFFF) << 16)


def lanes(value: int) -> tuple[int, int]:
    return value & 0xFFFF, (value >> 16) & 0xFFFF


def bf16x2(op: str, a: int, b: int, c: int = 0) -> int:
    out = []
    for x, y, z in zip(lanes(a), lanes(b), lanes(c)):
        exact = bf16(x) * bf16(y) + (bf16(z) if op == "fma" else 0.0)   # float64: exact here
        out.append(bf16_bits(exact))
    return out[0] | out[1] << 16


def run_ptx(text: str, operands: dict[int, int]) -> dict[int, int]:
    """Execute `text` (the subset of PTX the gemv kernel's asm uses) on 32/64-bit integers;
    operands $N in and out by number."""
    regs: dict[str, int] = {}

    def value(token: str) -> int:
        token = token.strip()
        if token.startswith("$"):
            return operands[int(token[1:])]
        if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", token):
            return int(token, 0)
        return regs[token]

    def store(dest: str, result: int) -> None:
        if dest.startswith("$"):
            operands[int(dest[1:])] = result
        else:
            regs[dest] = result

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith((".reg", "//")):
            continue
        op, rest = line.split(None, 1)
        split = re.fullmatch(r"\{(\w+), (\w+)\}, (\S+)", rest)
        join = re.fullmatch(r"(\S+), \{(\w+), (\w+)\}", rest)
        if op == "mov.b64" and split:
            whole = value(split.group(3))
            regs[split.group(1)], regs[split.group(2)] = whole & MASK32, whole >> 32
            continue
        if op == "mov.b64" and join:
            store(join.group(1), regs[join.group(2)] | regs[join.group(3)] << 32)
            continue
        dest, *sources = [part.strip() for part in rest.split(",")]
        args = [value(s) for s in sources]
        if op in ("mov.b32", "mov.f32"):
            result = args[0]
        elif op == "and.b32":
            result = args[0] & args[1]
        elif op == "shl.b32":
            result = (args[0] << args[1]) & MASK32
        elif op == "mul.lo.u32":
            result = (args[0] * args[1]) & MASK32
        elif op == "prmt.b32":   # default mode: each selector nibble picks a byte of {b, a}
            pool = struct.pack("<II", args[0], args[1])
            result = sum(pool[(args[2] >> 4 * i) & 7] << 8 * i for i in range(4))
        elif op == "mul.rn.bf16x2":
            result = bf16x2("mul", args[0], args[1])
        elif op == "fma.rn.bf16x2":
            result = bf16x2("fma", *args)
        elif op == "add.f32":
            result = f32_bits(f32(args[0]) + f32(args[1]))
        elif op == "fma.rn.f32":
            result = f32_bits(f32(args[0]) * f32(args[1]) + f32(args[2]))
        else:
            raise AssertionError(f"the PTX interpreter does not know {op!r}")
        store(dest, result)
    return operands


def activation_words(values: list[float]) -> list[int]:
    """16 activations -> 4 int64 words of 4 bf16, each times 2^SCALE_EXP by BIAS_ASM."""
    words = []
    for q in range(4):
        word = sum(bf16_bits(values[4 * q + r]) << 16 * r for r in range(4))
        words.append(run_ptx(BIAS_ASM.value, {0: 0, 1: word})[0])
    return words


def e2m1(code: int) -> float:
    return float(formats.E2M1_VALUES[code & 0x7]) * (-1.0 if code & 0x8 else 1.0)


def element(codes: list[int], x_lo: list[float], x_hi: list[float], s_lo: float, s_hi: float,
            acc: float) -> tuple[float, float]:
    """(the asm's result, the float64 value it approximates) for one 16-byte element."""
    w_a = sum(codes[i] << 8 * i for i in range(8))
    w_b = sum(codes[8 + i] << 8 * i for i in range(8))
    operands = {0: 0, 1: w_a, 2: w_b, 11: f32_bits(s_lo), 12: f32_bits(s_hi), 13: f32_bits(acc)}
    operands.update(zip(range(3, 7), activation_words(x_lo)))
    operands.update(zip(range(7, 11), activation_words(x_hi)))
    got = f32(run_ptx(ELEMENT_ASM.value, operands)[0])
    exact = acc + 2.0**-WEIGHT_SHIFT * (
        s_lo * sum(e2m1(c & 0xF) * x for c, x in zip(codes, x_lo))
        + s_hi * sum(e2m1(c >> 4) * x for c, x in zip(codes, x_hi)))
    return got, exact


def bf16_values(gen: torch.Generator, n: int) -> list[float]:
    return torch.randn(n, generator=gen).to(torch.bfloat16).double().tolist()


def test_every_code_in_either_nibble_decodes_to_its_e2m1_value():
    """One weight at a time (all other activations zero), exact: the bf16 products of an e2m1
    code and a bf16 activation of few significant bits round to nothing."""
    for code in range(16):
        for byte in (0, 5, 10, 15):                       # each 32-bit word, both byte lanes
            for half in ("lo", "hi"):
                codes = [0] * 16
                codes[byte] = code if half == "lo" else code << 4
                x = [0.0] * 16
                x[byte] = 1.5
                zeros = [0.0] * 16
                got, exact = element(codes, x if half == "lo" else zeros,
                                     zeros if half == "lo" else x, 0.25, 4.0, 0.0)
                assert got == exact, (code, byte, half, got, exact)


@pytest.mark.parametrize("seed", range(4))
def test_an_element_matches_the_float64_sum_within_bf16_chain_rounding(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(25):
        codes = torch.randint(0, 256, (16,), generator=gen).tolist()
        x_lo, x_hi = bf16_values(gen, 16), bf16_values(gen, 16)
        s_lo, s_hi = 448.0 * 2.0**-seed, 2.0**-9 * (seed + 1)
        magnitude = 2.0**-WEIGHT_SHIFT * (
            s_lo * sum(abs(e2m1(c & 0xF) * x) for c, x in zip(codes, x_lo))
            + s_hi * sum(abs(e2m1(c >> 4) * x) for c, x in zip(codes, x_hi)))
        acc = magnitude * 0.5
        got, exact = element(codes, x_lo, x_hi, s_lo, s_hi, acc)
        # 8 bf16 roundings per chain, each <= 2^-9 of the partial sum so far
        assert abs(got - exact) <= 8 * 2.0**-9 * (magnitude + acc), (codes, got, exact)


def test_the_activation_bias_is_exact():
    for value in (1.0, -3.25, 2.0**-90, 1e4):
        (word,) = activation_words([value] * 4 + [0.0] * 12)[:1]
        assert bf16(word & 0xFFFF) == bf16(bf16_bits(value)) * 2.0**100
