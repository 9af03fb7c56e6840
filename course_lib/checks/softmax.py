"""Check for lesson 04: row-wise softmax."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from course_lib import references, runtime
from course_lib.checks.engine import Case, CheckResult, Hints, KnownMistake, random_input, run_check

HINTS = Hints(
    out_of_bounds=(
        "the kernel wrote past the end of the output: mask the columns, "
        "mask = col_offsets < n_cols, in tl.load (with other=-float('inf')) and in tl.store, "
        "and pass the output's own row stride, out.stride(0)"
    ),
    missing_columns=(
        "your block is shorter than the row, so the rest of each row is never written and the "
        "softmax covers only its start. Use BLOCK_SIZE = triton.next_power_of_2(n_cols), "
        "or loop over the row in blocks"
    ),
    missing_rows="launch one program per row: grid = (n_rows,)",
    grid_too_small="launch one program per row: grid = (n_rows,)",
    nothing_written="did the kernel store the row? Check tl.store's pointer and the grid",
)


def _zero_padded(x: torch.Tensor) -> torch.Tensor:
    """Softmax as a kernel computes it when the padded lanes load 0 instead of -inf."""
    n = x.shape[1]
    padded = torch.nn.functional.pad(x.float(), (0, triton.next_power_of_2(n) - n), value=0.0)
    return torch.softmax(padded, dim=1)[:, :n]


def _unstable(x: torch.Tensor) -> torch.Tensor:
    numerator = torch.exp(x.float())
    return numerator / numerator.sum(dim=1, keepdim=True)


MISTAKES = [
    KnownMistake(
        _zero_padded,
        "padded lanes count as 0 in the max and add exp(0 - max) to the sum: "
        "load with other=-float('inf') so they vanish",
    ),
    KnownMistake(
        _unstable,
        "exp overflows to inf on large inputs (inf / inf = NaN): subtract the row max "
        "before tl.exp",
    ),
    KnownMistake(
        lambda x: torch.softmax(x, dim=0),
        "you normalised over columns (axis 0); softmax here is over each row",
    ),
    KnownMistake(
        lambda x: torch.softmax(x.as_strided(x.shape, (x.shape[1], 1)), dim=1),
        "rows are x.stride(0) elements apart, which can be more than n_cols: pass "
        "x.stride(0) to the kernel and use row * stride for the row's start",
    ),
]


def _cases(seed: int) -> list[Case]:
    generator = torch.Generator().manual_seed(seed)

    def rand(m, n, scale=3.0, dtype=torch.float32):
        return random_input(generator, (m, n), dtype, scale=scale)

    wide = runtime.by_mode(gpu=12_345, interpreter=3001)
    cases = [
        Case("1x1 (one element), float32", (rand(1, 1),)),
        Case("5x1 (one column), float32", (rand(5, 1),)),
        Case("1x781 (one row), float32", (rand(1, 781),)),
        Case("37x781 (row not a power of two), float32", (rand(37, 781),)),
        Case("16x1024 (rows wider than 256), float32", (rand(16, 1024),)),
        Case(f"9x{wide} (wide rows), float32", (rand(9, wide),)),
        Case("8x1000 (values up to ±1e4), float32", (rand(8, 1000, scale=3e3),)),
    ]
    with_inf = rand(7, 300)
    with_inf[torch.rand(7, 300, generator=generator).to(with_inf.device) < 0.2] = float("-inf")
    with_inf[3] = float("-inf")  # a row of all -inf: torch gives NaN, and so must you
    cases.append(Case("7x300 (-inf entries, one row all -inf), float32", (with_inf,)))
    wider = rand(20, 900)
    cases.append(Case("20x781 (row stride 900), float32", (wider[:, :781],)))
    for dtype in runtime.DTYPES[1:]:
        name = str(dtype).removeprefix("torch.")
        cases.append(
            Case(f"37x781 (row not a power of two), {name}", (rand(37, 781, dtype=dtype),))
        )
        cases.append(Case(f"16x1024 (rows wider than 256), {name}", (rand(16, 1024, dtype=dtype),)))
    return cases


def check_softmax(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x)`, your launcher for lesson 04, against torch.softmax(x, dim=-1)."""
    return run_check("softmax", fn, _cases(seed=4), references.softmax, MISTAKES, HINTS)
