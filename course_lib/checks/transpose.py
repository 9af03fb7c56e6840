"""Check for lesson 03's second exercise: a tiled transpose, from any strides to contiguous."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from course_lib import references, runtime
from course_lib.checks import add_2d
from course_lib.checks.engine import Case, CheckResult, KnownMistake, case_generator, run_check

HINTS = dataclasses.replace(
    add_2d.HINTS,
    # the output's rows are x's columns: a grid short on one axis leaves the other unwritten
    missing_rows=(
        "the output's last rows, which are x's last columns, are never written: the grid "
        "misses x's edge column tiles. Launch triton.cdiv(N, BLOCK_N) programs on axis 1"
    ),
    missing_columns=(
        "the output's last columns, which are x's last rows, are never written: the grid "
        "misses x's edge row tiles. Launch triton.cdiv(M, BLOCK_M) programs on axis 0"
    ),
    not_contiguous=(
        "return a contiguous [N, M] tensor: allocate it with torch.empty((N, M), "
        "dtype=x.dtype, device=x.device). A transposed allocation such as "
        "torch.empty((M, N)).t() has the right shape but not the layout, and "
        "torch.empty_like(x) copies x's shape and strides"
    ),
    returned_input=(
        "return a new tensor: x.t() and x.T are views that share x's memory and copy "
        "nothing. Allocate out = torch.empty((N, M), dtype=x.dtype, device=x.device), "
        "let your kernel fill it, and return it"
    ),
)
STRIDES_HINT = (
    "contiguous inputs pass but this one does not: your kernel assumes x is contiguous. "
    "Read element (m, n) at x_ptr + m * stride_xm + n * stride_xn, passing x.stride(0) "
    "and x.stride(1) to the kernel"
)
# what a square x shows when either side is addressed without swapping m and n
NOT_TRANSPOSED_HINT = (
    "on the square case your output equals x itself: nothing was transposed. Either x is "
    "read with its strides swapped or the store keeps m and n in x's places: read element "
    "(m, n) at x_ptr + m * stride_xm + n * stride_xn and store it at row n, column m of "
    "out, out_ptr + n * stride_on + m * stride_om"
)
IN_X_ORDER_HINT = (
    "your output is x.reshape(N, M): x's elements in x's own order, as if element (m, n) "
    "were stored at m * N + n. It belongs at row n, column m of out: out_ptr + "
    "n * stride_on + m * stride_om, with stride_on, stride_om = out.stride(0), out.stride(1)"
)
CROSSED_HINT = (
    "the parts written are what programs cover when the grid follows the output's shape "
    "[N, M], or when its axes and tl.program_id's disagree. The grid follows x: "
    "grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N)) with M, N = x.shape, "
    "pid_m = tl.program_id(0), pid_n = tl.program_id(1)"
)


def _cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases = []
    for (m, n), why in add_2d.tile_shapes():
        x = add_2d.layouts(m, n, generator, torch.float32)["contiguous"]
        cases.append(Case(f"{m}x{n} ({why}), float32", (x,), "contiguous"))
    for (m, n), why, layout in [
        ((130, 257), "", "transposed"),
        ((130, 257), "", "strided"),
        ((37, 61), " (smaller than a tile)", "strided"),
    ]:
        x = add_2d.layouts(m, n, generator, torch.float32)[layout]
        cases.append(Case(f"{m}x{n}{why}, x {layout}, float32", (x,), layout))
    for dtype in runtime.DTYPES[1:]:
        name = str(dtype).removeprefix("torch.")
        for layout in ("contiguous", "transposed"):
            x = add_2d.layouts(130, 257, generator, dtype)[layout]
            cases.append(Case(f"130x257, x {layout}, {name}", (x,), layout))
    return cases


def check_transpose(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x)`, your tiled transpose from lesson 03: x [M, N] of any strides in,
    a new contiguous [N, M] tensor equal to x.T out."""
    mistakes = [
        KnownMistake(lambda x: add_2d.as_if_contiguous(x).t(), STRIDES_HINT.split(": ", 1)[1]),
        # x itself has the output's shape only where x is square
        KnownMistake(lambda x: x, NOT_TRANSPOSED_HINT),
        KnownMistake(lambda x: x.reshape(x.shape[1], x.shape[0]), IN_X_ORDER_HINT),
    ]
    refine = functools.partial(
        add_2d.refine_tiles,
        hints=HINTS,
        strides_hint=STRIDES_HINT,
        square_hints={NOT_TRANSPOSED_HINT},
        crossed_hint=CROSSED_HINT,
        transposed=True,
    )
    return run_check(
        "transpose", fn, _cases(seed=4), references.transpose, mistakes, HINTS, refine,
        contiguous_output=True,
    )  # fmt: skip
