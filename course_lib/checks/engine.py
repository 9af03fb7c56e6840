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
from pathlib import Path

import torch

from course_lib import interpreter_guard, runtime
from course_lib.checks import replay
from course_lib.checks.guard import GuardedArena, GuardedBuffer, guarded_copy, is_poison
from course_lib.checks.launches import counting_launches, recording_grids
from course_lib.checks.tolerances import tolerance_for


@dataclass
class Case:
    """One call of the learner's function: a label, clean input values, and a
    free-form `kind` a check's `refine` can group cases by ("transposed", ...)."""

    label: str
    inputs: tuple[torch.Tensor, ...]
    kind: str = ""
    tolerance: torch.dtype | str | None = None  # a TOLERANCES key; default: output dtype
    atol_scale: float = 1.0  # e.g. sqrt(K) for a dot product of K terms
    kwargs: dict = field(default_factory=dict)  # passed by name too (BLOCK_SIZE=256, ...)
    # where the kwargs change the result (activation="relu"): this case's own reference,
    # and mistakes to try before the check's own
    reference: Callable[..., torch.Tensor] | None = None
    mistakes: Sequence[KnownMistake] = ()
    # run only once every case before it has passed: for a costly case whose finding
    # means something only then (say, a float16 overflow of an otherwise right kernel)
    after_the_rest: bool = False
    # what reports call the inputs ("x", "weight"); default: x, y, z, w
    input_names: tuple[str, ...] = ()
    # False where the kernels may run through a launcher the count cannot see (code that
    # torch.compile generated): no launch is then no finding
    expects_launch: bool = True

    def names(self) -> list[str]:
        return list(self.input_names) or _input_names(len(self.inputs))


_case_seed_offset = 0  # 0 in learners' check cells; the grader's own under grading_seed()


def case_generator(seed: int) -> torch.Generator:
    """The generator a check draws its cases' values from: the check's own seed, moved by
    the grader's seed while `grading_seed` is active, so graded cases are not the ones a
    learner's check cell showed, and are the same on every run with that seed."""
    return torch.Generator(device="cpu").manual_seed(seed + _case_seed_offset)


@contextlib.contextmanager
def grading_seed(seed: int):
    """Draw every check's values from other seeds for the duration."""
    global _case_seed_offset
    saved, _case_seed_offset = _case_seed_offset, 1_000_003 * seed
    try:
        yield
    finally:
        _case_seed_offset = saved


def random_input(
    generator: torch.Generator, shape, dtype=torch.float32, scale: float = 1.0, shift: float = 0.0
) -> torch.Tensor:
    """Seeded normal values, drawn on the CPU so both modes see the same numbers."""
    values = torch.randn(*shape, generator=generator) * scale + shift
    return values.to(dtype).to(runtime.DEVICE)


@dataclass
class KnownMistake:
    """A wrong answer a learner is likely to produce, and what to tell them.

    `compute` takes the case's inputs and returns what the mistaken kernel would
    output; when the learner's result matches it, `hint` is shown.
    """

    compute: Callable[..., torch.Tensor]
    hint: str


