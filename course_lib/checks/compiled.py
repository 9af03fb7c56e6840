"""Checks for lesson 08: code that torch.compile captures whole, and operators it can call.

`check_compiled(fn, *args)` is a learner's tool: it lists the graph breaks in fn with
their reasons and lines, and compares fn compiled with fullgraph=True against the eager
result. `check_softmax_op(op)` grades the lesson's exercise, a row softmax registered as
an operator, through the engine: each stage of the operator's life (eager, checked by
torch.library.opcheck, compiled, compiled for dynamic shapes) is a case.
`check_softmax_backward(op)` grades the second: the softmax's backward as an operator of
its own, and the gradient it gives lesson08::softmax once registered as its backward.
`check_add_into(op)` grades the third: an operator that writes into an argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from course_lib import references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckFailed,
    CheckResult,
    ExerciseNotDone,
    Hints,
    KnownMistake,
    Problem,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.guard import GuardedArena
from course_lib.checks.launches import LaunchOnFakeTensors, refusing_fake_launches
from course_lib.checks.softmax import HINTS as SOFTMAX_HINTS
from course_lib.checks.tolerances import tolerance_for

# -- graph breaks -------------------------------------------------------------------------


@dataclass
class GraphBreakFound:
    reason: str  # Dynamo's reason, first line
    where: str  # "file, line N: code", or "" where Dynamo gave no user frame

    def hint(self) -> str:
        return next((hint for key, hint in BREAK_HINTS if key in self.reason), OTHER_BREAK_HINT)


BREAK_HINTS = (
    ("`print`", "print inside compiled code breaks the graph: print outside the function, "
                "or return what you want to see"),
    ("generic_jump", "an `if` on a tensor's value needs that value on the host: compute both "
                     "branches and choose with torch.where"),
    ("Data-dependent", "an `if` on a tensor's value needs that value on the host: compute "
                       "both branches and choose with torch.where"),
    ("item()", "Tensor.item() (and float(t), int(t)) brings a value to Python: keep it a "
               "tensor and go on with tensor operations"),
    ("fake tensor", "a kernel was launched while the compiler traced with fake tensors, "
                    "which have no memory: register the launcher as an operator with "
                    "torch.library.custom_op and give it a register_fake"),
)  # fmt: skip
OTHER_BREAK_HINT = "read the reason: Dynamo names what it could not trace and where"


def graph_breaks(fn: Callable, *args) -> list[GraphBreakFound]:
    """Each graph break Dynamo meets running fn(*args), in order. Starts from a reset
    compiler, so that earlier compilations do not hide anything: functions compiled before
    compile again on their next call."""
    torch.compiler.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    found = []
    for info in explanation.break_reasons:
        frame = info.user_stack[-1] if info.user_stack else None
        where = ""
        if frame is not None:
            code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
            where = f"{_file_and(frame.filename)}line {frame.lineno}: {code}"
        found.append(GraphBreakFound(_reason(str(info.reason)), where))
    return found


def _reason(text: str) -> str:
    """Dynamo's reason: its first line, and the line that explains it where there is one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    explained = [line.removeprefix("Explanation:").strip() for line in lines[1:2]
                 if line.startswith("Explanation:")]  # fmt: skip
    return " — ".join(lines[:1] + explained)[:400] if lines else text[:400]


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:300]


def _file_and(filename: str) -> str:
    """'file.py, ' for a file of the learner's; nothing for a notebook cell, whose file is
    a temporary name (…/ipykernel_123/4252444717.py) that says nothing to its reader."""
    if "ipykernel" in filename:
        return ""
    return f"{filename.rsplit('/', 1)[-1]}, "


# -- check_compiled -----------------------------------------------------------------------


