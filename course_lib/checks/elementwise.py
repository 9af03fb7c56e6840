"""Checks for lessons 01 (vector add, axpy) and 02 (ReLU, an autotuned leaky ReLU)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from course_lib import references, runtime
from course_lib.checks.autotuning import AutotuneRecord, watching_autotuners
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.tolerances import tolerance_for

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
    generator = case_generator(seed)
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


# Whole numbers would hide an alpha truncated to an int, and |alpha| < 1 would truncate to
# 0, which reads like a forgotten x; both are exact in every floating dtype.
AXPY_ALPHAS = (2.5, -1.75)
AXPY_MISTAKES = [
    KnownMistake(
        lambda x, y, alpha: torch.trunc(alpha) * x + y,
        "the result is int(alpha) * x + y: alpha lost its fraction on the way into the "
        "kernel. Pass it as the Python float it is, with no int() in the launcher and no "
        "conversion to an integer type in the kernel",
    ),
    KnownMistake(
        lambda x, y, alpha: x + alpha * y,
        "alpha scales y here: axpy scales x, out = alpha * x + y",
    ),
    KnownMistake(
        lambda x, y, alpha: alpha * (x + y),
        "alpha scales the whole sum: only x is scaled, out = alpha * x + y",
    ),
    KnownMistake(lambda x, y, alpha: x + y, "the result is x + y: multiply x by alpha"),
    KnownMistake(lambda x, y, alpha: alpha * x, "the result is alpha * x: add y to it"),
]


def _rounding_room(alpha: float, x: torch.Tensor, y: torch.Tensor) -> float:
    """atol_scale for alpha * x + y: PyTorch, and a kernel working in half precision,
    round alpha * x before adding y, which costs up to one rounding of the largest term
    when the two nearly cancel; a fused multiply-add rounds once."""
    largest = float((alpha * x.double()).abs().add(y.double().abs()).max())
    room = torch.finfo(x.dtype).eps * largest / tolerance_for(x.dtype).atol
    return max(1.0, room)


def check_axpy(fn: Callable[[float, torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(alpha, x, y)`, lesson 01's axpy, against alpha * x + y computed in float64:
    the sizes of check_vector_add, each with a non-integer alpha."""
    cases = []
    for i, case in enumerate(_cases(2, seed=3)):
        x, y = case.inputs
        alpha = AXPY_ALPHAS[i % len(AXPY_ALPHAS)]
        # alpha rides along as a 0-d tensor, so the reference and the mistakes see it too
        alpha_value = torch.tensor(alpha, dtype=torch.float64, device=x.device)
        label = f"{case.label}, alpha={alpha}"
        room = _rounding_room(alpha, x, y)
        cases.append(Case(label, (x, y, alpha_value), atol_scale=room))
    call = (lambda x, y, alpha: fn(alpha.item(), x, y)) if callable(fn) else fn
    reference = lambda x, y, alpha: references.axpy(alpha.item(), x, y)
    return run_check("axpy", call, cases, reference, AXPY_MISTAKES)


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


def _special_values(seed: int) -> torch.Tensor:
    """NaN, ±inf and -0.0 among 1000 random values: what an activation must keep or map."""
    generator = case_generator(seed)
    x = torch.randn(1000, generator=generator) * 4
    x[::7], x[3::11], x[5::13], x[6::17] = float("nan"), float("inf"), -float("inf"), -0.0
    return x.to(runtime.DEVICE)


SPECIAL_VALUES_LABEL = "n=1000 with NaN, ±inf and -0.0, float32"


def _special_values_case(seed: int) -> Case:
    return Case(SPECIAL_VALUES_LABEL, (_special_values(seed),))


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


# --- lesson 02: an autotuned leaky ReLU ----------------------------------------------------

LEAKY_SLOPE = 0.2  # not the default 0.01, so a slope written into the kernel shows
# BLOCK_SIZEs the autotuner may pick on some GPU and size, whatever the learner's configs
PINNED_BLOCK_SIZES = (128, 4096)
REDEFINED_HINT = (
    "your launch passes {name}, which the autotuner's configs set: Triton refuses it "
    "('Conflicting meta-parameters: {name}' while it times several configs, 'got multiple "
    "values for keyword argument' with one). Launch with x, out, n_elements and "
    "negative_slope only; the grid reads the block size from meta['BLOCK_SIZE']"
)
UNTIMEABLE_HINT = (
    "the autotuner has several configs to time, and in the interpreter there is no GPU to "
    "time them on (Triton's '0 active drivers'): give it one config there, "
    "configs=course_lib.by_mode(gpu=[...], interpreter=[one triton.Config])"
)
GRID_HINT = (
    "with BLOCK_SIZE={block} from the autotuner, your grid launched {programs} programs where "
    "n_elements={n} needs {needed}. {why} Work the grid out from the config that runs: "
    "grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']),)"
)
GRID_TUPLE = "A tuple grid is fixed before the autotuner picks a block size."
GRID_FUNCTION = "Your grid function does not follow meta['BLOCK_SIZE']."
NOT_AUTOTUNED_HINT = (
    "decorate your kernel with @triton.autotune(configs=LEAKY_RELU_CONFIGS, "
    "key=['n_elements']) above @triton.jit, and launch that kernel from your launcher"
)


