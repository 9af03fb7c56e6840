"""Checks for lesson 04: row-wise softmax, one block per row, looped over blocks, persistent."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence

import torch
import triton

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
from course_lib.checks.guard import is_poison

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
    stops_short_2d=(
        "every row stops being written at the same column: the stores must reach all n_cols "
        "columns. Check the column offsets and the store's mask"
    ),
    scattered=(
        "elements inside the rows were never written: check the store's pointer, its offsets "
        "and its mask, and that every row has a program"
    ),
)
HALF_PRECISION_HINT = (
    "the float32 cases pass and this float16 one does not: your kernel computes in float16, "
    "whose largest value is 65504, and this row's sum of exponentials is larger. Convert "
    "after loading, x = x.to(tl.float32), and back only when storing, "
    "out.to(out_ptr.dtype.element_ty)"
)


def _half_precision(x: torch.Tensor) -> torch.Tensor:
    """The softmax of a kernel that keeps the exponentials, and so their sum, in float16:
    past 65504 the sum is inf, and every output 0."""
    if x.dtype != torch.float16:
        raise ValueError("only float16 inputs are computed differently")
    numerator = torch.exp(x - x.max(dim=1, keepdim=True).values)
    return numerator / numerator.float().sum(dim=1, keepdim=True).half()


def _zero_padded(x: torch.Tensor) -> torch.Tensor:
    """Softmax as a kernel computes it when the padded lanes load 0 instead of -inf."""
    n = x.shape[1]
    padded = torch.nn.functional.pad(x.float(), (0, triton.next_power_of_2(n) - n), value=0.0)
    return torch.softmax(padded, dim=1)[:, :n]


def _unstable(x: torch.Tensor) -> torch.Tensor:
    numerator = torch.exp(x.float())
    return numerator / numerator.sum(dim=1, keepdim=True)


def _whole_tensor_mask(x: torch.Tensor) -> torch.Tensor:
    """Softmax as a kernel computes it whose mask is offsets < n_rows * n_cols: row r's block
    of next_power_of_2(n_cols) lanes runs on into the rows after it, up to the tensor's end."""
    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    flat = torch.nn.functional.pad(x.float().reshape(-1), (0, block), value=-float("inf"))
    windows = flat.as_strided((n_rows, block), (n_cols, 1))  # what each program loads
    row_max = windows.max(dim=1, keepdim=True).values
    row_sum = torch.exp(windows - row_max).sum(dim=1, keepdim=True)
    return torch.exp(x.float() - row_max) / row_sum


MISTAKES = [
    # first: on the row that overflows float16, every output is below float16's atol, so
    # the other mistakes' outputs would pass for this one's zeros
    KnownMistake(_half_precision, HALF_PRECISION_HINT),
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
    KnownMistake(
        _whole_tensor_mask,
        "each row's block ran on into the next row, so its max and sum took in the next "
        "row's first values: the mask compares the offsets with the whole tensor's size "
        "(n_rows * n_cols). Mask against the row instead: mask = col_offsets < n_cols",
    ),
]


def _cases(seed: int) -> list[Case]:
    generator = case_generator(seed)

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
    # 70,001 scores close together: their exponentials sum to about 67,000, past float16's
    # largest value, so a kernel that sums in float16 gets inf, and 0 for every output.
    # Its block of 131,072 is costly to compile (for some wrong masks, minutes on a GPU), and
    # its hint assumes the rest pass: it runs last, and only then.
    close = rand(1, 70_001, scale=0.01, dtype=torch.float16)
    cases.append(
        Case("1x70001 (row sum past float16's 65504), float16", (close,), after_the_rest=True)
    )
    return cases


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _refine(
    cases: Sequence[Case], results: list[CaseResult], *, prefix_hint: str = HINTS.missing_columns
) -> None:
    """Hints that need more than one case, or the shape of what was written.

    Every row written up to the same power-of-two column is one block stored per row:
    `prefix_hint` says why. The float16 hint stands only where the float32 cases pass.
    """
    float32_ok = all(r.passed for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32)
    for case, result in zip(cases, results):
        n_rows, n_cols = case.inputs[0].shape
        extent = result.written_extent
        if extent is not None and extent[0] == n_rows and _is_power_of_two(extent[1]):
            result.hint = prefix_hint
        if result.hint == HALF_PRECISION_HINT and not float32_ok:
            result.hint = HINTS.wrong_values


