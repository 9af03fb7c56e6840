"""The trusted side of grading: the course's own lesson, and what a submission may add to it.

A lesson notebook (from notebooks/, never from a submission) fixes every cell. A
submission contributes only the sources of its answer cells (nbgrader ``solution: true``),
matched to the lesson's by grade_id. The check cells are the lesson's: each must read
``course_lib.check_<topic>(<function>)``, from which the grader knows what to check.

The answers are also read here, as text, before anything runs: an answer that imports
the course's finished kernels or reaches into the checker scores nothing, and what cannot
be proved either way (torch in the launcher, file or process access) is flagged for the
instructor. Whether PyTorch computed a result is decided while it runs (watch.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_lib.grader.files import Unusable, read_regular


class LessonError(ValueError):
    """The course's own lesson notebook is not one the grader can use."""


class SubmissionError(ValueError):
    """A submission file cannot be read as a notebook."""


@dataclass(frozen=True)
class Exercise:
    grade_id: str  # the check cell's
    points: float
    checker: str  # a name in course_lib, e.g. "check_vector_add"
    function: str  # the learner's function it checks, e.g. "add"
    answer_ids: tuple[str, ...]  # the answer cells since the previous check
    # whether the course's answer cells define a @triton.jit kernel; False where the answer
    # joins kernels written before (an autograd.Function over them, say)
    writes_kernel: bool = True
    # the names the lesson's setup cells before it bind to modules, as (name, module):
    # ("ops", "course_lib.ops") after `from course_lib import ops`
    module_names: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Lesson:
    name: str  # e.g. "01_vector_add"
    cells: tuple[dict, ...]  # each {"kind": "setup" | "answer" | "check", "source", "grade_id"}
    exercises: tuple[Exercise, ...]


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _check_call(source: str, where: str) -> tuple[str, str]:
    """The checker and function of a check cell: ``course_lib.check_x(fn)``."""
    try:
        body = ast.parse(source).body
    except SyntaxError as error:
        raise LessonError(f"{where}: the check cell does not parse: {error}") from None
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "course_lib"
        and call.func.attr.startswith("check_")
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and not call.keywords
    ):
        raise LessonError(f"{where}: a check cell must read course_lib.check_<topic>(<function>)")
    return call.func.attr, call.args[0].id


