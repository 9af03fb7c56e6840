"""Checks for lessons 01 (vector add) and 02 (ReLU)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    KnownMistake,
    random_input,
    run_check,
)

# Odd sizes are a multiple of no block size, so every case has a partial last block.
SIZES: list[tuple[int, str]] = [
    (1, "a single element"),
    (37, "smaller than one block"),
    (runtime.by_mode(gpu=1_000_003, interpreter=1009), "a prime size"),
    (runtime.by_mode(gpu=3_000_001, interpreter=4097), "not a multiple of the block"),
    (runtime.by_mode(gpu=(1 << 24) + 3, interpreter=65_537), "many blocks"),
]
# Half-precision dtypes on two sizes keep the interpreter quick and still show dtype bugs.
LOW_PRECISION_SIZES = SIZES[2:4]


def _cases(n_inputs: int, seed: int) -> list[Case]:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    cases = []
    plan = [(n, why, torch.float32) for n, why in SIZES]
    plan += [(n, why, dt) for dt in runtime.DTYPES[1:] for n, why in LOW_PRECISION_SIZES]
    for n, why, dtype in plan:
        inputs = tuple(
            random_input(generator, (n,), dtype, scale=4, shift=0.5) for _ in range(n_inputs)
        )
        cases.append(Case(f"n={n} ({why}), {str(dtype).removeprefix('torch.')}", inputs))
    return cases


def check_vector_add(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x, y)`, your launcher for lesson 01, against x + y."""
    mistakes = [
        KnownMistake(lambda x, y: x - y, "you subtract: the kernel should compute x + y"),
        KnownMistake(lambda x, y: x * y, "you multiply: the kernel should compute x + y"),
        KnownMistake(lambda x, y: x, "the output equals x: did you add y?"),
        KnownMistake(lambda x, y: y, "the output equals y: did you add x?"),
        KnownMistake(lambda x, y: x + x, "you add x to itself: load y from y_ptr"),
    ]
    return run_check("vector_add", fn, _cases(2, seed=1), references.vector_add, mistakes)


# a block size other than any notebook's, for launchers that take one
OTHER_BLOCK_SIZE = 256
NAN_TO_ZERO_HINT = (
    "NaN became 0: tl.maximum(x, 0.0) returns the number when the other side is NaN. "
    "Keep NaN, as torch.relu does: tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)"
)
FIXED_BLOCK_HINT = (
    f"right at your launcher's own BLOCK_SIZE, wrong at BLOCK_SIZE={OTHER_BLOCK_SIZE}: "
    "work the grid out from the argument, (triton.cdiv(n_elements, BLOCK_SIZE),), and pass "
    "BLOCK_SIZE=BLOCK_SIZE to the kernel"
)


def _special_values_case(seed: int) -> Case:
    """NaN, ±inf and ±0 among random values: what a ReLU must keep, turn to 0, or keep."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(1000, generator=generator) * 4
    x[::7], x[3::11], x[5::13], x[6::17] = float("nan"), float("inf"), -float("inf"), -0.0
    return Case("n=1000 with NaN, ±inf and -0.0, float32", (x.to(runtime.DEVICE),))


def _block_size_cases(fn: Callable, cases: list[Case]) -> list[Case]:
    """The same cases at OTHER_BLOCK_SIZE, where `fn` takes a BLOCK_SIZE argument."""
    try:
        takes_block = "BLOCK_SIZE" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        takes_block = False
    if not takes_block:
        return []
    return [
        Case(f"{c.label}, BLOCK_SIZE={OTHER_BLOCK_SIZE}", c.inputs, "other block size",
             kwargs={"BLOCK_SIZE": OTHER_BLOCK_SIZE})
        for c in cases if c.inputs[0].dtype == torch.float32 and c.inputs[0].numel() > 37
    ]  # fmt: skip


def _refine_block_size(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """A launcher right at its own block size and wrong at another fixes its grid."""
    own = [r for c, r in zip(cases, results) if c.kind != "other block size"]
    if not all(r.passed for r in own):
        return
    for case, result in zip(cases, results):
        if case.kind == "other block size" and not result.passed:
            result.hint = FIXED_BLOCK_HINT


def check_relu(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x)`, your launcher for lesson 02, against torch.relu: NaN stays NaN, and
    a launcher with a BLOCK_SIZE argument must work at other block sizes too."""
    mistakes = [
        KnownMistake(lambda x: torch.relu(x).masked_fill(x.isnan(), 0.0), NAN_TO_ZERO_HINT),
        KnownMistake(lambda x: x, "the output equals the input: apply tl.maximum(x, 0.0)"),
        KnownMistake(
            lambda x: torch.minimum(x, torch.zeros_like(x)),
            "you kept the negative part: ReLU is tl.maximum(x, 0.0), not tl.minimum",
        ),
        KnownMistake(lambda x: x.abs(), "you took the absolute value: negatives must become 0"),
        KnownMistake(lambda x: -torch.relu(x), "the sign is flipped: ReLU is max(x, 0)"),
    ]
    cases = [*_cases(1, seed=2), _special_values_case(seed=2)]
    cases += _block_size_cases(fn, cases)
    return run_check("relu", fn, cases, references.relu, mistakes, refine=_refine_block_size)
