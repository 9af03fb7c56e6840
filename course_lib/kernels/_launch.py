"""Lean launches: the finished kernels' launches, spared `kernel[grid]`'s host work.
Written for triton 3.6 (compiled, on the GPU) and 3.9 (its interpreter), torch 2.11 and
2.13; Triton's internals are reached through course_lib.triton_internals.

`kernel[grid](*args)` redoes on every call work whose answer rarely changes: it binds the
arguments to the kernel's parameters, works out how the kernel is specialised for them
(each tensor's dtype and whether it starts on a 16-byte boundary, each integer's range and
whether it is 1 or a multiple of 16), turns the options into a cache key, looks the
compiled kernel up and checks the globals it read; an autotuned kernel adds its own key and
config look-up first. In a loop over small tensors that host work, not the GPU, sets the
pace. `LeanLauncher` does it once per specialisation and sizes, through `kernel[grid]`,
keeps the compiled kernel that call returns (and, for an autotuned kernel, the config it
chose), and from then on hands the arguments straight to the compiled kernel's launcher.
`BoundLaunch` binds a grid and options to it, for a plan (see _plan.py) to call.

What is relied on: `CompiledKernel.run`'s calling convention (`compiled_launch`), the
launch hooks a profiler sets and the driver's current device and stream
(`direct_launches`), the autotuner's `best_config`, `TensorDescriptor`'s fields
(`descriptor`) and, to record launches into torch.compile's graph, torch's
`_disable_current_modes`. Where Triton's differ from what is expected, in the
interpreter, or while a profiler has hooked the launches, every call goes through
`kernel[grid]` as usual.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes

from course_lib import runtime, triton_internals
from course_lib.kernels import _plan, tile_table
from course_lib.kernels._plan import PlanCache
from course_lib.triton_internals import Autotuner, JITFunction, TensorDescriptor, descriptor

__all__ = ["BoundLaunch", "LeanLauncher", "NotTraceable", "descriptor", "trial_launches",
           "tuned_config"]  # fmt: skip

# True while launches are trials, not the call's own (a route timed on its first call):
# a recording of the call's launches (course_lib.bench) leaves them out
trials = False


@contextlib.contextmanager
def trial_launches() -> Iterator[None]:
    """Launches made in the block are trials, not the call's own (see `trials`)."""
    global trials
    saved, trials = trials, True
    try:
        yield
    finally:
        trials = saved


# (the launch hooks' owner, the driver) for launching compiled kernels directly; None where
# every launch goes through kernel[grid]
_INTERNALS = None if runtime.INTERPRETED else triton_internals.direct_launches()


class NotTraceable(RuntimeError):
    """A launch that is not recorded into torch.compile's graph, and leaves the operator
    that makes it one opaque call (see course_lib.ops): one with TMA descriptors built on
    the host, which torch.compile records only when Dynamo itself traces the launch, never
    in an operator's implementation (matmul's TMA path builds them on the GPU instead); or
    one of an autotuned kernel at symbolic sizes, for which no single config can stand
    (kept whole, the operator tunes per size as eager calls do), or whose configs have a
    pre_hook that the graph would not run. Kept whole, the operator pays for its
    dispatch."""


@dataclass
class _Compiled:
    run: object  # the compiled kernel's launcher, called with CompiledKernel.run's arguments
    function: int
    metadata: object
    grid: tuple[int, int, int] | None  # an autotuned kernel's grid, resolved for its config
    constexprs: tuple  # the parameters after the positional arguments, in order
    config: dict  # an autotuned kernel's config, as kwargs; empty otherwise
    pre_hook: object  # the config's pre_hook, run before each launch as the autotuner does


# what LeanLauncher.launch returns: the device and the compiled kernel it keeps for these
# arguments (both None where it keeps none: the interpreter, a profiler listening, a graph
# being recorded), and the config it ran with (an autotuner's choice; {} for a plain kernel)
Launched = tuple[int | None, _Compiled | None, dict]


