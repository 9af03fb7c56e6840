"""Check for lesson 05: tiled matrix multiplication."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    random_input,
    run_check,
)

HINTS = Hints(
    out_of_bounds=(
        "the edge tiles of C overhang: mask the store, "
        "mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"
    ),
    read_past_end=(
        "NaN where the reference is finite: the last step of the K loop read past the end of "
        "A or B (the memory around them holds NaN during a check). Mask the K dimension: "
        "offs_k < K - k * BLOCK_K in both loads, with other=0.0"
    ),
    nothing_written="did the kernel store its tile of C? Check tl.store's pointers and the grid",
    grid_too_small=(
        "the grid misses tiles of C: launch triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N) "
        "programs"
    ),
    missing_rows="the grid misses the last row tiles of C: triton.cdiv(M, BLOCK_M) of them",
    missing_columns="the grid misses the last column tiles of C: triton.cdiv(N, BLOCK_N) of them",
    dtype=(
        "C must have the inputs' dtype: allocate it with a.dtype and store "
        "acc.to(c_ptr.dtype.element_ty)"
    ),
)
FP16_ACCUMULATION_HINT = (
    "close but not close enough, in half precision only: accumulate in float32, "
    "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), and cast once when you store"
)


def _swap(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided(t.shape, (t.stride(1), t.stride(0)))


def _not_advanced(block_k: int):
    """What a K loop computes when its pointers stay on the first K tile."""

    def compute(a, b):
        k = a.shape[1]
        out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
        for start in range(0, k, block_k):
            width = min(block_k, k - start)
            out += a[:, :width].double() @ b[:width, :].double()
        return out

    return compute


MISTAKES = [
    KnownMistake(
        lambda a, b: _swap(a) @ b,
        "A's strides are swapped: A[m, k] is at a_ptr + m * stride_am + k * stride_ak",
    ),  # fmt: skip
    KnownMistake(
        lambda a, b: a @ _swap(b),
        "B's strides are swapped: B[k, n] is at b_ptr + k * stride_bk + n * stride_bn",
    ),  # fmt: skip
    *[
        KnownMistake(
            _not_advanced(block_k),
            "every step of your K loop multiplies the first K tile again: advance the "
            "pointers, a_ptrs += BLOCK_K * stride_ak and b_ptrs += BLOCK_K * stride_bk",
        )
        for block_k in (16, 32, 64, 128)
    ],
]


def _cases(seed: int) -> list[Case]:
    generator = torch.Generator().manual_seed(seed)

    def rand(rows, cols, dtype, transposed=False):
        shape = (cols, rows) if transposed else (rows, cols)
        t = random_input(generator, shape, dtype)
        return t.t() if transposed else t

    def case(m, n, k, why, dtype=torch.float32, ta=False, tb=False, kind="contiguous"):
        a, b = rand(m, k, dtype, ta), rand(k, n, dtype, tb)
        name = str(dtype).removeprefix("torch.")
        tolerance = "tf32" if dtype == torch.float32 and runtime.MODE == "gpu" else None
        return Case(f"{m}x{n}x{k} ({why}), {name}", (a, b), kind, tolerance, math.sqrt(k))

    big = runtime.by_mode(gpu=(1000, 3000, 777), interpreter=(130, 100, 77))
    cases = [
        case(1, 1, 1, "all ones"),
        case(1, 37, 17, "M = 1"),
        case(37, 1, 23, "N = 1"),
        case(29, 31, 1, "K = 1"),
        case(61, 67, 71, "primes"),
        case(45, 53, 7, "K smaller than a K tile"),
        case(96, 96, 96, "square"),
        case(*big, "no dimension a multiple of a tile"),
        case(61, 67, 71, "A transposed", ta=True, kind="transposed"),
        case(61, 67, 71, "B transposed", tb=True, kind="transposed"),
        case(96, 96, 96, "A and B transposed", ta=True, tb=True, kind="transposed"),
    ]
    long_k = runtime.by_mode(gpu=4099, interpreter=2051)
    for dtype in runtime.DTYPES[1:]:
        cases.append(case(61, 67, 71, "primes", dtype))
        cases.append(case(40, 48, long_k, "long K", dtype))
        cases.append(case(61, 67, 71, "B transposed", dtype, tb=True, kind="transposed"))
    return cases


STRIDE_HINTS = {m.hint for m in MISTAKES[:2]}


def _refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """Hints that only a comparison of cases reveals."""
    full = [r for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32]
    # swapped strides also read far outside A or B on non-square shapes, which alone
    # would look like a missing K mask; where a square case names the swap, say so
    swap = next((r.hint for r in results if r.hint in STRIDE_HINTS), None)
    for case, result in zip(cases, results):
        half = case.inputs[0].dtype in (torch.float16, torch.bfloat16)
        close = result.relative_error is not None and result.relative_error < 1e-2
        if half and close and all(r.passed for r in full):
            result.hint = FP16_ACCUMULATION_HINT
        elif swap and result.hint in (HINTS.read_past_end, HINTS.wrong_values):
            result.hint = swap


def check_matmul(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(a, b)`, your launcher for lesson 05, against a @ b computed in float64."""
    return run_check("matmul", fn, _cases(seed=5), references.matmul, MISTAKES, HINTS, _refine)
