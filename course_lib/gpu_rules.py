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

This relies on internals of ``triton.compiler`` and ``triton.runtime.jit``; where
those differ, the check switches itself off and kernels run without it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
import warnings
from pathlib import Path

# sm_80: the oldest architecture every current Triton feature the course uses compiles for
_TARGET = ("cuda", 80, 32)

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
    from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's own notices about its defaults
        try:
            source, key = _front_end_source(fn, args, kwargs)
        except Exception:
            return  # an argument the signature builder does not know: nothing to say
        if key in _seen:
            if key in _refused:
                _report(_refused[key])
            return
        _seen.add(key)
        try:
            _make_ir(source)
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


def _front_end_source(fn, args, kwargs):
    """The ASTSource a GPU launch of `fn` with these arguments would compile, and a key."""
    from triton.compiler.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature

    jit_fn = _as_jit(fn)
    backend = _backend()
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    key = (fn, str(specialization), str(sorted(constexprs.items())))
    return (ASTSource(jit_fn, signature, constexprs, attrs), options), key


@functools.cache
def _backend():
    """Triton's CUDA backend for the generic target: no GPU needed to build it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget(*_TARGET))


_jitted: dict = {}


def _as_jit(fn):
    """A JITFunction of `fn` whose globals hold JITFunctions where the interpreter put
    its own wrappers, so that calls to other @triton.jit helpers compile too."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if fn not in _jitted:
        _jitted[fn] = None  # a helper that calls itself resolves to the plain function
        names = fn.__code__.co_names
        globals_ = dict(fn.__globals__)
        for name in names:
            value = globals_.get(name)
            if isinstance(value, InterpretedFunction):
                globals_[name] = _as_jit(value.fn)
        rebound = types.FunctionType(
            fn.__code__, globals_, fn.__name__, fn.__defaults__, fn.__closure__
        )
        rebound.__annotations__ = fn.__annotations__
        rebound.__kwdefaults__ = fn.__kwdefaults__
        rebound.__module__ = fn.__module__
        _jitted[fn] = JITFunction(rebound)
    return _jitted[fn]


@contextlib.contextmanager
def _library_as_jit():
    """Under TRITON_INTERPRET=1, Triton's own @jit library functions (tl.max, tl.sum,
    tensor.sum, ...) are interpreter wrappers, and builtins such as tl.program_id may
    still hold the interpreter's patches from a launch. Compile against the originals."""
    from triton.language import core
    from triton.runtime import interpreter

    owners = [m for name, m in sys.modules.items() if name.startswith("triton.language")]
    owners += [core.tensor, getattr(core, "tensor_descriptor_base", core.tensor)]
    saved = []
    for owner in owners:
        for name, value in list(vars(owner).items()):
            if isinstance(value, interpreter.InterpretedFunction):
                original = _as_jit(value.fn)
            elif getattr(value, "__module__", None) == interpreter.__name__ and "member" in (
                getattr(value, "__kwdefaults__", None) or {}
            ):
                original = value.__kwdefaults__["member"]  # _patch_attr's wrapper
            else:
                continue
            saved.append((owner, name, value))
            setattr(owner, name, original)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _make_ir(source_and_options) -> None:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget

    source, options = source_and_options
    backend = _backend()
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = dict(backend.get_codegen_implementation(options))
    if "min_dot_size" in codegen:
        codegen["min_dot_size"] = _oldest_dot_size(codegen["min_dot_size"])
    with _library_as_jit():
        source.make_ir(
            GPUTarget(*_TARGET),
            options,
            codegen,
            backend.get_module_map(),
            context,
        )


def _oldest_dot_size(newest):
    """tl.dot's least sizes [m, n, k] as the strictest supported Triton sets them: 3.6 (the
    GPU's) asks K >= 16 of every dtype but 8-bit (32), where 3.9 lets float32 through at 8."""

    def least(lhs_type, rhs_type):
        m, n, k = newest(lhs_type, rhs_type)
        bits = lhs_type.scalar.primitive_bitwidth
        return m, n, max(k, 32 if bits == 8 else 16)

    return least