class LeanLauncher:
    """A @triton.jit kernel, or a triton.autotune'd one, launched as `launcher[grid](...)`
    with the kernel's own arguments, at the cost of its compiled launcher once seen.

    Positional arguments are the kernel's non-constexpr parameters, in order; keyword
    arguments are constexprs and options (num_warps, ...). The grid is a tuple, or for an
    autotuned kernel a function of the config, which must then depend only on the
    autotuner's key (as cdiv(M, meta["BLOCK_M"]) does when M is in the key): it is worked
    out once per key. Compile options changed after the first call (triton.knobs' debug,
    say) reach only new specialisations.
    """

    def __init__(self, kernel: JITFunction | Autotuner):
        self.kernel = kernel
        self.tuned = isinstance(kernel, Autotuner)
        self.jit = kernel.fn if self.tuned else kernel  # interpreted, in the interpreter
        if _INTERNALS is not None and not isinstance(self.jit, JITFunction):
            raise TypeError(f"LeanLauncher takes a @triton.jit kernel, not {type(self.jit)}")
        self._compiled = PlanCache()  # by device, specialisation and options

    def __getitem__(self, grid):
        if callable(grid) and not self.tuned:
            raise TypeError(f"{self.jit.__name__}: give a plain kernel's grid as a tuple")

        def launch(*args, **meta) -> None:
            self.launch(grid, args, meta)

        return launch

    def launch(self, grid, args: tuple, meta: dict) -> Launched:
        """Launch as `kernel[grid](*args, **meta)` would (see Launched)."""
        if _plan.tracing:
            self._launch_into_graph(grid, args, meta)
            return None, None, {}
        if _INTERNALS is None or _profiler_listens():
            return None, None, self.launch_plain(grid, args, meta)[1]  # a profiler is told
        features = _features(args)
        if features is None:
            return None, None, self.launch_plain(grid, args, meta)[1]
        device = _INTERNALS[1].active.get_current_device()
        # the integers are keyed by value, so the autotuner's key is in there too
        key = (device, features, *meta.items())
        entry = self._compiled.get(key)
        if entry is None:
            entry = self._compiled.put(key, self._first_launch(grid, args, meta))
        else:
            self.run_compiled(entry, grid, args, meta, device)
        return device, entry, entry.config

    def tune(self, grid, args: tuple, meta: dict) -> dict:
        """Launch an autotuned kernel as launch() does; return the config it ran with."""
        return self.launch(grid, args, meta)[2]

    def run_compiled(self, entry: _Compiled, grid, args: tuple, meta: dict, device: int) -> None:
        """Launch a kept compiled kernel, as its own launcher is called by Triton."""
        if entry.grid is not None:
            grid = entry.grid
        grid = (*grid, 1, 1)
        if entry.pre_hook is not None:
            entry.pre_hook(self.named_arguments(args, meta, entry.config))
        stream = _INTERNALS[1].active.get_current_stream(device)
        entry.run(
            grid[0], grid[1], grid[2], stream, entry.function, entry.metadata, None, None, None,
            *args, *entry.constexprs,
        )  # fmt: skip

    def launch_plain(self, grid, args: tuple, meta: dict) -> tuple[object, dict]:
        """`kernel[grid](*args, **meta)`: the compiled kernel it returns, and the config it
        ran with (the autotuner's choice for these arguments; {} for a plain kernel)."""
        if not self.tuned:
            return self.kernel[grid](*args, **meta), {}
        named = self.named_arguments(args, meta, {})
        timing = tile_table.settle_from_table(self.kernel, named)  # a measured tile, if any
        compiled = self.kernel[grid](*args, **meta)
        if timing:
            tile_table.record_choice(self.kernel, named)
        return compiled, self.kernel.best_config.all_kwargs()

    def named_arguments(self, args: tuple, meta: dict, config: dict) -> dict:
        """Every argument by name, as Triton hands them to a grid function or a pre_hook."""
        return {**dict(zip(self.jit.arg_names, args)), **meta, **config}

    def _launch_into_graph(self, grid, args: tuple, meta: dict) -> None:
        if any(isinstance(a, TensorDescriptor) for a in args):
            raise NotTraceable(f"{self.jit.__name__} takes TMA descriptors built on the host")
        config = {}
        if self.tuned:
            if any(c.pre_hook is not None for c in self.kernel.configs):
                raise NotTraceable(f"{self.jit.__name__}'s configs have a pre_hook")
            config = tuned_config(self.kernel, grid, args, meta)
        if callable(grid):
            grid = tuple(grid(self.named_arguments(args, meta, config)))
        torch.library.wrap_triton(self.jit)[grid](*args, **meta, **config)

    def _first_launch(self, grid, args: tuple, meta: dict) -> _Compiled:
        """Launch through Triton, which compiles (or autotunes) as needed, and keep what it
        returns for the next calls with the same key."""
        # later calls hand the positional arguments, then the kept constexprs, to the
        # compiled kernel in its parameters' order: the split must be exactly this one
        params = self.jit.params
        if any(p.is_constexpr for p in params[: len(args)]) or not all(
            p.is_constexpr for p in params[len(args) :]
        ):
            raise TypeError(
                f"{self.jit.__name__}: pass the non-constexpr arguments by position and the "
                "constexprs by keyword"
            )
        compiled, config = self.launch_plain(grid, args, meta)
        pre_hook, resolved = None, None
        if self.tuned:
            pre_hook = self.kernel.best_config.pre_hook
            if callable(grid):
                resolved = tuple(grid(self.named_arguments(args, meta, config)))
        given = {**meta, **config}
        constexprs = tuple(given.get(p.name, p.default) for p in params[len(args) :])
        run, function, metadata = triton_internals.compiled_launch(compiled)
        return _Compiled(run, function, metadata, resolved, constexprs, config, pre_hook)


def _profiler_listens() -> bool:
    knobs = _INTERNALS[0]
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_))