def _leaky(x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    return references.leaky_relu(x, slope.item())


LEAKY_RELU_MISTAKES = [
    KnownMistake(
        lambda x, slope: _leaky(x, slope).masked_fill(x.isnan(), 0.0),
        "NaN became 0, where torch keeps it: tl.maximum and tl.minimum drop NaN unless "
        "told otherwise. Pick the side with tl.where(x < 0, x * negative_slope, x), which "
        "passes NaN through (NaN < 0 is False)",
    ),
    KnownMistake(
        lambda x, slope: torch.where(x > 0, slope * x, x),
        "you scaled the positive values: negative_slope multiplies the negative ones, "
        "and x >= 0 passes through unchanged",
    ),
    KnownMistake(
        lambda x, slope: references.leaky_relu(x, 0.01),
        "the negative values were scaled by 0.01, not by the negative_slope you were given: "
        "pass negative_slope to the kernel and multiply by that",
    ),
    KnownMistake(
        lambda x, slope: torch.relu(x),
        "negative values became 0, as in a ReLU: multiply them by negative_slope instead",
    ),
]


@dataclass
class _Call:
    """How the check calls a leaky_relu launcher for one case, and what its autotuned
    kernels did then."""

    block_size: int | None = None  # pin the autotuner to this BLOCK_SIZE; None: its own configs
    default_slope: bool = False  # call fn(x), leaving negative_slope at its default
    ran: bool = False  # the launcher was called (not after a lost CUDA context)
    raised: bool = False
    record: AutotuneRecord = field(default_factory=AutotuneRecord)


def _calling(fn: Callable) -> Callable:
    def call(x: torch.Tensor, slope: torch.Tensor, *, how: _Call) -> torch.Tensor:
        how.ran = True
        with watching_autotuners(how.block_size) as how.record:
            try:
                return fn(x) if how.default_slope else fn(x, slope.item())
            except BaseException:
                how.raised = True
                raise

    return call


def _leaky_relu_cases(seed: int) -> list[Case]:
    def case(label: str, x: torch.Tensor, slope: float = LEAKY_SLOPE, **how) -> Case:
        slope_value = torch.tensor(slope, dtype=torch.float64, device=x.device)
        return Case(label, (x, slope_value), kwargs={"how": _Call(**how)})

    base = _cases(1, seed)
    prime = base[2]
    # the learner's own configs: timed on a GPU, one config in the interpreter
    cases = [
        case(f"{prime.label}, your configs", prime.inputs[0]),
        case(f"{SPECIAL_VALUES_LABEL}, your configs", _special_values(seed)),
        case(f"{base[1].label}, negative_slope left at 0.01, your configs",
             base[1].inputs[0], slope=0.01, default_slope=True),
    ]  # fmt: skip
    for block in PINNED_BLOCK_SIZES:
        for c in base:
            cases.append(case(f"{c.label}, BLOCK_SIZE={block}", c.inputs[0], block_size=block))
    return cases


def _refine_autotuned(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """Hints from what the autotuned kernels did: a meta-parameter passed twice, configs
    the interpreter cannot time, a grid that ignores the config, no autotuning at all."""
    for case, result in zip(cases, results):
        how: _Call = case.kwargs["how"]
        record = how.record
        if not how.ran:
            continue
        if record.redefined is not None:
            result.hint = REDEFINED_HINT.format(name=record.redefined)
        elif record.untimeable:
            result.hint = UNTIMEABLE_HINT
        elif not how.raised and not record.launches:
            result.problems.append("your launcher launched no @triton.autotune kernel")
            result.hint = result.hint or NOT_AUTOTUNED_HINT
        elif not result.passed:
            result.hint = _grid_hint(case.inputs[0].numel(), record) or result.hint


def _grid_hint(n: int, record: AutotuneRecord) -> str | None:
    """A hint if a launch had fewer programs than its config's BLOCK_SIZE needs, other than
    a floor division (which the engine's grid hint names)."""
    for launch in record.launches:
        block = launch.config.get("BLOCK_SIZE")
        if not isinstance(block, int) or launch.programs is None:
            continue
        needed = -(-n // block)
        if launch.programs < needed and launch.programs != n // block:
            why = GRID_FUNCTION if launch.grid_is_function else GRID_TUPLE
            return GRID_HINT.format(
                block=block, programs=launch.programs, n=n, needed=needed, why=why
            )
    return None


def check_leaky_relu(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, negative_slope=0.01)`, lesson 02's autotuned leaky ReLU, against
    torch.nn.functional.leaky_relu: with the launcher's own configs, NaN included, and
    with the autotuner pinned to other BLOCK_SIZEs."""
    call = _calling(fn) if callable(fn) else fn
    return run_check(
        "leaky_relu", call, _leaky_relu_cases(seed=4), _leaky, LEAKY_RELU_MISTAKES,
        refine=_refine_autotuned,
    )  # fmt: skip