@dataclass(frozen=True)
class Hints:
    """What to tell the learner for each symptom. A check overrides the ones its lesson
    words differently (2-D tiles, rows of a softmax, the K loop of a matmul)."""

    out_of_bounds: str = (
        "the last block runs past the end. Guard tl.store (and tl.load) with "
        "mask = offsets < n_elements"
    )
    # where a tl.load, not a tl.store, was stopped outside every tensor; None: out_of_bounds
    load_out_of_bounds: str | None = None
    before_start: str = "some offsets are negative: check how you compute the offsets"
    nothing_written: str = (
        "did the kernel store its result? Check tl.store's pointer and the grid size"
    )
    empty_grid: str = (
        "the grid has no programs: a floor division such as n // BLOCK is 0 whenever n is "
        "smaller than the block. Round up with triton.cdiv(n, BLOCK)"
    )
    grid_too_small: str = (
        "the grid is too small: launch triton.cdiv(n_elements, BLOCK_SIZE) programs "
        "so the last, partial block is covered too"
    )
    missing_rows: str = "the grid misses the last rows: launch triton.cdiv(M, BLOCK_M) programs"
    missing_columns: str = (
        "the grid misses the last columns: launch triton.cdiv(N, BLOCK_N) programs"
    )
    missing_edges: str = (
        "the grid misses the edge tiles: launch triton.cdiv(M, BLOCK_M) x "
        "triton.cdiv(N, BLOCK_N) programs"
    )
    scattered: str = (
        "each program must cover its own block: "
        "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)"
    )
    unscaled_offsets: str = (
        "the programs' blocks overlap, each starting one element after the one before, "
        "as if offsets = pid + tl.arange(0, BLOCK_SIZE). Scale by the block: "
        "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)"
    )
    stops_short: str = (
        "the written part ends more than a block before the end, so the grid's size alone "
        "does not explain it: check how each program's offsets follow from its program id"
    )
    stops_short_2d: str = (
        "the written part ends more than a tile before the edge, so the grid's size alone "
        "does not explain it: check which tl.program_id axis gives the rows and which the "
        "columns, and how the offsets follow from them"
    )
    unmasked_load: str = (
        "the result is right by luck: reading past the end is undefined on a GPU. "
        "Pass mask= to tl.load as well as to tl.store"
    )
    read_past_end: str = (
        "NaN or inf where the reference is finite: the memory around your inputs holds "
        "NaN during a check, so your kernel read outside an input. Check the load masks"
    )
    zeros: str = (
        "the wrong elements are all 0: did you load with other=0 where you meant to "
        "load real data, or store a zero-initialised value?"
    )
    wrong_values: str = (
        "the values differ from the reference: check the operation your kernel applies"
    )
    dtype: str = "allocate the output with the inputs' dtype (torch.empty_like(x) keeps it)"
    returned_input: str = (
        "allocate a new output with torch.empty_like(x), store into it, and return it"
    )
    not_contiguous: str = (
        "allocate the output contiguous, torch.empty((M, N), dtype=x.dtype, device=x.device): "
        "torch.empty_like(x) copies x's strides, transposed ones included"
    )
    # where the output's shape is wrong: (case, the shape returned) -> a hint naming the
    # likely mistake, or None for the plain "allocate the output with shape ..."
    wrong_shape: Callable[[Case, list[int]], str | None] | None = None
    # where the call raised: (the error's type, its last line) -> a hint naming the likely
    # mistake, or None for the plain "read the error above"
    raised: Callable[[str, str], str | None] | None = None


PROBLEM_KINDS = (
    "not_run",  # the case did not run, or left no result
    "raised",  # the learner's code raised
    "out_of_bounds",  # a load or store outside every tensor, or a lost CUDA context
    "no_launch",  # no Triton kernel was launched
    "returned",  # not the output tensor: None, another type, an input, a view
    "layout",  # wrong shape, device, dtype or strides
    "input_modified",
    "stray_write",  # writes into the memory around the output or the inputs
    "unwritten",  # elements of the output never written
    "values",  # elements written with wrong values
    "stray_read",  # loads outside the inputs that happened to be harmless
    "mistake",  # a check's own finding (a launch order, a missing autotuner, ...)
)


class Problem(str):
    """One finding about a case: its text for people, and its `kind` (one of PROBLEM_KINDS)
    for programs, such as the grader, which must not read English."""

    kind: str

    def __new__(cls, text: str, kind: str = "mistake") -> Problem:
        if kind not in PROBLEM_KINDS:
            raise ValueError(f"unknown problem kind {kind!r}; use one of {PROBLEM_KINDS}")
        problem = super().__new__(cls, text)
        problem.kind = kind
        return problem


def kind_of(problem: str) -> str:
    """A problem's kind; a plain string (a check's own finding) is a "mistake"."""
    return getattr(problem, "kind", "mistake")