def _module_names(source: str) -> dict[str, str]:
    """The names a cell's imports bind, each to the module it stands for."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    names[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return names


def load_lesson(path: Path) -> Lesson:
    """Read a course lesson notebook: its code cells in order, and its exercises."""
    nb = nbformat.read(path, as_version=4)
    cells, exercises, answers, writes_kernel = [], [], [], False
    module_names: dict[str, str] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        where = f"{path.name}, cell {index} ({grade_id or 'no grade_id'})"
        if meta.get("solution"):
            cells.append({"kind": "answer", "source": cell.source, "grade_id": grade_id})
            answers.append(grade_id)
            writes_kernel = writes_kernel or "@triton.jit" in cell.source
        elif meta.get("grade"):
            checker, function = _check_call(cell.source, where)
            points = float(meta.get("points", 0))
            exercises.append(Exercise(
                grade_id, points, checker, function, tuple(answers), writes_kernel,
                tuple(module_names.items()),
            ))  # fmt: skip
            cells.append({"kind": "check", "source": cell.source, "grade_id": grade_id})
            answers, writes_kernel = [], False
        else:
            cells.append({"kind": "setup", "source": cell.source, "grade_id": None})
            module_names |= _module_names(cell.source)
    if not exercises:
        raise LessonError(f"{path}: no graded check cell; is this a lesson notebook?")
    ids = [e.grade_id for e in exercises] + [c["grade_id"] for c in cells if c["kind"] == "answer"]
    if None in ids or len(set(ids)) != len(ids):
        raise LessonError(f"{path}: every answer and check cell needs its own grade_id")
    return Lesson(path.stem, tuple(cells), tuple(exercises))


@dataclass
class Answers:
    """What a submission contributes: the source of each answer cell, by grade_id."""

    sources: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the instructor


NOTEBOOK_CAP = 64 * 1024 * 1024  # bytes: a lesson's notebook with its outputs is far less


def read_answers(lesson: Lesson, submission: Path) -> Answers:
    try:
        data = read_regular(str(submission), NOTEBOOK_CAP)
        if data is None:
            raise FileNotFoundError(submission)
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except Unusable as error:
        raise SubmissionError(f"not a readable notebook: {error}") from None
    except Exception as error:  # noqa: BLE001  (any unreadable file is the same finding)
        raise SubmissionError(f"not a readable notebook: {type(error).__name__}") from None
    found: dict[str, list[str]] = {}
    for cell in nb.get("cells", []):
        meta = _nbgrader(cell)
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            found.setdefault(str(meta["grade_id"]), []).append(str(cell.get("source", "")))
    answers = Answers()
    for grade_id in (c["grade_id"] for c in lesson.cells if c["kind"] == "answer"):
        sources = found.get(grade_id)
        if not sources:
            answers.missing.append(grade_id)
            continue
        if len(sources) > 1:
            answers.notes.append(f"{len(sources)} cells carry grade_id {grade_id}; the last graded")
        answers.sources[grade_id] = sources[-1]
    return answers


# --- reading an answer before it runs ------------------------------------------------------

# modules an answer must not reach: the finished kernels, and what decides or records grades
FORBIDDEN_MODULES = (
    "course_lib.kernels",
    "course_lib.ops",  # the finished kernels as operators (lesson 08)
    "torch.ops.course",
    "course_lib.checks",
    "course_lib.grader",
    "course_lib.builder",
    "course_lib.recordings",
    "course_lib.interpreter_guard",
    # what the grader's watch of PyTorch (grader/watch.py) is made of
    "torch.utils._python_dispatch",
    "torch._C._TorchDispatchModeKey",
)
# what a check runs on in the learner's process: an answer must not replace any of it
PROTECTED_ATTRIBUTES = ("course_lib", "torch.library", "torch._dynamo", "torch.compile",
                        "torch.compiler", "torch.testing", "triton.testing")  # fmt: skip
# names the lessons' setup cells bind to modules
MODULE_NAMES = {"torch", "triton", "tl", "F", "np", "numpy", "course_lib", "math"}
# a Triton exercise needs none of these; their use is legal Python but worth a look
SUSPECT_MODULES = ("os", "sys", "subprocess", "importlib", "builtins", "ctypes", "shutil",
                   "socket", "pathlib", "inspect", "gc", "pickle", "signal", "threading",
                   "multiprocessing", "io")  # fmt: skip
SUSPECT_NAMES = ("__import__", "exec", "eval", "compile", "open", "globals", "locals", "vars",
                 "setattr", "delattr", "__builtins__", "breakpoint")  # fmt: skip
# torch calls a launcher makes to allocate and inspect; any other computes outside a kernel
ALLOCATING = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full",
              "full_like", "ones", "ones_like", "device", "dtype", "Size", "finfo", "iinfo",
              "is_tensor", "promote_types", "result_type")  # fmt: skip


@dataclass
class Review:
    """What reading an exercise's answers found: reasons to score 0, and flags."""

    forbidden: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def _is_jit(node: ast.AST) -> bool:
    """A decorator naming triton.jit (or jit), bare or called."""
    target = node.func if isinstance(node, ast.Call) else node
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "jit"