def check_compiled(fn: Callable, *args, reference: Callable | None = None) -> CheckResult:
    """Compile fn with fullgraph=True and compare fn(*args) with reference(*args), or with
    eager fn(*args), each run on copies of args. Reports each graph break with its reason
    and line. Prints one line when all is well; raises CheckFailed with the report
    otherwise. It resets the compiler: functions compiled before compile again."""
    if not callable(fn):
        raise TypeError(f"check_compiled expects your function, got {type(fn).__name__}")
    name = getattr(fn, "__name__", "function")
    graph = CaseResult(f"{name}: captured as one graph")
    values = CaseResult(f"{name}: compiled with fullgraph=True, same result as eager")
    try:
        breaks = graph_breaks(fn, *_cloned(args))  # explain runs fn: on copies of the inputs
    except Exception as error:  # noqa: BLE001  (whatever tracing raised is the finding)
        breaks = [GraphBreakFound(f"tracing raised {type(error).__name__}: "
                                  f"{_first_line(str(error))}", "")]  # fmt: skip
    for found in breaks:
        graph.problems.append(Problem(f"graph break: {found.reason}", "mistake"))
        if found.where:
            graph.problems.append(Problem(f"at {found.where}", "mistake"))
    if breaks:
        graph.hint = breaks[0].hint()
        values.problems.append(Problem("not run until the function compiles as one graph",
                                       "not_run"))  # fmt: skip
    else:
        _compare_compiled(fn, args, reference, values)
    result = CheckResult("compiled", [graph, values])
    if not result.passed:
        raise CheckFailed(result)
    print(result.headline)
    return result


def _compare_compiled(fn, args, reference, result: CaseResult) -> None:
    # each run on its own copy of the inputs: a function that changes one in place would
    # otherwise see the previous run's result
    expected = (reference or fn)(*_cloned(args))
    torch.compiler.reset()
    try:
        with compiling_afresh():
            compiled = torch.compile(fn, fullgraph=True, backend=runtime.COMPILE_BACKEND)
            got = compiled(*_cloned(args))
    except Exception as error:  # noqa: BLE001
        result.problems.append(Problem(
            f"compiling raised {type(error).__name__}: {_first_line(str(error))}", "raised"
        ))  # fmt: skip
        result.hint = "read the error above; it names the operation the compiler refused"
        return
    got_leaves, got_structure = pytree.tree_flatten(got)
    expected_leaves, expected_structure = pytree.tree_flatten(expected)
    if got_structure != expected_structure:
        result.problems.append(Problem(
            f"the compiled function returns {got_structure}, eager {expected_structure}",
            "returned",
        ))  # fmt: skip
    for i, (g, e) in enumerate(zip(got_leaves, expected_leaves)):
        if not (isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor)):
            if g != e:
                result.problems.append(Problem(f"output {i}: {g!r}, eager gives {e!r}", "values"))
            continue
        if g.shape != e.shape or g.dtype != e.dtype:
            result.problems.append(Problem(
                f"output {i}: {list(g.shape)} {g.dtype}, eager gives {list(e.shape)} {e.dtype}",
                "layout",
            ))  # fmt: skip
            continue
        tol = tolerance_for(e.dtype)
        if not torch.allclose(g.double(), e.double(), tol.rtol, tol.atol, equal_nan=True):
            worst = (g.double() - e.double()).abs().max().item()
            result.problems.append(Problem(f"output {i} differs by up to {worst:.3g}", "values"))
    if result.problems and result.hint is None:
        result.hint = (
            "compiled code computed something else: an operator's fake must describe exactly "
            "what its real implementation returns"
        )


def _cloned(args: tuple) -> tuple:
    return pytree.tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, args)