@dataclass
class CaseResult:
    label: str
    problems: list[str] = field(default_factory=list)
    hint: str | None = None
    relative_error: float | None = None  # ‖got - expected‖ / ‖expected‖, when values were wrong
    # where only whole trailing rows and columns went unwritten: how many rows and columns
    # were written, for a check's refine to compare with what a mistake would leave
    written_extent: tuple[int, int] | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def kinds(self) -> list[str]:
        """The kind of each problem, in order (see PROBLEM_KINDS)."""
        return [kind_of(p) for p in self.problems]

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
    def kinds(self) -> set[str]:
        """The kinds of problem found across the cases (see PROBLEM_KINDS); empty if passed."""
        return {kind for case in self.cases for kind in case.kinds}

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
        # the headline was printed when the check ran: Jupyter shows the cases under it
        details = html.escape("\n".join(line for c in self.cases for line in c.lines()))
        return f"<details><summary>{len(self.cases)} cases</summary><pre>{details}</pre></details>"


class ExerciseNotDone(NotImplementedError):
    """Raised by an exercise's stub: the learner has not written this part yet. Checks let
    it through untouched, so the learner sees the stub's own message."""


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
    hints: Hints = Hints(),
    refine: Callable[[Sequence[Case], list[CaseResult]], None] | None = None,
    contiguous_output: bool = False,
) -> CheckResult:
    """Run every case; print one line and return the result, or raise CheckFailed.

    `refine`, if given, sees all cases and their results at the end and may
    sharpen hints that only a comparison across cases reveals (say, contiguous
    inputs pass and transposed ones fail: the kernel ignores strides).
    `contiguous_output` makes an output with other strides a problem, where the
    exercise asks for a contiguous one.
    """
    if not callable(fn):
        raise TypeError(f"check_{name} expects your launcher function, got {type(fn).__name__}")
    results = []
    for case in cases:
        if results and results[-1].problems[:1] == [CONTEXT_LOST]:
            # after an illegal memory access every CUDA call fails: run nothing more
            results.append(
                CaseResult(case.label, [Problem("not run: the CUDA context is lost", "not_run")])
            )
            continue
        if case.after_the_rest and not all(r.passed for r in results):
            results.append(CaseResult(case.label, [Problem(NOT_RUN_YET, "not_run")]))
            continue
        results.append(_run_case(name, fn, case, reference, mistakes, hints, contiguous_output))
    if refine is not None:
        refine(cases, results)
    _exchange_findings(replay.active(), name, results)
    result = CheckResult(name, results)
    if not result.passed:
        raise CheckFailed(result)
    print(result.headline)
    return result


CONTEXT_LOST = "the GPU stopped your kernel: an illegal memory access"
NOT_RUN_YET = "not run until every case above passes"
RAISED_HINT = "read the error above, and the line of your code it names where there is one"
NO_LAUNCH_HINT = (
    "the result came from PyTorch, not from a kernel of yours: launch your kernel with "
    "kernel[grid](...) and return the tensor it wrote"
)


def _input_names(n: int) -> list[str]:
    return ["x", "y", "z", "w"][:n] if n <= 4 else [f"input {i}" for i in range(n)]


def _run_case(
    name: str, fn, case: Case, reference, mistakes, hints: Hints, contiguous_output: bool
) -> CaseResult:
    session = replay.active()
    if isinstance(session, replay.Replayer):
        return _replay_case(session, name, case, reference, mistakes, hints, contiguous_output)
    recording = isinstance(session, replay.Recorder)
    record: dict = {"check": name, "label": case.label}
    result = _call_case(fn, case, reference, mistakes, hints, contiguous_output, record, recording)
    if recording:
        session.records.append(record)
    return result


def _exchange_findings(session, name: str, results: list[CaseResult]) -> None:
    """Where a check is split across processes (replay.py): the learner's process records
    each case's final findings, refine's included, which the grader's cannot all see (the
    guard bands, stray reads, what a check's wrapper saw of the launches); the grader's
    process adopts them for a case it found no fault in. They can fail a case, never pass one.
    """
    by_label = {r.label: r for r in results}
    if isinstance(session, replay.Recorder):
        for record in session.records:
            if record["check"] == name and (found := by_label.get(record["label"])):
                record.update(problems=[str(p) for p in found.problems], hint=found.hint)
                record["kinds"] = found.kinds
    elif isinstance(session, replay.Replayer):
        for record in session.taken(name):
            found = by_label.get(record.get("label"))
            problems = record.get("problems")
            if found and found.passed and isinstance(problems, list) and problems:
                kinds = record.get("kinds")
                kinds = kinds if isinstance(kinds, list) else []
                found.problems = [
                    Problem(_short(p), k if k in PROBLEM_KINDS else "mistake")
                    for p, k in zip(problems[:5], [*kinds, *["mistake"] * 5])
                ]
                found.hint = _short(record.get("hint")) or None