def _registers(decorator: ast.AST) -> bool:
    """A decorator that registers the function as an operator, or adds to one: custom_op,
    triton_op, register_fake, register_autograd, ..."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = _dotted(target).rsplit(".", 1)[-1]
    return name in ("custom_op", "triton_op") or name.startswith("register_")


def _assigned(node: ast.AST) -> list[ast.AST]:
    """The targets an assignment statement writes to."""
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in _flattened(target)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return _flattened(node.target)
    return []


def _resolved(dotted: str, module_names: dict[str, str]) -> str:
    """`ops.softmax` as `course_lib.ops.softmax` where a setup cell bound ops to it."""
    root, _, rest = dotted.partition(".")
    if root not in module_names:
        return dotted
    return f"{module_names[root]}.{rest}" if rest else module_names[root]


def _imported(trees: list[ast.AST]) -> set[str]:
    """The names the answers' own imports bind."""
    names = set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _flattened(target: ast.AST) -> list[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flattened(element)]
    return [target]


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def review(exercise: Exercise, sources: dict[str, str]) -> Review:
    """Read the answers of one exercise (all of them as one program) without running them."""
    found = Review()
    trees = []
    for grade_id in exercise.answer_ids:
        try:
            trees.append(ast.parse(sources.get(grade_id, "")))
        except SyntaxError as error:
            found.forbidden.append(f"{grade_id} does not parse: line {error.lineno}: {error.msg}")
    if found.forbidden:
        return found
    jitted, launched, defined = set(), set(), False
    # names the setup cells bound to modules, unless the answer binds them anew
    imported = _imported(trees)
    rebound = imported | {
        _dotted(t) for tree in trees for node in ast.walk(tree) for t in _assigned(node)
    }
    setup_names = {n: m for n, m in exercise.module_names if n not in rebound}
    for tree in trees:
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Attribute):
                modules = [_resolved(_dotted(node), setup_names)]
            for module in modules:
                if any(module == m or module.startswith(m + ".") for m in FORBIDDEN_MODULES):
                    found.forbidden.append(f"the answer uses {module}: write your own kernel")
                elif module.split(".")[0] in SUSPECT_MODULES and isinstance(
                    node, (ast.Import, ast.ImportFrom)
                ):
                    found.flags.append(f"imports {module}")
            if isinstance(node, ast.Name) and node.id in SUSPECT_NAMES:
                found.flags.append(f"uses {node.id}")
            for target in _assigned(node):
                name = _dotted(target)
                if any(name == p or name.startswith(p + ".") for p in PROTECTED_ATTRIBUTES):
                    found.forbidden.append(f"the answer replaces {name}, which checks rely on")
                elif "." in name and name.split(".")[0] in MODULE_NAMES | imported:
                    found.flags.append(f"assigns to {name}")
            if isinstance(node, ast.FunctionDef) and any(map(_is_jit, node.decorator_list)):
                jitted.add(node.name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                launched.add(_dotted(node.func.value))
            if isinstance(node, ast.FunctionDef) and node.name == exercise.function:
                defined = True
                found.flags += _computes_outside_kernels(node)
                if torch_result := _returns_torch_result(node):  # watch.py decides
                    found.flags.append(f"{exercise.function} seems to return {torch_result}")
    if not defined:
        found.flags.append(f"defines no function {exercise.function} of its own")
    # an exercise that joins kernels written before has no kernel of its own to launch
    if exercise.writes_kernel and not jitted:
        found.flags.append("defines no @triton.jit kernel in its answer")
    elif exercise.writes_kernel and not jitted & launched:
        found.flags.append("launches none of its @triton.jit kernels with kernel[grid](...)")
    found.flags = list(dict.fromkeys(found.flags))  # once each, in order
    found.forbidden = list(dict.fromkeys(found.forbidden))
    return found


def _computes_outside_kernels(launcher: ast.FunctionDef) -> list[str]:
    """torch arithmetic in the launcher itself: the result may not come from the kernel.
    Decorators too, except those that register it (@torch.library.custom_op(...)), which
    compute nothing."""
    flags = []
    decorators = [d for d in launcher.decorator_list if not _registers(d)]
    statements = [*decorators, *launcher.body]
    for node in (inner for statement in statements for inner in ast.walk(statement)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            head, _, last = name.rpartition(".")
            if head.split(".")[0] in ("torch", "F", "np", "numpy") and last not in ALLOCATING:
                flags.append(f"the launcher calls {name}: does the kernel compute the result?")
            elif last in ("numpy", "__array__"):  # a NumPy view, written where no op is seen
                flags.append(f"the launcher calls {name}(): does the kernel compute the result?")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            flags.append("the launcher multiplies matrices with @ outside the kernel")
    return flags


# tensor methods that compute a result (a launcher allocates, views and launches instead)
_COMPUTING_METHODS = ("add", "sub", "mul", "div", "relu", "softmax", "exp", "sum", "max", "min",
                      "matmul", "mm", "bmm", "t_", "clamp", "where", "sigmoid", "tanh",
                      "transpose", "permute", "addmm", "leaky_relu", "neg", "abs", "copy_",
                      "add_", "mul_", "clone", "contiguous")  # fmt: skip


def _torch_expression(node: ast.AST, params: set[str], computed: set[str]) -> str | None:
    """The source of `node` if it computes a tensor with PyTorch from the inputs: tensor
    arithmetic on them (``x + y``), a torch function other than an allocation, or a
    computing method (``x.add(y)``). Arithmetic on sizes (``x.numel() * 2``) is not."""
    tensors = params | computed

    def computes(sub: ast.AST) -> bool:
        if isinstance(sub, ast.Name):
            return sub.id in computed
        if isinstance(sub, ast.BinOp) and any(
            isinstance(side, ast.Name) and side.id in tensors for side in (sub.left, sub.right)
        ):
            return True
        if isinstance(sub, ast.Call):
            head, _, last = _dotted(sub.func).rpartition(".")
            if head.split(".")[0] in ("torch", "F"):
                return last not in ALLOCATING  # an allocation's arguments are sizes
            if head in tensors and last in _COMPUTING_METHODS:
                return True
        return any(computes(child) for child in ast.iter_child_nodes(sub))

    return ast.unparse(node) if computes(node) else None


def _returns_torch_result(launcher: ast.FunctionDef) -> str | None:
    """What the launcher returns, if that is a tensor PyTorch computed from its inputs
    (``return x + y``, ``out = torch.add(x, y); return out``) rather than a kernel's output.
    Integer arithmetic on sizes is fine: only names of parameters and computed tensors count.
    """
    params = {a.arg for a in launcher.args.args + launcher.args.kwonlyargs}
    computed: set[str] = set()
    for node in ast.walk(launcher):
        if isinstance(node, ast.Assign) and _torch_expression(node.value, params, computed):
            computed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(launcher):
        if isinstance(node, ast.Return) and node.value is not None:
            if isinstance(node.value, ast.Name) and node.value.id in params:
                continue  # returning an input is the checker's to name
            if found := _torch_expression(node.value, params, computed):
                return found
    return None
