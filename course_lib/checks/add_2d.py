"""Check for lesson 03: 2-D add over tiles, with any strides."""

from __future__ import annotations

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
        "an edge tile overhangs the matrix: mask both dimensions, "
        "mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"
    ),
    nothing_written="did the kernel store its tile? Check tl.store's pointers and the grid",
    grid_too_small=(
        "the grid misses the edge tiles: launch "
        "(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N)) programs"
    ),
    scattered=(
        "tiles are missing inside the matrix: offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M), "
        "and the same for offs_n with pid_n"
    ),
)
STRIDES_HINT = (
    "contiguous inputs pass but this one does not: your kernel assumes contiguous memory. "
    "Address element (m, n) as x_ptr + m * stride_xm + n * stride_xn, "
    "passing x.stride(0), x.stride(1) (and y's, and out's) to the kernel"
)
SWAPPED_HINT = (
    "some shapes are covered and others are not: the grid's axes and "
    "tl.program_id's axes disagree. Rows are axis 0: pid_m = tl.program_id(0), "
    "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))"
)


def _layouts(m: int, n: int, generator: torch.Generator, dtype) -> dict[str, torch.Tensor]:
    def rand(*shape):
        return random_input(generator, shape, dtype, scale=4, shift=0.5)

    return {
        "contiguous": rand(m, n),
        "transposed": rand(n, m).t(),
        "strided": rand(2 * m, 3 * n)[::2, ::3],
    }


def _cases(seed: int) -> list[Case]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [
        ((1, runtime.by_mode(gpu=100_003, interpreter=1000)), "one row"),
        ((runtime.by_mode(gpu=100_003, interpreter=1000), 1), "one column"),
        ((37, 61), "smaller than a tile"),
        ((130, 257), "not a multiple of the tile"),
        ((runtime.by_mode(gpu=4099, interpreter=700), 33), "tall"),
        ((33, runtime.by_mode(gpu=4099, interpreter=700)), "wide"),
        (
            (runtime.by_mode(gpu=1023, interpreter=97), runtime.by_mode(gpu=2049, interpreter=203)),
            "many tiles",
        ),
    ]
    cases = []
    for (m, n), why in shapes:
        x, y = (_layouts(m, n, generator, torch.float32)["contiguous"] for _ in range(2))
        cases.append(Case(f"{m}x{n} ({why}), float32", (x, y), "contiguous"))
    for layout in ("transposed", "strided"):
        for mix in ("x", "both"):
            x = _layouts(130, 257, generator, torch.float32)[layout]
            y = _layouts(130, 257, generator, torch.float32)[
                layout if mix == "both" else "contiguous"
            ]
            which = "x" if mix == "x" else "x and y"
            cases.append(Case(f"130x257, {which} {layout}, float32", (x, y), layout))
    for dtype in runtime.DTYPES[1:]:
        x, y = (_layouts(130, 257, generator, dtype)["contiguous"] for _ in range(2))
        label = f"130x257 (not a multiple of the tile), {str(dtype).removeprefix('torch.')}"
        cases.append(Case(label, (x, y), "contiguous"))
        x = _layouts(130, 257, generator, dtype)["transposed"]
        cases.append(
            Case(
                f"130x257, x transposed, {str(dtype).removeprefix('torch.')}", (x, y), "transposed"
            )
        )
    return cases


def _refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """Hints that only a comparison of cases reveals."""
    contiguous = [r for c, r in zip(cases, results) if c.kind == "contiguous"]
    for case, result in zip(cases, results):
        if result.passed:
            continue
        if case.kind != "contiguous" and all(r.passed for r in contiguous):
            result.hint = STRIDES_HINT
        elif any(r.passed for r in contiguous) and any(
            "rows written" in p or "columns written" in p for p in result.problems
        ):
            # the grid covers some shapes fully and others not: its axes are crossed
            result.hint = SWAPPED_HINT


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided(t.shape, (t.shape[1], 1))


def check_add_2d(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x, y)`, your launcher for lesson 03, against x + y on [M, N] matrices."""
    mistakes = [
        KnownMistake(
            lambda x, y: _as_if_contiguous(x) + _as_if_contiguous(y),
            STRIDES_HINT.split(": ", 1)[1],
        ),
        KnownMistake(lambda x, y: x - y, "you subtract: the kernel should compute x + y"),
        KnownMistake(lambda x, y: x + x, "you add x to itself: load y through y_ptr"),
    ]
    return run_check("add_2d", fn, _cases(seed=3), references.add_2d, mistakes, HINTS, _refine)
