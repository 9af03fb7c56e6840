"""Checks for lessons 01 (vector add) and 02 (ReLU)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib import references, runtime
from course_lib.checks.engine import Case, CheckResult, KnownMistake, random_input, run_check

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


def check_relu(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(x)`, your launcher for lesson 02, against torch.relu."""
    mistakes = [
        KnownMistake(lambda x: x, "the output equals the input: apply tl.maximum(x, 0.0)"),
        KnownMistake(
            lambda x: torch.minimum(x, torch.zeros_like(x)),
            "you kept the negative part: ReLU is tl.maximum(x, 0.0), not tl.minimum",
        ),
        KnownMistake(lambda x: x.abs(), "you took the absolute value: negatives must become 0"),
        KnownMistake(lambda x: -torch.relu(x), "the sign is flipped: ReLU is max(x, 0)"),
    ]
    return run_check("relu", fn, _cases(1, seed=2), references.relu, mistakes)