def check_softmax(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x)`, your launcher for lesson 04, against torch.softmax(x, dim=-1)."""
    return run_check(
        "softmax", fn, _cases(seed=4), references.softmax, MISTAKES, HINTS, refine=_refine
    )


def _takes(fn: Callable, parameter: str, check: str, call: str) -> None:
    """Raise a clear TypeError unless `fn` can be called with `parameter` by name."""
    if not callable(fn):
        raise TypeError(f"{check} expects your launcher function, got {type(fn).__name__}")
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if parameter not in parameters and not takes_any:
        raise TypeError(f"{check} calls your launcher as {call}: give it a {parameter} parameter")


# --- rows wider than one block: the online softmax ----------------------------------------

LOOP_BLOCK = 256  # the BLOCK_SIZE the looped check asks for: most rows take several blocks
LOOP_STORE_HINT = (
    "each row was written only up to one block's width: the stores never moved past the "
    "first block. In the second loop, offset each block's columns by the loop variable, "
    "cols = start + tl.arange(0, BLOCK_SIZE)"
)


def _online(
    x: torch.Tensor, *, rescale: bool = True, guard: bool = True, one_pass: bool = False
) -> torch.Tensor:
    """The looped kernel's steps in PyTorch, blocks of LOOP_BLOCK columns, so that one step
    done wrong can be replayed exactly: `rescale` the running sum when the max grows,
    `guard` the shift while the max is -inf, and normalise in a second pass, or, with
    `one_pass`, each block as soon as it is seen."""
    n_cols = x.shape[1]
    block = min(LOOP_BLOCK, triton.next_power_of_2(n_cols))
    x = x.float()
    m = torch.full((x.shape[0], 1), -float("inf"), device=x.device)  # running max
    s = torch.zeros_like(m)  # running sum of exp(x - m)
    out = torch.empty_like(x)
    for start in range(0, n_cols, block):
        chunk = x[:, start : start + block]
        m_new = torch.maximum(m, chunk.max(dim=1, keepdim=True).values)
        shift = torch.where(m_new == -float("inf"), 0.0, m_new) if guard else m_new
        s = (s * torch.exp(m - shift) if rescale else s) + torch.exp(chunk - shift).sum(
            dim=1, keepdim=True
        )
        m = m_new
        if one_pass:
            out[:, start : start + block] = torch.exp(chunk - m) / s
    return out if one_pass else torch.exp(x - m) / s


LOOPED_MISTAKES = [
    KnownMistake(
        lambda x: _online(x, rescale=False),
        "the running sum is not rescaled when the max grows: the terms already in s were "
        "computed against the old max. Scale the old sum before adding the block's, "
        "s = s * tl.exp(m - shift) + tl.sum(tl.exp(block - shift), axis=0)",
    ),
    KnownMistake(
        lambda x: _online(x, guard=False),
        "NaN on the rows whose first block is all -inf: there the max is still -inf, and "
        "exp(-inf - (-inf)) = exp(NaN). Shift by 0 while the max is -inf, "
        "shift = tl.where(m_new == -float('inf'), 0.0, m_new), and use the shift in both exps",
    ),
    KnownMistake(
        lambda x: _online(x, one_pass=True),
        "each block was normalised as soon as it was read, with the max and sum of the "
        "blocks so far (the first block with its own max only). The row's max and sum are "
        "known only after the whole row: normalise and store in a second loop over the row",
    ),
    *MISTAKES,
]


def _looped_cases(seed: int) -> list[Case]:
    """The one-block cases plus rows that show each step of the online softmax, all run at
    BLOCK_SIZE=LOOP_BLOCK so that most rows take several blocks."""
    generator = case_generator(seed)
    n = runtime.by_mode(gpu=12_345, interpreter=3001)
    rising = random_input(generator, (6, n), scale=0.5) + torch.linspace(0, 40, n).to(
        runtime.DEVICE
    )
    late = random_input(generator, (9, n), scale=3.0)
    late[::2, :2500] = float("-inf")  # longer than any block: the first block is all -inf
    late[5] = float("-inf")
    cases = [
        *_cases(seed),
        Case(f"6x{n} (values rising along the row: the max grows in every block), float32",
             (rising,)),
        Case(f"9x{n} (the first 2500 columns -inf in every other row), float32", (late,)),
    ]  # fmt: skip
    return [
        dataclasses.replace(c, label=f"{c.label}, BLOCK_SIZE={LOOP_BLOCK}",
                            kwargs={"BLOCK_SIZE": LOOP_BLOCK})
        for c in cases
    ]  # fmt: skip


def check_softmax_looped(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, BLOCK_SIZE=256)`, your looped softmax of lesson 04, against torch.softmax:
    rows of many blocks, a max that grows block after block, rows that start with -inf."""
    check = "check_softmax_looped"
    _takes(fn, "BLOCK_SIZE", check, f"fn(x, BLOCK_SIZE={LOOP_BLOCK})")

    def refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
        _refine(cases, results, prefix_hint=LOOP_STORE_HINT)

    return run_check(
        "softmax_looped", fn, _looped_cases(seed=4), references.softmax, LOOPED_MISTAKES,
        HINTS, refine=refine,
    )  # fmt: skip


# --- many rows: the persistent kernel -----------------------------------------------------

ROWS_NOT_WRITTEN = (
    "rows were never written: with P programs, program pid must take the rows pid, "
    "pid + P, pid + 2P, ... while they are below n_rows"
)
PERSISTENT_HINTS = dataclasses.replace(
    HINTS,
    missing_rows=ROWS_NOT_WRITTEN,
    grid_too_small=ROWS_NOT_WRITTEN,
    scattered=ROWS_NOT_WRITTEN,
)
NO_LOOP_HINT = (
    "only {rows} written, one per program: the programs stopped after their first row. "
    "Loop over the rows, for row in tl.range(pid, n_rows, tl.num_programs(axis=0))"
)
FROM_ZERO_HINT = (
    "only {rows} written: every program started at row 0, so all {k} programs did the same "
    "rows. Start each program at its own row, "
    "tl.range(tl.program_id(axis=0), n_rows, tl.num_programs(axis=0))"
)
# (rows, columns, n_programs, why): mostly fewer programs than rows, so that they loop
PROGRAM_COUNTS = [
    (37, 781, 3, "3 programs, rows not a multiple of them"),
    (16, 1024, 1, "1 program for every row"),
    (30, 300, 7, "7 programs"),
    (5, 300, 8, "8 programs, more than rows"),
]


def _persistent_cases(seed: int) -> list[Case]:
    generator = case_generator(seed + 1)
    extra = [
        Case(f"{m}x{n} ({why}), float32", (random_input(generator, (m, n), scale=3.0),),
             kwargs={"n_programs": programs})
        for m, n, programs, why in PROGRAM_COUNTS
    ]  # fmt: skip
    return [*_cases(seed), *extra]


def _row_pattern_hint(out, n_programs: int | None) -> str | None:
    """The persistent mistake that writes exactly the rows `out` holds, if one does."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        return None
    unwritten = is_poison(out)
    done, untouched = ~unwritten.any(dim=1), unwritten.all(dim=1)
    if not bool((done | untouched).all()) or not bool(untouched.any()):
        return None  # not whole rows, or every row written
    n_rows = out.shape[0]
    rows = done.nonzero().flatten().tolist()
    grid = None if n_programs is None else min(n_programs, n_rows)
    known = grid == len(rows) or (grid is None and len(rows) >= 2)  # 1 row: no evidence
    if rows == list(range(len(rows))) and known:
        return NO_LOOP_HINT.format(rows=_rows_text(rows))
    step = grid if grid is not None else (rows[1] if len(rows) >= 2 else None)
    if step is not None and step >= 2 and rows == list(range(0, n_rows, step)):
        return FROM_ZERO_HINT.format(rows=_rows_text(rows), k=step)
    return None


def _rows_text(rows: list[int]) -> str:
    if len(rows) == 1:
        return "row 0 was"
    if rows[1] == 1:
        return f"the first {len(rows)} rows were"
    listed = ", ".join(str(r) for r in rows[:3])
    return f"the rows {listed}{', ...' if len(rows) > 3 else ''} were"


def check_softmax_persistent(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x)` and `fn(x, n_programs=P)`, your persistent softmax of lesson 04, against
    torch.softmax, with fewer programs than rows so that every program loops."""
    check = "check_softmax_persistent"
    _takes(fn, "n_programs", check, "fn(x, n_programs=3)")
    outputs: list = []  # what fn returned, case by case: the rows it wrote show the mistake

    def recording(x, **kwargs):
        outputs.append(None)
        outputs[-1] = fn(x, **kwargs)
        return outputs[-1]

    def refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
        _refine(cases, results)
        for case, result, out in zip(cases, results, outputs):
            if not result.passed:
                hint = _row_pattern_hint(out, case.kwargs.get("n_programs"))
                result.hint = hint or result.hint

    return run_check(
        "softmax_persistent", recording, _persistent_cases(seed=4), references.softmax,
        MISTAKES, PERSISTENT_HINTS, refine=refine,
    )  # fmt: skip
