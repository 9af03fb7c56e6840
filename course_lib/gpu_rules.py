"""Warn in the interpreter about kernels that a GPU compile would reject.

Triton's interpreter runs a kernel's Python body with NumPy, so it accepts code that
the GPU compiler refuses: ``tl.exp`` of a float16 block, a Python ``if`` on a whole
block, and whatever else the installed Triton's front end rules out. A learner
without a GPU would only find out on their first GPU run.

The compiler's front end, which turns a kernel into Triton IR, needs no GPU. So before
each interpreted launch of a kernel with a new signature, ``check_launch`` runs that
front end for a generic NVIDIA target and, if it refuses the kernel, issues a
``GPUCompileWarning`` with the compiler's message, where in the kernel, and how to fix
the common cases. The kernel then runs in the interpreter as before.

Triton's front end is reached through course_lib.triton_internals (``gpu_front_end``);
where it differs from what that module expects, the check switches itself off and kernels
run without it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path

from course_lib import triton_internals
from course_lib.triton_internals import CompilationError, CompileTimeAssertionFailure

# what the compiler says -> what to do about it
_FIXES = (
    (
        "Expected dtype ['fp32', 'fp64']",
        "this math function takes float32 or float64 on a GPU: compute in float32 "
        "(x.to(tl.float32)) and convert back when you store",
    ),
    (
        "Input shapes should have",
        "every tl.dot on a GPU needs its inner side K (BLOCK_K) at least 16, 32 for 8-bit "
        "inputs; its M and N may be smaller, though the tensor cores then compute padding",
    ),
    (
        "Boolean value of Tensor with more than one value is ambiguous",
        "a Python `if` (or `and`, `or`, `not`) needs one scalar; for a block, choose per "
        "element with tl.where(condition, a, b) or mask the load and store",
    ),
)


class GPUCompileWarning(UserWarning):
    """The interpreter ran a kernel that a GPU compile of it would refuse."""


class GPURefused(RuntimeError):
    """A check's call launched a kernel that a GPU compile would refuse."""


def refusing(fn):
    """fn, raising GPURefused with the compiler's reason after a call whose kernels a GPU
    would not compile: what a checker wraps a learner's launcher in, in the interpreter."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with refusals() as found:
            out = fn(*args, **kwargs)
        if found:
            raise GPURefused(found[0])
        return out

    return run


# every (kernel, signature) warns once: a checker launches the same kernel many times
warnings.simplefilter("always", GPUCompileWarning)
_seen: set = set()
_enabled = True
# what the compiler said about each (kernel, signature) it refused, for refusals()
_refused: dict = {}
_collectors: list[list[str]] = []


@contextlib.contextmanager
def refusals():
    """Collect the refusal of every launch inside the block, warned before or not: a
    checker fails a kernel that a GPU would not compile, though the interpreter runs it."""
    found: list[str] = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


def _report(message: str) -> None:
    for found in _collectors:
        if message not in found:
            found.append(message)


def check_launch(fn, args: tuple, kwargs: dict) -> None:
    """Compile `fn` for a GPU target as far as Triton IR; warn if the compiler refuses it."""
    global _enabled
    if not _enabled:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's own notices about its defaults
        try:
            key, compile_for_gpu = triton_internals.gpu_front_end(fn, args, kwargs)
        except Exception:
            return  # an argument the signature builder does not know: nothing to say
        if key in _seen:
            if key in _refused:
                _report(_refused[key])
            return
        _seen.add(key)
        try:
            compile_for_gpu()
            return
        except CompileTimeAssertionFailure:
            return  # a failed tl.static_assert: the interpreter raises it with its message
        except CompilationError as error:
            refused = error
        except Exception:
            _enabled = False  # internals differ in this Triton: stay quiet from now on
            return
    message = _message(fn, refused)
    _refused[key] = message
    _report(message)
    if (fn, message) not in _seen:  # the same refusal at another dtype says nothing new
        _seen.add((fn, message))
        warnings.warn(message, GPUCompileWarning, stacklevel=_launch_level())


def _launch_level() -> int:
    """The stacklevel of the first caller outside Triton and course_lib: the line that
    launched the kernel, which is where the warning is shown."""
    import triton

    inside = (str(Path(triton.__file__).parent), str(Path(__file__).parent))
    frame, level = sys._getframe(1), 1  # check_launch, which calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _message(fn, error) -> str:
    said = (getattr(error, "error_message", None) or str(error)).strip().splitlines()
    reason = said[-1] if said else type(error).__name__
    where = ""
    node = getattr(error, "node", None)
    if node is not None and getattr(error, "src", None):
        line = error.src.splitlines()[node.lineno - 1].strip()
        where = f" at `{line}`"
    fix = next((hint for needle, hint in _FIXES if needle in reason), None)
    text = (
        f"`{fn.__name__}` runs in the interpreter, but a GPU compile rejects it{where}: {reason}."
    )
    return text + (f" Fix: {fix}." if fix else "")
