"""Triton's internals, reached from this module only. Written for triton 3.6 (compiled, on
the GPU) and 3.9 (its interpreter, on the CPU); the rest of the course asks through the
names below and never imports Triton's runtime, compiler, backends, tools or knobs itself.

What is relied on, by who asks for it:

- Every launch goes through a `run(*args, grid=..., warmup=..., **kwargs)` method:
  `JITFunction.run` compiles and launches, `InterpretedFunction.run` interprets, and an
  `Autotuner`'s or `Heuristics`' `run` chooses options before calling its kernel's. The
  checkers count and inspect launches, and the grader's watch steps aside for them, by
  wrapping those methods for a block (`wrapping_launches`); an autotuner's `configs`,
  `best_config` and `arg_names` are read as they are.
- Lean launches (course_lib.kernels._launch): the `CompiledKernel` that `kernel[grid](...)`
  returns is launched again by calling its `run` as Triton does: grid x, y, z, stream,
  `function`, `packed_metadata`, launch metadata, the enter and exit hooks, then every
  parameter in order, constexprs included (`compiled_launch`); the hooks in
  `triton.knobs.runtime` that a profiler sets, and the active driver's current device and
  stream (`direct_launches`, `current_stream`); `TensorDescriptor`'s fields (`descriptor`).
- Tiles taken from a measured table (course_lib.kernels.tile_table): an autotuner's
  `keys`, `arg_names`, `configs`, `base_fn` (the kernel it tunes), its `cache` of choices
  by key (the key's values in `keys` order, then the dtype of each argument that has
  one) and the `configs_timings` of its last tuning (`tuning_key`, `settle`,
  `last_timings`).
- Loading a kernel compiled without a launch, to read its registers:
  `CompiledKernel._init_handles` (`load_on_gpu`).
- The interpreter (course_lib.interpreter_guard): `InterpreterBuilder.create_masked_load`
  and `create_masked_store` (every tl.load and tl.store ends there), `GridExecutor.__call__`
  and `_init_args_hst` (a launch, and its arguments copied to the host), an interpreter
  tensor's `.data` and `get_element_ty()`, `_get_np_dtype`, `interpreter_builder.grid_idx`
  (`hook_interpreter`, `addresses_reached`, `current_program`).
- The compiler's front end (course_lib.gpu_rules): `create_function_from_signature`,
  `JITFunction._pack_args`, `ASTSource.make_ir`, `make_backend` and `GPUTarget`, the IR
  context and dialects, the backend's codegen implementation and module map, and the
  errors it raises (`gpu_front_end`); and how the interpreter wraps `triton.language`'s own
  @jit functions and builtins (`InterpretedFunction`, `_patch_attr`'s `member`), undone
  while compiling.

Where these differ from what is expected, the part that asks goes without: launches go
through `kernel[grid]`, the interpreter runs unguarded, the GPU-rules check turns itself
off; none of them stops a kernel from running.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
from collections.abc import Callable, Hashable, Iterator

import numpy as np
import torch
from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
from triton.runtime import interpreter
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["KERNEL_CLASSES", "TUNER_CLASSES", "Autotuner", "CompilationError",
           "CompileTimeAssertionFailure", "JITFunction", "TensorDescriptor", "addresses_reached",
           "compiled_launch", "current_program", "current_stream", "descriptor", "direct_launches",
           "gpu_front_end", "hook_interpreter", "last_timings", "load_on_gpu", "settle",
           "tuning_key", "wrapping_launches"]  # fmt: skip

# --- launches ---------------------------------------------------------------------------

# the classes whose run() launches a kernel: compiled for the GPU, or in the interpreter
KERNEL_CLASSES: tuple[type, ...] = (JITFunction, InterpretedFunction)
# the classes whose run() chooses a kernel's options (timing them), then calls its run()
TUNER_CLASSES: tuple[type, ...] = (Autotuner, Heuristics)


@contextlib.contextmanager
def wrapping_launches(
    wrap: Callable[[Callable], Callable], classes: tuple[type, ...] = KERNEL_CLASSES
) -> Iterator[None]:
    """For the block, each class's own `run(self, *args, **kwargs)` (grid and warmup among
    the keywords) is `wrap(run)`: every launch of a kernel (of an autotuner, with
    TUNER_CLASSES) goes through it. The methods are restored after the block; blocks nest."""
    originals = {cls: cls.__dict__["run"] for cls in classes}
    for cls, run in originals.items():
        cls.run = wrap(run)
    try:
        yield
    finally:
        for cls, run in originals.items():
            cls.run = run


def direct_launches() -> tuple[object, object] | None:
    """What launching a compiled kernel straight from Python needs: `triton.knobs.runtime`,
    whose `launch_enter_hook` and `launch_exit_hook` a profiler sets (each a chain whose
    `calls` are its listeners), and Triton's driver, whose `active` gives the current
    device and stream. None where they are not as expected: launch through kernel[grid]."""
    try:
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.driver import driver

        hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if not all(hasattr(h, "calls") for h in hooks) or not hasattr(CompiledKernel, "run"):
            return None
        return knobs.runtime, driver
    except (ImportError, AttributeError):
        return None


def compiled_launch(compiled) -> tuple[Callable, int, object]:
    """(launcher, function, packed metadata) of the CompiledKernel that kernel[grid](...)
    returned: `launcher(gx, gy, gz, stream, function, packed_metadata, None, None, None,
    *parameters)` launches it again, parameters in order, constexprs included."""
    return compiled.run, compiled.function, compiled.packed_metadata


def load_on_gpu(compiled) -> None:
    """Load a kernel compiled by warmup() on the GPU, as its first launch would: its
    `n_regs` and `n_spills` are known from then on."""
    compiled._init_handles()


def current_stream(device: int) -> int:
    """The handle of the stream that Triton launches on for this GPU (torch's current one)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(device)


_this_thread = threading.local()


def descriptor(t, shape, strides, block_shape: list) -> TensorDescriptor:
    """TensorDescriptor(t, shape, strides, block_shape) with zero padding, for a `t` whose
    caller has checked the TMA unit's rules, without checking them again on every call."""
    if not getattr(_this_thread, "has_context", False) and t.is_cuda:
        # Triton encodes a descriptor at launch through CUDA's driver, which needs a
        # context current in the launching thread. A thread that torch started and that
        # has made no CUDA call yet (autograd's, running a backward) has none; any call of
        # CUDA's runtime, a stream query here, makes the GPU's current (and torch's
        # switches of device in that thread carry it along)
        torch.cuda.current_stream(t.device).query()
        _this_thread.has_context = True
    desc = object.__new__(TensorDescriptor)  # skips __post_init__'s checks
    desc.base, desc.shape, desc.strides = t, shape, strides
    desc.block_shape, desc.padding = block_shape, "zero"
    return desc


# --- autotuners' choices -----------------------------------------------------------------


def tuning_key(tuner: Autotuner, named: dict) -> tuple:
    """The key under which `tuner` keeps its choice for a launch with these arguments (by
    name, constexprs included): the values of its `key` parameters, in order, then the
    dtype of every argument that has one, as Autotuner.run builds it."""
    given = {k: v for k, v in named.items() if k in tuner.arg_names}
    values = [given[k] for k in tuner.keys if k in given]
    return (*values, *(str(v.dtype) for v in given.values() if hasattr(v, "dtype")))


def settle(tuner: Autotuner, key: tuple, config) -> None:
    """Make `config` (one of tuner.configs) the tuner's choice for `key`: a launch with that
    key then runs it, pre_hook included, without timing any config."""
    tuner.cache[key] = config


def last_timings(tuner: Autotuner) -> dict:
    """Each config the tuner timed last, with its time (as its do_bench returned it)."""
    return dict(getattr(tuner, "configs_timings", None) or {})


# --- the interpreter --------------------------------------------------------------------


def hook_interpreter(
    before_access: Callable[[str, object, object], None],
    with_arguments: Callable[[list[tuple[str, object]]], None],
    around_launch: Callable[[Callable, tuple, dict, Callable[[], object]], object],
) -> bool:
    """Patch Triton's interpreter, for good, so that
    - `before_access(kind, ptrs, mask)` runs before every tl.load (kind "load") and
      tl.store ("store"), with the block of pointers and the mask (see addresses_reached);
    - `with_arguments(named)` gets each launch's arguments, copied to the host, as
      (parameter name, value) pairs, before any program runs;
    - `around_launch(fn, args, kwargs, launch)` runs each launch of the kernel whose Python
      function is `fn`: it calls `launch()` and returns what that returns.
    Returns False, patching nothing, where the interpreter is not as expected."""
    try:
        builder_cls = interpreter.InterpreterBuilder
        executor_cls = interpreter.GridExecutor
        masked_load = builder_cls.create_masked_load
        masked_store = builder_cls.create_masked_store
        init_args = executor_cls._init_args_hst
        call = executor_cls.__call__
        interpreter._get_np_dtype  # noqa: B018  (addresses_reached)
        interpreter.interpreter_builder.set_grid_idx  # noqa: B018  (current_program)
    except AttributeError:
        return False

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        before_access("load", ptrs, mask)
        return masked_load(self, ptrs, mask, other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        before_access("store", ptrs, mask)
        return masked_store(self, ptrs, value, mask, *args, **kwargs)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        with_arguments([*zip(self.arg_names, args_hst), *kwargs_hst.items()])
        return args_hst, kwargs_hst

    def __call__(self, *args, **kwargs):
        return around_launch(self.fn, args, kwargs, lambda: call(self, *args, **kwargs))

    builder_cls.create_masked_load = create_masked_load
    builder_cls.create_masked_store = create_masked_store
    executor_cls._init_args_hst = _init_args_hst
    executor_cls.__call__ = __call__
    return True


def addresses_reached(ptrs, mask) -> tuple[np.ndarray, int]:
    """For an interpreted tl.load or tl.store: the byte addresses, flattened, that the block
    of pointers `ptrs` reaches where `mask` (None: everywhere) lets it, and the size in bytes
    of the elements they point to."""
    addresses = np.asarray(ptrs.data).reshape(-1)
    if mask is not None:
        active = np.broadcast_to(np.asarray(mask.data), np.shape(ptrs.data)).reshape(-1)
        addresses = addresses[active]
    itemsize = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
    return addresses, itemsize


def current_program() -> tuple[int, ...]:
    """The program the interpreter runs now: its index along each axis of the grid."""
    return tuple(int(i) for i in interpreter.interpreter_builder.grid_idx)


# --- the compiler's front end -----------------------------------------------------------

# sm_80: the oldest architecture every current Triton feature the course uses compiles for
_TARGET = ("cuda", 80, 32)


def gpu_front_end(fn, args: tuple, kwargs: dict) -> tuple[Hashable, Callable[[], None]]:
    """For a launch of the kernel whose Python function is `fn` with these arguments: a key
    for what a GPU would compile (the kernel, its specialisation, its constexprs), and a
    function that compiles it as a GPU launch would, for a generic NVIDIA GPU, as far as
    Triton IR (no GPU needed). That function raises CompilationError where the compiler
    refuses the kernel, CompileTimeAssertionFailure where a tl.static_assert fails."""
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
    source = ASTSource(jit_fn, signature, constexprs, attrs)
    return key, functools.partial(_make_ir, source, options)


@functools.cache
def _backend():
    """Triton's CUDA backend for the generic target: no GPU needed to build it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget(*_TARGET))


_jitted: dict = {}


def _as_jit(fn):
    """A JITFunction of `fn` whose globals hold JITFunctions where the interpreter put
    its own wrappers, so that calls to other @triton.jit helpers compile too: helpers named
    directly (`helper(x)`) and helpers reached through their module (`module.helper(x)`)."""
    if fn not in _jitted:
        _jitted[fn] = None  # a helper that calls itself resolves to the plain function
        names = fn.__code__.co_names  # the globals it reads, and the attributes
        globals_ = dict(fn.__globals__)
        for name in names:
            if name in globals_:
                globals_[name] = _jit_view(globals_[name], names)
        rebound = types.FunctionType(
            fn.__code__, globals_, fn.__name__, fn.__defaults__, fn.__closure__
        )
        rebound.__annotations__ = fn.__annotations__
        rebound.__kwdefaults__ = fn.__kwdefaults__
        rebound.__module__ = fn.__module__
        _jitted[fn] = JITFunction(rebound)
    return _jitted[fn]


def _jit_view(value, names, seen=()):
    """`value` as a compile should see it: an interpreter's wrapper as its JITFunction; a
    module (not Triton's own, which _library_as_jit handles) that holds such wrappers under
    `names`, directly or in its modules under `names`, as a copy holding JITFunctions;
    anything else as it is."""
    if isinstance(value, InterpretedFunction):
        return _as_jit(value.fn)
    if (
        not isinstance(value, types.ModuleType)
        or value.__name__.split(".")[0] == "triton"
        or value in seen
    ):
        return value
    swapped = {}
    for name in names:
        if name in vars(value):
            attribute = vars(value)[name]
            viewed = _jit_view(attribute, names, (*seen, value))
            if viewed is not attribute:
                swapped[name] = viewed
    if not swapped:
        return value
    view = types.ModuleType(value.__name__)
    vars(view).update(vars(value))
    vars(view).update(swapped)
    return view


@contextlib.contextmanager
def _library_as_jit():
    """Under TRITON_INTERPRET=1, Triton's own @jit library functions (tl.max, tl.sum,
    tensor.sum, ...) are interpreter wrappers, and builtins such as tl.program_id may
    still hold the interpreter's patches from a launch. Compile against the originals."""
    from triton.language import core

    owners = [m for name, m in sys.modules.items() if name.startswith("triton.language")]
    owners += [core.tensor, getattr(core, "tensor_descriptor_base", core.tensor)]
    saved = []
    for owner in owners:
        for name, value in list(vars(owner).items()):
            if isinstance(value, InterpretedFunction):
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


def _make_ir(source, options) -> None:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget

    backend = _backend()
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = dict(backend.get_codegen_implementation(options))
    if "min_dot_size" in codegen:
        codegen["min_dot_size"] = _oldest_dot_size(codegen["min_dot_size"])
    with _language_restored(), _library_as_jit():
        source.make_ir(GPUTarget(*_TARGET), options, codegen, backend.get_module_map(), context)


@contextlib.contextmanager
def _language_restored():
    """Leave triton.language as the compile found it, whatever the compile ran: an
    interpreted function called by mistake patches the language for the interpreter (its
    builtins, and methods of its classes: tensor, dtype, condition, ...) and leaves it so,
    and every later compile in the process would then fail."""
    modules = [m for name, m in sys.modules.items() if name.startswith("triton.language")]
    classes = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__.startswith("triton.language")
    }
    saved = [(owner, dict(vars(owner))) for owner in (*modules, *classes)]
    try:
        yield
    finally:
        for owner, before in saved:
            for name in set(vars(owner)) - set(before):
                delattr(owner, name)
            for name, value in before.items():
                if vars(owner).get(name) is not value:
                    setattr(owner, name, value)


def _oldest_dot_size(newest):
    """tl.dot's least sizes [m, n, k] as the strictest supported Triton sets them: 3.6 (the
    GPU's) asks K >= 16 of every dtype but 8-bit (32), where 3.9 lets float32 through at 8."""

    def least(lhs_type, rhs_type):
        m, n, k = newest(lhs_type, rhs_type)
        bits = lhs_type.scalar.primitive_bitwidth
        return m, n, max(k, 32 if bits == 8 else 16)

    return least
