"""The checker engine: run a learner's function on guarded inputs, diagnose, report.

Every ``check_<topic>`` builds a list of ``Case``s and calls ``run_check``. For each
case the engine copies the inputs into guarded buffers, calls the learner's
function with tensor factories served from guarded buffers too (see guard.py),
compares with the reference, and turns what it sees into one line per case plus,
for a failure, the counts, the worst element and a hint in the second person.
"""

from __future__ import annotations

import contextlib
import html
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from course_lib import interpreter_guard, runtime
from course_lib.checks.guard import GuardedArena, GuardedBuffer, guarded_copy, is_poison
from course_lib.checks.tolerances import tolerance_for


@dataclass
class Case:
    """One call of the learner's function: a label and clean input values."""

    label: str
    inputs: tuple[torch.Tensor, ...]


@dataclass
class KnownMistake:
    """A wrong answer a learner is likely to produce, and what to tell them.

    `compute` takes the case's inputs and returns what the mistaken kernel would
    output; when the learner's result matches it, `hint` is shown.
    """

    compute: Callable[..., torch.Tensor]
    hint: str


@dataclass
class CaseResult:
    label: str
    problems: list[str] = field(default_factory=list)
    hint: str | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        if self.passed:
            return [f"  ✓ {self.label}"]
        out = [f"  ✗ {self.label}: {self.problems[0]}"]
        out += [f"      {p}" for p in self.problems[1:]]
        if self.hint:
            out.append(f"      hint: {self.hint}")
        return out


@dataclass
class CheckResult:
    """What a check found; prints as one line, renders as HTML in Jupyter."""

    name: str
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def headline(self) -> str:
        if self.passed:
            return f"✓ {self.name}: every case passed"
        n_ok = sum(c.passed for c in self.cases)
        return f"✗ {self.name}: {n_ok} of {len(self.cases)} cases passed"

    def report(self) -> str:
        return "\n".join([self.headline] + [line for c in self.cases for line in c.lines()])

    def __repr__(self) -> str:
        return self.headline

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        details = html.escape("\n".join(line for c in self.cases for line in c.lines()))
        return (
            f'<div><b style="color:{color}">{html.escape(self.headline)}</b>'
            f"<details><summary>cases</summary><pre>{details}</pre></details></div>"
        )


class CheckFailed(AssertionError):
    """A check found mistakes. In Jupyter it shows the report alone, no traceback."""

    def __init__(self, result: CheckResult):
        super().__init__("\n" + result.report())
        self.result = result

    def _render_traceback_(self) -> list[str]:
        return ["\x1b[31m" + self.result.headline + "\x1b[0m"] + self.result.report().splitlines()[
            1:
        ]


def run_check(
    name: str,
    fn: Callable,
    cases: Sequence[Case],
    reference: Callable[..., torch.Tensor],
    mistakes: Sequence[KnownMistake] = (),
) -> CheckResult:
    """Run every case; print one line and return the result, or raise CheckFailed."""
    if not callable(fn):
        raise TypeError(f"check_{name} expects your launcher function, got {type(fn).__name__}")
    result = CheckResult(name, [_run_case(fn, case, reference, mistakes) for case in cases])
    if not result.passed:
        raise CheckFailed(result)
    print(result.headline)
    return result


def _input_names(n: int) -> list[str]:
    return ["x", "y", "z", "w"][:n] if n <= 4 else [f"input {i}" for i in range(n)]


def _run_case(fn, case: Case, reference, mistakes) -> CaseResult:
    result = CaseResult(case.label)
    expected = reference(*case.inputs)
    names = _input_names(len(case.inputs))
    guarded = [guarded_copy(t, f"`{n}`") for t, n in zip(case.inputs, names)]
    inputs = [view for view, _ in guarded]
    arena = GuardedArena()
    watch = contextlib.nullcontext({})
    if runtime.INTERPRETED:
        ranges = [r for _, buf in guarded for r in buf.byte_ranges()]
        watch = interpreter_guard.watching(ranges)
    try:
        with watch as stray_accesses, arena:
            out = fn(*inputs)
            if runtime.MODE == "gpu":
                torch.cuda.synchronize()
    except NotImplementedError:
        raise  # the exercise is not written yet: let the learner see the stub's message
    except Exception as error:  # noqa: BLE001  (anything the learner's code raises is a finding)
        _explain_exception(error, result)
        return result

    stray_reads = sum(n for (kind, _), n in stray_accesses.items() if kind == "load")
    _diagnose(result, out, expected, case, inputs, [g for _, g in guarded], arena, mistakes)
    if stray_reads and result.passed:
        result.problems.append(
            f"{stray_reads} loads read outside the inputs (unmasked tl.load past the end)"
        )
        result.hint = (
            "the result is right by luck: reading past the end is undefined on a GPU. "
            "Pass mask= to tl.load as well as to tl.store"
        )
    return result


def _explain_exception(error: BaseException, result: CaseResult) -> None:
    oob = interpreter_guard.find_out_of_bounds(error)
    if oob is not None:
        result.problems.append(f"out-of-bounds access stopped: {oob}")
        result.hint = "the last block runs past the end. Use mask = offsets < n_elements"
        return
    message = str(error).strip().splitlines()
    first = message[-1] if message else ""
    result.problems.append(f"your function raised {type(error).__name__}: {first}"[:400])
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        where = frames[-1]
        result.problems.append(f"at {where.filename}:{where.lineno}: {where.line}")
    result.hint = "read the error above: it happened inside your launcher or kernel"