@contextlib.contextmanager
def compiling_afresh():
    """Compile in the block without torch's caches of compiled graphs, which live on disk
    and serve later processes too. AOTAutograd's is keyed by Dynamo's graph, Inductor's by
    the graph after it: both name an operator, but hold neither its fake, its schema's
    mutations nor the backward registered on it. An operator fixed and registered again
    under its name would run as the graph compiled for the one before it, even after a
    restart."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with (
        functorch_config.patch(enable_autograd_cache=False),
        inductor_config.patch(fx_graph_cache=False),
    ):
        yield


# -- check_softmax_op ---------------------------------------------------------------------


class NotAnOperator(TypeError):
    """The function given is not a registered operator."""


class NoFake(RuntimeError):
    """The operator has no fake implementation."""


class FakeDisagrees(RuntimeError):
    """The fake implementation describes another output than the real one gives."""


class OutputAliasesInput(RuntimeError):
    """The operator returns its input or a view of it."""


class GraphBreak(RuntimeError):
    """Dynamo could not capture the call in one graph."""


class FakeRuns(RuntimeError):
    """The fake implementation launched a kernel or read values."""


class FakeReturnsNothing(RuntimeError):
    """The fake implementation returned no tensor."""


class CoursesOperator(TypeError):
    """The operator given is the course's own, not the learner's."""


class Recompiled(RuntimeError):
    """A compilation for dynamic shapes served one shape only."""


OPERATOR_HINT = (
    'decorate the function with @torch.library.custom_op("lesson08::softmax", '
    "mutates_args=()) (with type annotations on its argument and result), so that "
    "the compiler sees one operator instead of your launcher's Python. If you did, check "
    "that no later def reuses the name softmax_op: name the fake's function _"
)
FAKE_RETURNS_NOTHING_HINT = "the fake must return its result: return x.new_empty(x.shape)"
NO_FAKE_HINT = (
    "give the operator a fake implementation: @softmax_op.register_fake on a function that "
    "returns an empty tensor of the output's shape, dtype and strides, without running "
    "the kernel. The compiler calls it with fake tensors, which hold no memory"
)
FAKE_HINT = (
    "the fake must describe what the real operator returns, for every input: "
    "x.new_empty(x.shape) is a new contiguous tensor of x's shape and dtype, where "
    "torch.empty_like(x) copies a transposed x's strides. A shape written as numbers fits "
    "one input only"
)
ALIAS_HINT = (
    "an operator must return a new tensor, not its input or a view of it: allocate the "
    "output (x.new_empty(x.shape)) and let the kernel write into it"
)
FAKE_RUNS_HINT = (
    "a fake only allocates and returns its result, as x.new_empty(x.shape) does: it must "
    "not launch the kernel, call the launcher, or read x's values, for fake tensors have none"
)
COURSES_HINT = (
    "register your own launcher: decorate your function that launches softmax_kernel with "
    '@torch.library.custom_op("lesson08::softmax", mutates_args=())'
)
RECOMPILED_HINT = (
    "the fake turned a size into a Python number (int(x.shape[0]), a size written out), "
    "so each new shape compiles again: build its result from x's sizes as they are, "
    "x.new_empty(x.shape)"
)


def _raised(kind: str, message: str) -> str | None:
    hints = {
        NotAnOperator.__name__: OPERATOR_HINT,
        NoFake.__name__: NO_FAKE_HINT,
        FakeDisagrees.__name__: FAKE_HINT,
        OutputAliasesInput.__name__: ALIAS_HINT,
        FakeRuns.__name__: FAKE_RUNS_HINT,
        CoursesOperator.__name__: COURSES_HINT,
        Recompiled.__name__: RECOMPILED_HINT,
        FakeReturnsNothing.__name__: FAKE_RETURNS_NOTHING_HINT,
    }
    if kind == GraphBreak.__name__:
        return GraphBreakFound(message, "").hint()
    return hints.get(kind)


HINTS = dataclasses.replace(SOFTMAX_HINTS, raised=_raised)


def _namespace(op) -> str | None:
    """The namespace an operator is registered in ("lesson08"), None for anything else."""
    name = getattr(op, "_qualname", None) or getattr(getattr(op, "_schema", None), "name", "")
    if isinstance(op, torch._ops.OpOverloadPacket):
        name = op._qualified_op_name
    return name.split("::", 1)[0] if "::" in name else None


def _is_operator(op) -> bool:
    from torch._library.custom_ops import CustomOpDef

    return isinstance(op, (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def _explained(error: Exception) -> Exception:
    """torch's error, as one of this check's own with a one-line message; the exercise's
    stub, where it is what raised underneath (torch.library wraps what a fake raises)."""
    cause = error
    while cause is not None:
        if isinstance(cause, ExerciseNotDone):
            return cause
        cause = cause.__cause__ or cause.__context__
    text = str(error)
    if "no fake impl" in text or "FakeTensor kernel" in text:
        return NoFake("the operator has no fake implementation")
    if "mismatched tensor metadata" in text:
        detail = text.split("mismatched tensor metadata:", 1)[1].split("(scroll up", 1)[0]
        return FakeDisagrees(f"the fake and the real operator disagree: {_first_line(detail)}")
    if "may not alias" in text:
        return OutputAliasesInput("the operator returned its input, or a view of it")
    if (
        isinstance(error, LaunchOnFakeTensors) or "launched with fake tensors" in text
        or "fake tensor" in text or "data pointer" in text or 'device "meta"' in text
    ):  # fmt: skip
        detail = _first_line(text).replace("(scroll up for stack trace)", "").strip()
        return FakeRuns(f"the fake ran on fake tensors what needs real ones: {detail}")
    return error


@contextlib.contextmanager
def _tracing_safely():
    """Suspend the check's guarded tensor factories (a TorchFunctionMode) while the
    compiler traces: they would hand real memory to a fake implementation. Stop a kernel
    launched with fake tensors before it runs. And compile afresh (compiling_afresh)."""
    with (
        torch.overrides._pop_mode_temporarily() as mode,
        refusing_fake_launches(),
        compiling_afresh(),
    ):
        if not isinstance(mode, GuardedArena):
            raise RuntimeError(f"the check expected its GuardedArena on top, found {mode!r}")
        yield


def _run_stage(op: Callable, stage: str) -> Callable:
    def run(x):
        if _namespace(op) == "course" or getattr(op, "__module__", "") == "course_lib.ops":
            raise CoursesOperator("softmax_op is the course's own operator, course::softmax")
        if stage != "eager" and not _is_operator(op):
            raise NotAnOperator(
                f"softmax_op is a plain {type(op).__name__}, not a registered operator"
            )
        try:
            if stage == "eager":
                return op(x)
            with _tracing_safely():
                return _STAGES[stage](op, x)
        except (GraphBreak, FakeDisagrees, Recompiled, FakeReturnsNothing):
            raise
        except Exception as error:  # noqa: BLE001  (torch's own errors, explained)
            explained = _explained(error)
            if explained is error:
                raise
            raise explained from None

    return run


def _opchecked(op, x):
    # four inputs: a fake with the first's sizes written in fails on the second, one that
    # copies x's strides (torch.empty_like) on the third, a column-major x, and one with a
    # dtype written in on the fourth, in float16
    smaller = x[: max(1, x.shape[0] // 2), : max(1, x.shape[1] - 3)]
    inputs = (x, smaller, x.t().contiguous().t(), x.half())
    with FakeTensorMode() as mode:  # what the fake returns, before opcheck compares it
        described = op(mode.from_tensor(x))
    if not isinstance(described, torch.Tensor):
        raise FakeReturnsNothing(f"the fake returned {type(described).__name__}, not a tensor")
    for t in inputs:
        torch.library.opcheck(op, (t,), test_utils=OPCHECK_TESTS)
    return op(x)


# the schema, the fake against the real operator, and the fake under AOTAutograd with
# symbolic sizes, as torch.compile(dynamic=True) runs it
OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _compiled(op, x):
    breaks = graph_breaks(lambda t: op(t), x)
    if breaks:
        where = f" ({breaks[0].where})" if breaks[0].where else ""
        raise GraphBreak(f"{breaks[0].reason}{where}")
    torch.compiler.reset()
    return torch.compile(lambda t: op(t), fullgraph=True, backend=runtime.COMPILE_BACKEND)(x)


def _compiled_dynamic(op, x):
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(runtime.COMPILE_BACKEND)(gm, example_inputs)

    torch.compiler.reset()
    compiled = torch.compile(lambda t: op(t), fullgraph=True, dynamic=True, backend=counting)
    smaller = x[: max(1, x.shape[0] - 2), : max(1, x.shape[1] - 5)].contiguous()
    compiled(smaller)
    out = compiled(x)
    if len(graphs) != 1:
        raise Recompiled(f"two shapes took {len(graphs)} compilations under dynamic=True, not 1")
    return out


_STAGES = {"opcheck": _opchecked, "compiled": _compiled, "dynamic": _compiled_dynamic}


def check_softmax_op(op: Callable) -> CheckResult:
    """Check `op`, your row softmax registered as an operator, for lesson 08: its values
    eagerly on awkward shapes, its fake against its real implementation
    (torch.library.opcheck), and a function calling it compiled with fullgraph=True, for
    one shape and for dynamic shapes."""
    if not callable(op):
        raise TypeError(f"check_softmax_op expects your operator, got {type(op).__name__}")
    gen = case_generator(8)
    rand = lambda *shape, dtype=torch.float32: random_input(gen, shape, dtype, scale=2.0)
    rows = runtime.by_mode(gpu=4096, interpreter=37)
    wider = rand(20, 900)
    eager = [
        Case("eager: 1x1 (one element), float32", (rand(1, 1),)),
        Case("eager: 5x37 (prime sizes), float32", (rand(5, 37),)),
        Case(f"eager: {rows}x781 (rows not a power of two), float32", (rand(rows, 781),)),
        Case("eager: 20x781 (row stride 900), float32", (wider[:, :781],)),
        Case("eager: 37x781, float16", (rand(37, 781, dtype=torch.float16),)),
    ]
    staged = [
        Case("torch.library.opcheck: the fake against the real operator, 4 inputs",
             (rand(9, 100),), kwargs={"stage": "opcheck"}),
        Case("torch.compile(fullgraph=True): no graph break, same values", (rand(7, 300),),
             kwargs={"stage": "compiled"}, expects_launch=False),
        Case("torch.compile(dynamic=True): two shapes, one graph", (rand(11, 257),),
             kwargs={"stage": "dynamic"}, expects_launch=False),
    ]  # fmt: skip
    runs = {stage: _run_stage(op, stage) for stage in ("eager", *_STAGES)}

    def run(x, stage: str = "eager"):
        return runs[stage](x)

    return run_check("softmax_op", run, eager + staged, references.softmax, (), HINTS)


# -- check_softmax_backward ---------------------------------------------------------------


class NoBackward(RuntimeError):
    """lesson08::softmax has no backward registered, or gives no gradient."""


DIAGONAL_HINT = (
    "your gradient keeps only the diagonal of softmax's Jacobian, y * (1 - y) * g: every "
    "output of a row depends on every input of it, so grad_x = y * (g - sum(g * y)), the "
    "sum running over the row"
)
NO_Y_FACTOR_HINT = "grad_x = y * (g - sum(g * y)) over the row: you left out the factor y in front"
SAVED_INPUT_HINT = (
    "your backward read the operator's input x where it needs the output y = softmax(x): "
    "save the output in setup_context, ctx.save_for_backward(output)"
)
G_STRIDES_HINT = (
    "grad_y arrives with strides of its own: read it through stride_gm and stride_gn, "
    "not through y's strides"
)
NO_BACKWARD_HINT = (
    "register the backward on your forward operator: softmax_op.register_autograd(backward, "
    "setup_context=setup_context), with setup_context saving the output and backward "
    "returning softmax_backward(y, grad_y)"
)
BACKWARD_OPERATOR_HINT = (
    'decorate the launcher with @custom_op("lesson08::softmax_backward", mutates_args=()), '
    "with type annotations, and give it a fake: the compiler traces a backward too, and "
    "must find operators there, not a launch"
)


def _backward_raised(kind: str, message: str) -> str | None:
    if kind == NoBackward.__name__:
        return NO_BACKWARD_HINT
    if kind == NotAnOperator.__name__:
        return BACKWARD_OPERATOR_HINT
    return _raised(kind, message)


BACKWARD_HINTS = dataclasses.replace(SOFTMAX_HINTS, raised=_backward_raised)


def _grad_mistakes(through_forward: bool) -> list[KnownMistake]:
    """What the usual wrong backwards compute, from (y, g) or, through the forward, (x, g)."""

    def of(compute):
        if not through_forward:
            return lambda y, g: compute(y.double(), g.double(), y.double())
        return lambda x, g: compute(torch.softmax(x.double(), -1), g.double(), x.double())

    found = [
        KnownMistake(of(lambda y, g, _: y * (1 - y) * g), DIAGONAL_HINT),
        KnownMistake(of(lambda y, g, _: g - (g * y).sum(-1, keepdim=True)), NO_Y_FACTOR_HINT),
    ]
    if through_forward:
        found.append(KnownMistake(
            of(lambda y, g, x: x * (g - (g * x).sum(-1, keepdim=True))), SAVED_INPUT_HINT
        ))  # fmt: skip
    else:
        found.append(KnownMistake(
            lambda y, g: references.softmax_backward(
                y, torch.as_strided(g, g.shape, y.stride(), g.storage_offset())
            ),
            G_STRIDES_HINT,
        ))  # fmt: skip
    return found


def _forward_op():
    """lesson08::softmax, the learner's forward operator, or None."""
    try:
        return torch.ops.lesson08.softmax
    except (AttributeError, RuntimeError):
        return None