def _call_case(
    fn,
    case: Case,
    reference,
    mistakes,
    hints: Hints,
    contiguous_output: bool,
    record: dict,
    keep_output: bool = False,
) -> CaseResult:
    """Run the learner's function on one case and diagnose what it did. `record` receives
    what the call produced, as data, the output itself only with `keep_output` (replay.py)."""
    result = CaseResult(case.label)
    expected = (case.reference or reference)(*case.inputs)
    guarded = [guarded_copy(t, f"`{n}`") for t, n in zip(case.inputs, case.names())]
    inputs = [view for view, _ in guarded]
    arena = GuardedArena()
    watch = contextlib.nullcontext({})
    if runtime.INTERPRETED:
        ranges = [r for _, buf in guarded for r in buf.byte_ranges()]
        watch = interpreter_guard.watching(ranges)
    try:
        with (
            watch as stray_accesses,
            counting_launches() as launches,
            recording_grids() as grids,
            arena,
        ):
            out = fn(*inputs, **case.kwargs)
            if runtime.MODE == "gpu":
                torch.cuda.synchronize()
    except ExerciseNotDone:
        raise  # the exercise is not written yet: let the learner see the stub's message
    except Exception as error:  # noqa: BLE001  (anything the learner's code raises is a finding)
        record["error"] = _describe_exception(error)
        _explain_error(record["error"], result, hints)
        return result
    empty_grids = bool(grids) and all(0 in grid for grid in grids)
    record.update(launches=launches[0], empty_grids=empty_grids)
    if keep_output:
        record.update(replay.output_record(out))
    judge = _Diagnosis(result, hints, case, [*case.mistakes, *mistakes], empty_grids)
    judge.judge(
        out, expected, inputs, [g for _, g in guarded], arena, launches[0], contiguous_output
    )
    stray_reads = sum(n for (kind, _), n in stray_accesses.items() if kind == "load")
    if stray_reads and result.passed:
        result.problems.append(Problem(
            f"{stray_reads} loads read outside the inputs (unmasked tl.load past the end)",
            "stray_read",
        ))  # fmt: skip
        result.hint = hints.unmasked_load
    return result


NOT_RECORDED = "no result: the submission's run stopped before this case, or skipped it"


def _replay_case(
    session: replay.Replayer, name: str, case: Case, reference, mistakes, hints: Hints,
    contiguous_output: bool,
) -> CaseResult:  # fmt: skip
    """Judge one case from what the learner's process recorded (see replay.py). Nothing
    recorded is trusted beyond its own case: text is shortened, types are checked."""
    result = CaseResult(case.label)
    record = session.take(name, case.label)
    if record is None:
        result.problems.append(Problem(NOT_RECORDED, "not_run"))
        return result
    try:
        if isinstance(error := record.get("error"), dict):
            _explain_error({k: _short(v) for k, v in error.items()}, result, hints)
            return result
        expected = (case.reference or reference)(*case.inputs)
        guarded = [guarded_copy(t, f"`{n}`") for t, n in zip(case.inputs, case.names())]
        inputs = [view for view, _ in guarded]
        arena = GuardedArena()
        out = replay.replayed_output(record, expected, arena)
        launches, empty_grids = int(record["launches"]), bool(record.get("empty_grids"))
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        result.problems.append(
            Problem(f"the submission's record of this case is unusable: {error}"[:300], "not_run")
        )
        return result
    judge = _Diagnosis(result, hints, case, [*case.mistakes, *mistakes], empty_grids)
    judge.judge(out, expected, inputs, [g for _, g in guarded], arena, launches, contiguous_output)
    return result