class BoundLaunch:
    """`launcher[grid](*args, **meta)` with the grid and meta bound, for a plan keyed on
    everything the kernel is specialised for (each tensor's layout, the integers' values:
    see _plan.signature): every call's arguments then share the first call's
    specialisation, and from the second call on it goes straight to the compiled kernel
    that call kept, with no look-up of its key. A plan keyed on less would launch a kernel
    specialised for other arguments. Tensors the plan allocates itself count as aligned:
    torch's allocator (and the checkers' guarded arena) start every tensor on a 256-byte
    boundary. `tuned`: for a plain kernel bound to an autotuner's choice, that choice,
    which a recording of the launches (course_lib.bench) reports as the autotuned
    kernel's own."""

    def __init__(self, launcher: LeanLauncher, grid, meta: dict, tuned: dict | None = None):
        self.launcher, self.grid, self.meta = launcher, grid, meta
        self.tuned = None if tuned is None else dict(tuned)
        self.compiled: Launched | None = None  # the first call's, once it kept a kernel

    def __call__(self, *args) -> None:
        compiled = self.compiled
        if (
            compiled is None
            or _plan.tracing
            or _profiler_listens()
            # a kernel compiled for another device's context
            or (device := _INTERNALS[1].active.get_current_device()) != compiled[0]
        ):
            launched = self.launcher.launch(self.grid, args, self.meta)
            self.compiled = launched if launched[1] is not None else None
        else:
            self.launcher.run_compiled(compiled[1], self.grid, args, self.meta, device)


def tuned_config(kernel: Autotuner, grid: Callable[[dict], tuple], args: tuple, meta: dict) -> dict:
    """The config, as kwargs, that `kernel`'s autotuner chooses for a launch with these
    arguments, traced by torch.compile, for the graph to launch the plain kernel with.

    Given the autotuner itself, Inductor would tune again by its own timing, which picked
    slower tiles for lesson 05's kernel. So the autotuner runs here, once, on scratch
    tensors (and descriptors over them) with the traced ones' sizes, strides and dtypes;
    a key it has tuned already costs one launch. The choice is then part of the compiled
    graph, which Inductor may keep in its cache on disk and reuse in a later process."""
    if not all(_static(a) for a in args):
        raise NotTraceable(f"{kernel.fn.__name__} is autotuned, and these sizes are symbolic")
    named = {**dict(zip(kernel.arg_names, args)), **meta}
    tile_table.settle_from_table(kernel, named)  # then no scratch launch is timed
    try:
        with _disable_current_modes():  # real tensors, outside the tracing
            kernel[grid](*(_scratch_like(a) for a in args), **meta)
    except torch.OutOfMemoryError as err:  # no room for the scratch copies: stay whole
        raise NotTraceable(f"no memory to tune {kernel.fn.__name__} while compiling") from err
    chosen = kernel.best_config
    if chosen.num_ctas != 1 or chosen.maxnreg is not None:
        raise NotTraceable(f"{kernel.fn.__name__}'s config sets options the graph would drop")
    return {**chosen.kwargs, "num_warps": chosen.num_warps, "num_stages": chosen.num_stages}


def _static(arg) -> bool:
    """Whether an argument traced by torch.compile has concrete sizes (no SymInt)."""
    if isinstance(arg, TensorDescriptor):
        arg = arg.base
    if isinstance(arg, torch.Tensor):
        return all(type(n) is int for n in (*arg.shape, *arg.stride()))
    return not isinstance(arg, torch.SymInt)


def _scratch_like(arg):
    """For a tensor, a real one with its sizes, strides, dtype and device, random where
    it is floating point; for a descriptor, the same descriptor over such a tensor; any
    other argument as it is. What the autotuner times a traced launch on."""
    if isinstance(arg, TensorDescriptor):
        scratch = copy.copy(arg)
        scratch.base = _scratch_like(arg.base)
        return scratch
    if not isinstance(arg, torch.Tensor):
        return arg
    span = 1 + sum((n - 1) * s for n, s in zip(arg.shape, arg.stride())) if arg.numel() else 0
    make = torch.randn if arg.dtype.is_floating_point else torch.zeros
    return make(span, dtype=arg.dtype, device=arg.device).as_strided(arg.shape, arg.stride())


def _features(args: tuple) -> tuple | None:
    """More than what Triton specialises a kernel on, for these arguments: each integer's
    value (Triton asks only its range and whether it is 1 or a multiple of 16), each
    tensor's dtype and 16-byte alignment, each tensor descriptor's dtype and tile shape.
    Values key a little too finely, and cost half as much host time as ranges.
    None for any other kind of argument."""
    key = []
    for a in args:
        if type(a) is int:
            key.append(a)
        elif isinstance(a, torch.Tensor):
            key.append(a.dtype)
            key.append(a.data_ptr() & 15 == 0)
        elif isinstance(a, TensorDescriptor):
            key.append((a.base.dtype, *a.block_shape, a.padding))
        else:
            return None
    return tuple(key)