def _run_backward_stage(op: Callable, stage: str) -> Callable:
    def run(a, g):
        if not _is_operator(op):
            raise NotAnOperator(f"softmax_backward is a plain {type(op).__name__}")
        if stage == "backward":
            return op(a, g)
        if stage == "opcheck":
            with _tracing_safely():
                for t in (a, a.t().contiguous().t()):
                    torch.library.opcheck(op, (t, g), test_utils=OPCHECK_TESTS)
            return op(a, g)
        forward = _forward_op()
        if forward is None:
            raise NoBackward("lesson08::softmax is not registered: run the first exercise")
        x = a.detach().requires_grad_(True)
        try:
            if stage == "autograd":
                y = forward(x)
                if y.grad_fn is None:
                    raise NoBackward("softmax_op's output has no grad_fn")
                (grad,) = torch.autograd.grad(y, x, g)
                return grad
            with _tracing_safely():
                torch.compiler.reset()
                compiled = torch.compile(lambda t: forward(t), fullgraph=True,
                                         backend=runtime.COMPILE_BACKEND)  # fmt: skip
                (grad,) = torch.autograd.grad(compiled(x), x, g)
                return grad
        except NoBackward:
            raise
        except Exception as error:  # noqa: BLE001  (torch's own errors, explained)
            text = str(error)
            if (
                "register_autograd" in text
                or "autograd kernel" in text
                or "does not require grad" in text
            ):
                raise NoBackward(_first_line(text)) from None
            explained = _explained(error)
            if explained is error:
                raise
            raise explained from None

    return run