def _short(value, limit: int = 400) -> str:
    return "" if value is None else str(value)[:limit]


def _describe_exception(error: BaseException) -> dict:
    """What the diagnosis needs of an exception, as plain data."""
    oob = interpreter_guard.find_out_of_bounds(error)
    if oob is not None:
        return {"out_of_bounds": str(oob)}
    if "illegal memory access" in str(error):
        return {"context_lost": True}
    # Triton wraps errors raised inside a kernel: report the learner's own exception
    cause = error.__cause__ if error.__cause__ is not None else error
    lines = str(cause).strip().splitlines()
    where = _learners_frame(cause) or _learners_frame(error)
    return {
        "type": type(cause).__name__,
        "last_line": lines[-1] if lines else "",
        "where": f"{where.filename}:{where.lineno}: {where.line}" if where else None,
    }


def _explain_error(error: dict, result: CaseResult, hints: Hints) -> None:
    if (oob := error.get("out_of_bounds")) is not None:
        result.problems.append(Problem(f"out-of-bounds access stopped: {oob}", "out_of_bounds"))
        loaded = str(oob).startswith("tl.load")
        result.hint = (loaded and hints.load_out_of_bounds) or hints.out_of_bounds
        return
    if error.get("context_lost"):
        result.problems.append(Problem(CONTEXT_LOST, "out_of_bounds"))
        result.hint = (
            "your kernel reached memory far outside its tensors (a wrong stride or offset), "
            "and the CUDA context is now unusable: restart the Jupyter kernel, then debug "
            "with TRITON_INTERPRET=1 set before importing course_lib, where the same "
            "mistake stops with an error naming the argument"
        )
        return
    raised = f"your function raised {error.get('type')}: {error.get('last_line', '')}"[:400]
    result.problems.append(Problem(raised, "raised"))
    if error.get("where"):
        result.problems.append(Problem(f"at {error['where']}"[:400], "raised"))
    named = hints.raised and hints.raised(str(error.get("type")), str(error.get("last_line")))
    result.hint = named or RAISED_HINT