def _diagnose(result, out, expected, case, inputs, input_buffers, arena, mistakes):
    problems, names = result.problems, _input_names(len(inputs))
    if out is None:
        problems.append("your function returned None")
        result.hint = "return the output tensor at the end of your launcher"
        return
    if not isinstance(out, torch.Tensor):
        problems.append(f"your function returned a {type(out).__name__}, not a tensor")
        result.hint = "return the output tensor itself"
        return
    for name, buf in zip(names, input_buffers):
        if buf.owns(out):
            problems.append(f"the result is the input `{name}` itself")
            result.hint = (
                "allocate a new output with torch.empty_like(x), store into it, and return it"
            )
            return
    for name, view, clean in zip(names, inputs, case.inputs):
        if not torch.equal(view, clean):
            problems.append(f"input `{name}` was modified")
            result.hint = "tl.store must write only to out_ptr; never to an input's pointer"
    if out.shape != expected.shape:
        problems.append(f"output shape {list(out.shape)}, expected {list(expected.shape)}")
        result.hint = "allocate the output with the input's shape: torch.empty_like(x)"
        return
    if out.device != expected.device:
        problems.append(f"output on {out.device}, expected {expected.device}")
        result.hint = "allocate the output on the inputs' device: torch.empty_like(x)"
        return
    if out.dtype != expected.dtype:
        problems.append(f"output dtype {out.dtype}, expected {expected.dtype}")
        result.hint = "allocate the output with the inputs' dtype: torch.empty_like(x) keeps it"
        return
    _diagnose_stray_writes(result, arena.buffers + input_buffers)
    # an output the arena did not serve (say, x.clone()) cannot show unwritten elements
    owned = arena.owner(out) is not None
    unwritten = is_poison(out) if owned else torch.zeros_like(out, dtype=torch.bool)
    _diagnose_values(result, out, expected, unwritten, case, mistakes)


def _diagnose_stray_writes(result, buffers: list[GuardedBuffer]):
    before = after = 0
    for buf in buffers:
        b, a = buf.stray_writes()
        before, after = before + b, after + a
    if after:
        result.problems.append(f"{after} elements past the end were written (out-of-bounds store)")
        result.hint = (
            "the last block runs past the end. Guard tl.store (and tl.load) with "
            "mask = offsets < n_elements"
        )
    if before:
        result.problems.append(f"{before} elements before the start were written")
        result.hint = "some offsets are negative: check how you compute the offsets"


def _diagnose_values(result, out, expected, unwritten, case, mistakes):
    tol = tolerance_for(expected.dtype)
    got64, exp64 = out.double(), expected.double()
    close = torch.isclose(got64, exp64, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
    wrong = ~close & ~unwritten
    n, n_unwritten, n_wrong = out.numel(), int(unwritten.sum()), int(wrong.sum())
    flat = unwritten.reshape(-1)
    if n_unwritten == n:
        result.problems.append(f"0 of {n} elements written")
        result.hint = result.hint or (
            "did the kernel store its result? Check tl.store's pointer and the grid size"
        )
    elif n_unwritten:
        first_unwritten = int(flat.nonzero()[0])
        if bool(flat[first_unwritten:].all()):
            result.problems.append(f"only the first {first_unwritten} of {n} elements written")
            result.hint = result.hint or (
                "the grid is too small: launch triton.cdiv(n_elements, BLOCK_SIZE) programs "
                "so the last, partial block is covered too"
            )
        else:
            result.problems.append(f"{n_unwritten} of {n} elements never written")
            result.hint = result.hint or (
                "each program must cover its own block: "
                "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)"
            )
    if n_wrong:
        error = (got64 - exp64).abs().nan_to_num(float("inf")).masked_fill(~wrong, -1)
        worst = int(error.reshape(-1).argmax())
        index = [int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape)]
        got_v, exp_v = out.reshape(-1)[worst].item(), expected.reshape(-1)[worst].item()
        result.problems.append(
            f"{n_wrong} of {n} elements wrong; worst at {index}: got {got_v:.6g}, "
            f"expected {exp_v:.6g} (rtol={tol.rtol:g}, atol={tol.atol:g})"
        )
        if result.hint is None:
            result.hint = _match_mistake(out, wrong, case, mistakes) or (
                "the values differ from the reference: check the operation your kernel applies"
            )


def _match_mistake(out, wrong, case, mistakes) -> str | None:
    tol = tolerance_for(out.dtype)
    for mistake in mistakes:
        alternative = mistake.compute(*case.inputs).to(out.dtype)
        same = torch.isclose(out.double(), alternative.double(), rtol=tol.rtol, atol=tol.atol)
        if bool(same[wrong].all()):
            return mistake.hint
    if bool((out[wrong] == 0).all()):
        return (
            "the wrong elements are all 0: did you load with other=0 where you meant to "
            "load real data, or store a zero-initialised value?"
        )
    return None