def check_softmax_backward(op: Callable) -> CheckResult:
    """Check `op`, your softmax backward registered as lesson08::softmax_backward(y,
    grad_y), for lesson 08: its values on awkward shapes and strides, its fake
    (torch.library.opcheck), and the gradient lesson08::softmax gives once the backward is
    registered on it, eagerly and compiled with fullgraph=True."""
    if not callable(op):
        raise TypeError(f"check_softmax_backward expects your operator, got {type(op).__name__}")
    gen = case_generator(9)
    rand = lambda *shape, dtype=torch.float32: random_input(gen, shape, dtype, scale=2.0)  # noqa: E731

    def softmaxed(*shape, dtype=torch.float32):
        return torch.softmax(rand(*shape).double(), -1).to(dtype)

    def off_zero(*shape, scale):
        # x and grad_y of mean 1, which softmax's gradient ignores: a backward that read x
        # computes x * (g - sum(g * x)), and at mean 0 some row sums fall among the g,
        # where that difference cancels and the sum's float32 rounding, in a GPU's order,
        # leaves the tolerance that recognises the mistake
        return random_input(gen, shape, scale=scale, shift=1.0)

    def case(label, a, g, stage, through_forward=False, **options):
        reference = (
            (lambda x, g: references.softmax_backward(torch.softmax(x.double(), -1), g).to(x.dtype))
            if through_forward else references.softmax_backward
        )  # fmt: skip
        return Case(f"{label}", (a, g), kwargs={"stage": stage}, reference=reference,
                    mistakes=_grad_mistakes(through_forward), input_names=("y", "grad_y"),
                    **options)  # fmt: skip

    rows = runtime.by_mode(gpu=4096, interpreter=37)
    g_wide = rand(20, 900)
    cases = [
        case("backward: 1x5 (one row), float32", softmaxed(1, 5), rand(1, 5), "backward"),
        case("backward: 5x37 (prime sizes), float32", softmaxed(5, 37), rand(5, 37), "backward"),
        case(f"backward: {rows}x781, float32", softmaxed(rows, 781), rand(rows, 781),
             "backward"),
        case("backward: 20x781, grad_y of row stride 900, float32", softmaxed(20, 781),
             g_wide[:, :781], "backward"),
        case("backward: 33x300, grad_y column-major, float32", softmaxed(33, 300),
             rand(300, 33).t(), "backward"),
        case("backward: 37x781, float16", softmaxed(37, 781, dtype=torch.float16),
             rand(37, 781, dtype=torch.float16), "backward"),
        case("torch.library.opcheck: the fake against the real operator", softmaxed(9, 100),
             rand(9, 100), "opcheck"),
        case("softmax_op's gradient, eager: 7x300", off_zero(7, 300, scale=2.0),
             off_zero(7, 300, scale=1.0), "autograd", through_forward=True),
        case("softmax_op's gradient, compiled with fullgraph=True: 11x257",
             off_zero(11, 257, scale=2.0), off_zero(11, 257, scale=1.0), "compiled",
             through_forward=True, expects_launch=False),
    ]  # fmt: skip
    runs = {stage: _run_backward_stage(op, stage)
            for stage in ("backward", "opcheck", "autograd", "compiled")}  # fmt: skip

    def run(a, g, stage: str = "backward"):
        return runs[stage](a, g)

    return run_check("softmax_backward", run, cases, references.softmax_backward, (),
                     BACKWARD_HINTS, _refine_backward)  # fmt: skip