def _learners_frame(error: BaseException):
    """The innermost frame of the traceback that is neither Triton's, torch's nor ours."""
    library = (
        str(Path(__file__).resolve().parents[1]),
        "site-packages",
        "dist-packages",
        "<frozen",
    )
    frames = [
        f for f in traceback.extract_tb(error.__traceback__)
        if not any(part in f.filename for part in library)
    ]  # fmt: skip
    return frames[-1] if frames else None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN included (torch.equal says NaN differs from itself)."""
    return bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


def _prefix_hint(
    written: int, n: int, grid_hint: str, other_hint: str, unscaled_hint: str | None = None
) -> str:
    """What to say when only the first `written` of `n` elements (rows, columns) were written.

    A grid of floor(n / BLOCK) programs writes whole blocks, so `written` is a multiple of
    the block size (a power of two) and less than one block is missing: only then is the
    grid to blame. Programs whose offsets start at pid instead of pid * BLOCK, with a
    cdiv grid, write cdiv(n, BLOCK) - 1 + BLOCK elements.
    """
    if written and n - written < written & -written:  # the largest power of two dividing it
        return grid_hint
    if unscaled_hint is not None:
        for block in (1 << p for p in range(4, 17)):
            if -(-n // block) - 1 + block == written:
                return unscaled_hint
    return other_hint


@dataclass
class _Diagnosis:
    """Turns what one case left behind into problems and the most specific hint."""

    result: CaseResult
    hints: Hints
    case: Case
    mistakes: Sequence[KnownMistake]
    empty_grids: bool = False  # every launch asked for a grid with 0 programs on some axis

    def problem(self, text: str, hint: str | None = None, kind: str = "mistake") -> None:
        self.result.problems.append(Problem(text, kind))
        if hint is not None and self.result.hint is None:
            self.result.hint = hint

    def judge(
        self, out, expected, inputs, input_buffers, arena, launches: int, contiguous: bool
    ) -> None:
        """Everything a case's call left behind: launches, output, inputs, memory."""
        if launches == 0 and self.case.expects_launch:
            self.problem("your function launched no Triton kernel", NO_LAUNCH_HINT, "no_launch")
        self.run(out, expected, inputs, input_buffers, arena)
        if contiguous and isinstance(out, torch.Tensor) and not out.is_contiguous():
            self.problem(
                f"the output is not contiguous (strides {list(out.stride())})",
                self.hints.not_contiguous,
                "layout",
            )

    def run(self, out, expected, inputs, input_buffers, arena: GuardedArena) -> None:
        if not self._output_is_usable(out, expected, inputs, input_buffers):
            return
        for name, view, clean in zip(self.case.names(), inputs, self.case.inputs):
            if not torch.equal(view, clean) and not _same_values(view, clean):
                self.problem(
                    f"input `{name}` was modified",
                    "tl.store must write only to the output's pointer, never to an input's",
                    "input_modified",
                )
        self._stray_writes(arena.buffers + input_buffers)
        # an output the arena did not serve (say, x.clone()) cannot show unwritten elements
        owned = arena.owner(out) is not None
        unwritten = is_poison(out) if owned else torch.zeros_like(out, dtype=torch.bool)
        self._unwritten(unwritten)
        self._values(out, expected, unwritten)

    def _output_is_usable(self, out, expected, inputs, input_buffers) -> bool:
        if out is None:
            self.problem(
                "your function returned None",
                "return the output tensor at the end of your launcher",
                "returned",
            )
        elif not isinstance(out, torch.Tensor):
            self.problem(
                f"your function returned a {type(out).__name__}, not a tensor",
                "return the output tensor itself",
                "returned",
            )
        elif owner := next(
            (
                (n, view)
                for n, view, b in zip(self.case.names(), inputs, input_buffers)
                if b.owns(out)
            ),
            None,
        ):
            name, view = owner
            layout = (out.shape, out.stride(), out.storage_offset())
            same = layout == (view.shape, view.stride(), view.storage_offset())
            self.problem(
                f"the result is the input `{name}` itself"
                if same
                else f"the result is a view of the input `{name}`: its memory, not a copy",
                kind="returned",
            )
            # more telling than "launched no kernel": a view launches nothing
            self.result.hint = self.hints.returned_input
        elif out.shape != expected.shape:
            named = self.hints.wrong_shape and self.hints.wrong_shape(self.case, list(out.shape))
            self.problem(
                f"output shape {list(out.shape)}, expected {list(expected.shape)}",
                named or f"allocate the output with shape {list(expected.shape)}",
                "layout",
            )
        elif out.device != expected.device:
            self.problem(
                f"output on {out.device}, expected {expected.device}",
                "allocate the output on the inputs' device (device=x.device)",
                "layout",
            )
        elif out.dtype != expected.dtype:
            self.problem(
                f"output dtype {out.dtype}, expected {expected.dtype}", self.hints.dtype, "layout"
            )
        else:
            return True
        return False

    def _stray_writes(self, buffers: list[GuardedBuffer]) -> None:
        before = after = 0
        for buf in buffers:
            b, a = buf.stray_writes()
            before, after = before + b, after + a
        if after:
            self.problem(
                f"{after} elements past the end were written (out-of-bounds store)",
                self.hints.out_of_bounds,
                "stray_write",
            )
        if before:
            self.problem(
                f"{before} elements before the start were written",
                self.hints.before_start,
                "stray_write",
            )

    def _unwritten(self, unwritten: torch.Tensor) -> None:
        n, count = unwritten.numel(), int(unwritten.sum())
        if count == 0:
            return
        if count == n and self.empty_grids:
            self.problem(f"0 of {n} elements written", self.hints.empty_grid, "unwritten")
            return
        if count == n:
            self.problem(f"0 of {n} elements written", self.hints.nothing_written, "unwritten")
            return
        if unwritten.dim() == 2 and self._unwritten_edges(unwritten):
            return
        flat = unwritten.reshape(-1)
        first = int(flat.nonzero()[0])
        if bool(flat[first:].all()):
            self.problem(f"only the first {first} of {n} elements written", _prefix_hint(
                first, n, self.hints.grid_too_small, self.hints.stops_short,
                self.hints.unscaled_offsets,
            ), "unwritten")  # fmt: skip
        else:
            self.problem(
                f"{count} of {n} elements never written", self.hints.scattered, "unwritten"
            )

    def _unwritten_edges(self, unwritten: torch.Tensor) -> bool:
        """Whole trailing rows and/or columns unwritten: a grid that stops short."""
        n_rows, n_cols = unwritten.shape
        rows, cols = unwritten.all(dim=1), unwritten.all(dim=0)
        if not torch.equal(unwritten, rows[:, None] | cols[None, :]):
            return False
        first_row = int(rows.nonzero()[0]) if rows.any() else n_rows
        first_col = int(cols.nonzero()[0]) if cols.any() else n_cols
        if not (bool(rows[first_row:].all()) and bool(cols[first_col:].all())):
            return False
        self.result.written_extent = first_row, first_col
        # a grid that stops short leaves less than a tile unwritten, past a written part
        # made of whole tiles; more than that has another cause
        short = self.hints.stops_short_2d
        rows_hint = _prefix_hint(first_row, n_rows, self.hints.missing_rows, short)
        cols_hint = _prefix_hint(first_col, n_cols, self.hints.missing_columns, short)
        if first_row < n_rows and first_col < n_cols:
            both = self.hints.missing_edges if short not in (rows_hint, cols_hint) else short
            self.problem(
                f"rows {first_row}.. and columns {first_col}.. never written "
                f"(of {n_rows} x {n_cols})",
                both,
                "unwritten",
            )
        elif first_row < n_rows:
            self.problem(
                f"only the first {first_row} of {n_rows} rows written", rows_hint, "unwritten"
            )
        else:
            self.problem(
                f"only the first {first_col} of {n_cols} columns written in every row",
                cols_hint,
                "unwritten",
            )
        return True

    def _tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        tol = tolerance_for(self.case.tolerance or dtype)
        return tol.rtol, tol.atol * self.case.atol_scale

    def _values(self, out, expected, unwritten) -> None:
        rtol, atol = self._tolerance(expected.dtype)
        got64, exp64 = out.double(), expected.double()
        close = torch.isclose(got64, exp64, rtol=rtol, atol=atol, equal_nan=True)
        wrong = ~close & ~unwritten
        n_wrong = int(wrong.sum())
        if not n_wrong:
            return
        error = (got64 - exp64).abs().nan_to_num(float("inf")).masked_fill(~wrong, -1)
        worst = int(error.reshape(-1).argmax())
        index = [int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape)]
        got_v, exp_v = out.reshape(-1)[worst].item(), expected.reshape(-1)[worst].item()
        self.problem(
            f"{n_wrong} of {out.numel()} elements wrong; worst at {index}: got {got_v:.6g}, "
            f"expected {exp_v:.6g} (rtol={rtol:g}, atol={atol:.3g})",
            kind="values",
        )
        written = ~unwritten & exp64.isfinite()
        difference = (got64 - exp64)[written].nan_to_num(float("inf")).norm()
        self.result.relative_error = float(difference / exp64[written].norm().clamp_min(1e-30))
        if self.result.hint is None:
            self.result.hint = self._explain_wrong(out, expected, wrong)

    def _explain_wrong(self, out, expected, wrong) -> str:
        rtol, atol = self._tolerance(out.dtype)
        for mistake in self.mistakes:
            try:
                alternative = mistake.compute(*self.case.inputs).to(out.dtype)
            except (RuntimeError, ValueError):
                continue  # this mistake cannot be replayed on this case
            if alternative.shape != out.shape:
                continue
            same = torch.isclose(
                out.double(), alternative.double(), rtol=rtol, atol=atol, equal_nan=True
            )
            if bool(same[wrong].all()):
                return mistake.hint
        got, exp = out[wrong], expected[wrong]
        if bool((~got.isfinite() & exp.isfinite()).any()):
            return self.hints.read_past_end
        if bool((got == 0).all()):
            return self.hints.zeros
        return self.hints.wrong_values
