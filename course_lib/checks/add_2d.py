"""Check for lesson 03: 2-D add over tiles, with any strides."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    case_generator,
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
    "the parts written are what programs cover whose grid axes and tl.program_id axes "
    "disagree. Rows are axis 0: pid_m = tl.program_id(0), "
    "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))"
)
SWAPPED_STRIDES_HINTS = {
    name: f"{name}'s row and column strides are swapped: element (m, n) of {name} is at "
    f"{name}_ptr + m * stride_{name}m + n * stride_{name}n, with stride_{name}m = "
    f"{name}.stride(0) and stride_{name}n = {name}.stride(1)"
    for name in ("x", "y")
}
# tiles a learner may choose, for the grid's coverage to be worked out: 1 to 1024 a side
_TILE_SIDES = [1 << p for p in range(11)]


def layouts(m: int, n: int, generator: torch.Generator, dtype) -> dict[str, torch.Tensor]:
    """Seeded [m, n] inputs: contiguous, a transposed view, and a slice with steps."""

    def rand(*shape):
        return random_input(generator, shape, dtype, scale=4, shift=0.5)

    return {
        "contiguous": rand(m, n),
        "transposed": rand(n, m).t(),
        "strided": rand(2 * m, 3 * n)[::2, ::3],
    }


def tile_shapes() -> list[tuple[tuple[int, int], str]]:
    """The [M, N] shapes lesson 03's checks try, each with why it is there."""
    return [
        ((1, runtime.by_mode(gpu=100_003, interpreter=1000)), "one row"),
        ((runtime.by_mode(gpu=100_003, interpreter=1000), 1), "one column"),
        ((37, 61), "smaller than a tile"),
        ((130, 257), "not a multiple of the tile"),
        ((64, 64), "square"),
        ((runtime.by_mode(gpu=4099, interpreter=700), 33), "tall"),
        ((33, runtime.by_mode(gpu=4099, interpreter=700)), "wide"),
        (
            (runtime.by_mode(gpu=1023, interpreter=97), runtime.by_mode(gpu=2049, interpreter=203)),
            "many tiles",
        ),
    ]


def _cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases = []
    for (m, n), why in tile_shapes():
        x, y = (layouts(m, n, generator, torch.float32)["contiguous"] for _ in range(2))
        cases.append(Case(f"{m}x{n} ({why}), float32", (x, y), "contiguous"))
    for layout in ("transposed", "strided"):
        for mix in ("x", "both"):
            x = layouts(130, 257, generator, torch.float32)[layout]
            y = layouts(130, 257, generator, torch.float32)[
                layout if mix == "both" else "contiguous"
            ]
            which = "x" if mix == "x" else "x and y"
            cases.append(Case(f"130x257, {which} {layout}, float32", (x, y), layout))
    for dtype in runtime.DTYPES[1:]:
        x, y = (layouts(130, 257, generator, dtype)["contiguous"] for _ in range(2))
        label = f"130x257 (not a multiple of the tile), {str(dtype).removeprefix('torch.')}"
        cases.append(Case(label, (x, y), "contiguous"))
        x = layouts(130, 257, generator, dtype)["transposed"]
        cases.append(
            Case(
                f"130x257, x transposed, {str(dtype).removeprefix('torch.')}", (x, y), "transposed"
            )
        )
    return cases


def refine_tiles(
    cases: Sequence[Case],
    results: list[CaseResult],
    *,
    hints: Hints,
    strides_hint: str,
    square_hints: Collection[str],
    crossed_hint: str = SWAPPED_HINT,
    transposed: bool = False,
) -> None:
    """Hints that only a comparison of cases reveals, for a check of a kernel on tiles.

    `strides_hint` is shown where contiguous inputs pass and the others fail;
    `square_hints` are those a square case proves for every case; `transposed` says
    the output is [N, M], its rows the columns of the input.
    """
    contiguous = [r for c, r in zip(cases, results) if c.kind == "contiguous"]
    crossed = _axes_crossed(cases, results, transposed)
    # swapped strides read far outside a non-square input, which alone looks like a
    # missing mask; where a square case names the swap, say so for all of them
    swap = next((r.hint for r in results if r.hint in square_hints), None)
    for case, result in zip(cases, results):
        if result.passed:
            continue
        if swap is not None and result.hint in (
            hints.out_of_bounds,
            hints.read_past_end,
            hints.wrong_values,
        ):
            result.hint = swap
        elif result.hint == hints.not_contiguous:
            continue  # right values in the wrong layout: nothing to do with the strides read
        elif case.kind != "contiguous" and all(r.passed for r in contiguous):
            result.hint = strides_hint
        elif crossed and result.written_extent is not None:
            result.hint = crossed_hint


def _axes_crossed(cases: Sequence[Case], results: list[CaseResult], transposed: bool) -> bool:
    """Whether the rows and columns of the input written in every case are those that a
    grid of (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) programs covers when each takes its row
    tile from axis 1 and its column tile from axis 0, for one choice of tiles. For a
    transpose, also those of a grid over the output's shape, (cdiv(N, BLOCK_M),
    cdiv(M, BLOCK_N)), with the row tile from axis 0."""
    seen = []
    for case, result in zip(cases, results):
        m, n = case.inputs[0].shape
        if result.passed:
            seen.append((m, n, (m, n)))
        elif result.written_extent is not None:
            rows, cols = result.written_extent
            seen.append((m, n, (cols, rows) if transposed else (rows, cols)))
    if all(extent == (m, n) for m, n, extent in seen):
        return False
    # pid_m runs over cdiv(N, a) programs and pid_n over cdiv(M, b): crossed axes give
    # (a, b) = (BLOCK_N, BLOCK_M), a transpose's grid over its output (BLOCK_M, BLOCK_N)
    return any(
        all(extent == (min(m, -(-n // a) * bm), min(n, -(-m // b) * bn)) for m, n, extent in seen)
        for bm in _TILE_SIDES
        for bn in _TILE_SIDES
        for a, b in ([(bn, bm), (bm, bn)] if transposed else [(bn, bm)])
    )


def as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """[M, N] `t`'s memory read as if it were contiguous: what a kernel ignoring strides sees."""
    return t.as_strided(t.shape, (t.shape[1], 1))


_refine = functools.partial(
    refine_tiles,
    hints=HINTS,
    strides_hint=STRIDES_HINT,
    square_hints=SWAPPED_STRIDES_HINTS.values(),
)


def check_add_2d(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x, y)`, your launcher for lesson 03, against x + y on [M, N] matrices."""
    mistakes = [
        KnownMistake(
            lambda x, y: as_if_contiguous(x) + as_if_contiguous(y),
            STRIDES_HINT.split(": ", 1)[1],
        ),
        # on a square matrix, swapped strides read the transpose
        KnownMistake(lambda x, y: x.t() + y, SWAPPED_STRIDES_HINTS["x"]),
        KnownMistake(lambda x, y: x + y.t(), SWAPPED_STRIDES_HINTS["y"]),
        KnownMistake(lambda x, y: x - y, "you subtract: the kernel should compute x + y"),
        KnownMistake(lambda x, y: x + x, "you add x to itself: load y through y_ptr"),
    ]
    return run_check(
        "add_2d", fn, _cases(seed=3), references.add_2d, mistakes, HINTS, _refine,
        contiguous_output=True,
    )  # fmt: skip