def _refine_backward(cases, results: list[CaseResult]) -> None:
    """A mistake named in one case is the likely cause of the vaguer failures of others."""
    named = (DIAGONAL_HINT, NO_Y_FACTOR_HINT, SAVED_INPUT_HINT, G_STRIDES_HINT)
    found = next((r.hint for r in results if r.hint in named), None)
    for result in results:
        if found and not result.passed and result.hint == BACKWARD_HINTS.wrong_values:
            result.hint = found


# -- check_add_into -----------------------------------------------------------------------


class UndeclaredMutation(RuntimeError):
    """The operator writes into an argument its schema does not declare as mutated."""


class ReturnsAValue(TypeError):
    """An operator that writes its result into `out` returned something."""


UNDECLARED_HINT = (
    "the operator writes into out, and its schema does not say so: declare it with "
    'mutates_args=("out",). A compiler believes the schema: an operator that returns nothing '
    "and mutates nothing does nothing, and compiled code drops the call"
)
RETURNS_A_VALUE_HINT = (
    "an operator that writes its result into out returns nothing: annotate it -> None and "
    "return nothing; returning out would make its output an alias of an input"
)
ADD_INTO_OPERATOR_HINT = (
    'register_add_into must return the operator: custom_op("lesson08::add_into", '
    "mutates_args=...)(add_into_impl), with its fake registered, not the plain function"
)


def _add_into_raised(kind: str, message: str) -> str | None:
    own = {
        UndeclaredMutation.__name__: UNDECLARED_HINT,
        ReturnsAValue.__name__: RETURNS_A_VALUE_HINT,
        NotAnOperator.__name__: ADD_INTO_OPERATOR_HINT,
    }
    return own.get(kind) or _raised(kind, message)


ADD_INTO_HINTS = dataclasses.replace(Hints(), raised=_add_into_raised)


def _run_add_into(operator: Callable, stage: str) -> Callable:
    def run(x, y):
        op = operator()
        if not _is_operator(op):
            raise NotAnOperator(f"register_add_into returned a plain {type(op).__name__}")
        out = torch.empty_like(x)
        if stage == "eager":
            if op(x, y, out) is not None:
                raise ReturnsAValue("add_into returned a value")
            return out
        try:
            with _tracing_safely():
                if stage == "opcheck":
                    torch.library.opcheck(op, (x, y, out), test_utils=OPCHECK_TESTS)
                    op(x, y, out)
                    return out

                def add_twice(x, y):
                    out = torch.empty_like(x)
                    op(x, y, out)
                    return out * 2

                torch.compiler.reset()
                compiled = torch.compile(add_twice, fullgraph=True, backend=runtime.COMPILE_BACKEND)
                return compiled(x, y) / 2
        except Exception as error:  # noqa: BLE001  (torch's own errors, explained)
            if "not defined as mutable but was mutated" in str(error):
                raise UndeclaredMutation(_first_line(str(error))) from None
            explained = _explained(error)
            if explained is error:
                raise
            raise explained from None

    return run


def check_add_into(register: Callable) -> CheckResult:
    """Check `register()`, which registers your addition into an output as
    lesson08::add_into(x, y, out) and returns the operator (or the operator itself), for
    lesson 08: its values, its schema and fake (torch.library.opcheck), and a function that
    calls it on a tensor it allocates, compiled with fullgraph=True."""
    if not callable(register):
        raise TypeError(f"check_add_into expects your function, got {type(register).__name__}")
    registered = []

    def operator():
        if not registered:  # once: registering again would replace the operator
            registered.append(register if _is_operator(register) else register())
        return registered[0]

    gen = case_generator(10)
    pair = lambda n: (random_input(gen, (n,)), random_input(gen, (n,)))  # noqa: E731
    cases = [
        Case("eager: 1 element", pair(1), kwargs={"stage": "eager"}),
        Case("eager: 1000 elements, not a multiple of the block", pair(1000),
             kwargs={"stage": "eager"}),
        Case("torch.library.opcheck: the schema and the fake", pair(300),
             kwargs={"stage": "opcheck"}),
        Case("torch.compile(fullgraph=True): a function that allocates out, calls the "
             "operator and reads out", pair(777), kwargs={"stage": "compiled"},
             expects_launch=False),
    ]  # fmt: skip
    runs = {stage: _run_add_into(operator, stage) for stage in ("eager", "opcheck", "compiled")}

    def run(x, y, stage: str = "eager"):
        return runs[stage](x, y)

    return run_check("add_into", run, cases, torch.add, (), ADD_INTO_HINTS, _refine_add_into)


def _refine_add_into(cases, results: list[CaseResult]) -> None:
    """An undeclared mutation shows in opcheck; compiled, it shows only as wrong values."""
    if any(r.hint == UNDECLARED_HINT for r in results):
        for result in results:
            vague = (Hints().wrong_values, Hints().zeros, Hints().read_past_end)
            if not result.passed and result.hint in vague:
                result.hint = UNDECLARED_HINT
