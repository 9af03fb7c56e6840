"""What the finished kernels' launchers share: argument checks, and lean launches.

`kernel[grid](*args)` redoes on every call work whose answer rarely changes: it binds the
arguments to the kernel's parameters, works out how the kernel is specialised for them
(each tensor's dtype and whether it starts on a 16-byte boundary, each integer's range and
whether it is 1 or a multiple of 16), turns the options into a cache key, looks the
compiled kernel up and checks the globals it read; an autotuned kernel adds its own key and
config look-up first. In a loop over small tensors that host work, not the GPU, sets the
pace. `LeanLauncher` does it once per specialisation and sizes, through `kernel[grid]`, keeps
the compiled kernel that call returns (and, for an autotuned kernel, the config it chose),
and from then on hands the arguments straight to the compiled kernel's own launcher.

This reaches into Triton's internals: `CompiledKernel.run`'s calling convention (grid,
stream, function, packed metadata, launch metadata, the two launch hooks, then every
parameter in order, constexprs included) and the hook chains in `triton.knobs`. Written
for triton 3.6 and 3.9; where those differ, or in the interpreter, or while a profiler
has hooked the launches, every call goes through `kernel[grid]` as usual. Recording
launches into torch.compile's graph (`launching_into_graph`, `tuned_config`) also uses
torch's private `_disable_current_modes` and the autotuner's `best_config`: written for
torch 2.11 and 2.13.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _disable_current_modes
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from course_lib import runtime


def check_same(name: str, *tensors: torch.Tensor, same_shape: bool = True) -> None:
    """Raise a clear error unless all tensors share dtype, device and (by default) shape."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} expects torch.Tensor arguments, got {type(t).__name__}")
    first = tensors[0]
    for t in tensors[1:]:
        if same_shape and t.shape != first.shape:
            raise ValueError(
                f"{name}: shapes differ, {list(first.shape)} vs {list(t.shape)}. "
                "Broadcasting is not supported: expand and call .contiguous() first."
            )
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name}: dtypes differ, {first.dtype} vs {t.dtype}. Cast one with .to(dtype)."
            )
        if t.device != first.device:
            raise ValueError(
                f"{name}: devices differ, {first.device} vs {t.device}. Move both with .to(device)."
            )
    if runtime.MODE == "gpu" and not first.is_cuda:
        raise ValueError(
            f"{name}: the tensors are on {first.device}; Triton kernels run on the GPU here. "
            "Allocate them with device=course_lib.DEVICE."
        )
    runtime.require_supported_dtype(first.dtype, name)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b), for grids. triton.cdiv gives the same but, being callable inside a
    kernel too, costs the host a few microseconds a call, a fair part of a launch."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1); triton.next_power_of_2, without its cost.
    A size traced symbolically by torch.compile is made concrete here (it specialises)."""
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1


@dataclass
class Launch:
    """One launch as `kernel[grid](*args, **kwargs)` would make it: the bare launch."""

    kernel: JITFunction
    grid: tuple[int, int, int]
    args: tuple
    kwargs: dict
    tuned: dict = field(default_factory=dict)  # the autotuner's config, where it chose one

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


_recorded: list[Launch] | None = None


@contextlib.contextmanager
def recording_launches() -> Iterator[list[Launch]]:
    """Yields a list that fills with every launch a LeanLauncher makes in the block, so
    that a benchmark can time the same launches made bare."""
    global _recorded
    saved, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = saved


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Launches made in the block go unrecorded by an enclosing recording_launches: those
    of a choice timed on a first call, say, which are not that call's."""
    global _recorded
    if _recorded is None:  # the usual case: nothing to pause, nor to put back
        yield
        return
    saved, _recorded = _recorded, None
    try:
        yield
    finally:
        _recorded = saved


def _triton_internals():
    """The Triton internals a direct launch needs, or None where they are not as expected."""
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


class NotTraceable(RuntimeError):
    """A launch that is not recorded into torch.compile's graph, and leaves the operator
    that makes it one opaque call (see course_lib.ops): one with TMA descriptors built on
    the host, which torch.compile records only when Dynamo itself traces the launch, never
    in an operator's implementation (matmul's TMA path builds them on the GPU instead); or
    one of an autotuned kernel at symbolic sizes, for which no single config can stand
    (kept whole, the operator tunes per size as eager calls do), or whose configs have a
    pre_hook that the graph would not run. Kept whole, the operator pays for its
    dispatch (tens of microseconds)."""


_into_graph = False


@contextlib.contextmanager
def launching_into_graph() -> Iterator[None]:
    """Within the block, every LeanLauncher launch goes through torch.library.wrap_triton:
    called by torch.compile's tracing on traced tensors, that records the kernel into the
    graph, for Inductor to launch from its own code, instead of launching it."""
    global _into_graph
    saved, _into_graph = _into_graph, True
    try:
        yield
    finally:
        _into_graph = saved


def into_graph() -> bool:
    """Whether launches are being recorded into a graph (see launching_into_graph): no
    tensor has an address then, and nothing is to be kept for later calls."""
    return _into_graph


_INTERNALS = None if runtime.INTERPRETED else _triton_internals()
# compiled kernels a launcher keeps at most, one per specialisation and set of sizes; and
# plans a finished kernel keeps at most, one per signature of its arguments
MAX_KEPT = 1024


def keep(store: dict, key, value):
    """store[key] = value, store emptied first where it holds MAX_KEPT entries already (a
    loop over ever new sizes: start afresh); returns value."""
    if len(store) >= MAX_KEPT:
        store.clear()
    store[key] = value
    return value


@dataclass
class _Compiled:
    run: object  # the compiled kernel's launcher, called with CompiledKernel.run's arguments
    function: int
    metadata: object
    grid: tuple[int, int, int] | None  # an autotuned kernel's grid, resolved for its config
    constexprs: tuple  # the parameters after the positional arguments, in order
    config: dict  # an autotuned kernel's config, as kwargs; empty otherwise
    pre_hook: object  # the config's pre_hook, run before each launch as the autotuner does


class LeanLauncher:
    """A @triton.jit kernel, or a triton.autotune'd one, launched as `launcher[grid](...)`
    with the kernel's own arguments, at the cost of its compiled launcher once seen.

    Positional arguments are the kernel's non-constexpr parameters, in order; keyword
    arguments are constexprs and options (num_warps, ...). The grid is a tuple, or for an
    autotuned kernel a function of the config, which must then depend only on the
    autotuner's key (as cdiv(M, meta["BLOCK_M"]) does when M is in the key): it is worked
    out once per key. Compile options changed after the first call (triton.knobs' debug,
    say) reach only new specialisations; launches are recorded for one thread at a time.
    """

    def __init__(self, kernel: JITFunction | Autotuner):
        self.kernel = kernel
        self.tuned = isinstance(kernel, Autotuner)
        self.jit = kernel.fn if self.tuned else kernel  # interpreted, in the interpreter
        if _INTERNALS is not None and not isinstance(self.jit, JITFunction):
            raise TypeError(f"LeanLauncher takes a @triton.jit kernel, not {type(self.jit)}")
        self._compiled: dict[tuple, _Compiled] = {}
        # an autotuned kernel's config in its last launch, as kwargs: a kept launch skips the
        # autotuner, whose best_config may then be another key's
        self.config: dict = {}

    def __getitem__(self, grid):
        if callable(grid) and not self.tuned:
            raise TypeError(f"{self.jit.__name__}: give a plain kernel's grid as a tuple")

        def launch(*args, **meta) -> None:
            self.launch(grid, args, meta)

        return launch

    def launch(self, grid, args: tuple, meta: dict) -> tuple[int, _Compiled] | None:
        """Launch as `kernel[grid](*args, **meta)` would; return the device and the
        compiled kernel kept for these arguments (see KeptLaunch), or None where none is
        kept (the interpreter, a profiler listening, a graph being recorded)."""
        if _into_graph:
            self._launch_into_graph(grid, args, meta)
            return None
        if _INTERNALS is None or _profiler_listens():
            self._plain(grid, args, meta)  # a profiler listening is told by Triton
            return None
        features = _features(args)
        if features is None:
            self._plain(grid, args, meta)
            return None
        device = _INTERNALS[1].active.get_current_device()
        # the integers are keyed by value, so the autotuner's key is in there too
        key = (device, features, *meta.items())
        entry = self._compiled.get(key)
        if entry is None:
            entry = keep(self._compiled, key, self._first_launch(grid, args, meta))
        else:
            self.run_compiled(entry, grid, args, meta, device)
        return device, entry

    def run_compiled(self, entry: _Compiled, grid, args: tuple, meta: dict, device: int) -> None:
        """Launch a kept compiled kernel, as its own launcher is called by Triton."""
        if entry.grid is not None:
            grid = entry.grid
        grid = (*grid, 1, 1)
        self.config = entry.config
        if entry.pre_hook is not None:
            entry.pre_hook(self._named(args, meta, entry.config))
        if _recorded is not None:
            kwargs = {**meta, **entry.config}
            _recorded.append(Launch(self.jit, grid[:3], args, kwargs, entry.config))
        stream = _INTERNALS[1].active.get_current_stream(device)
        entry.run(
            grid[0], grid[1], grid[2], stream, entry.function, entry.metadata, None, None, None,
            *args, *entry.constexprs,
        )  # fmt: skip

    def _launch_into_graph(self, grid, args: tuple, meta: dict) -> None:
        if any(isinstance(a, TensorDescriptor) for a in args):
            raise NotTraceable(f"{self.jit.__name__} takes TMA descriptors built on the host")
        config = {}
        if self.tuned:
            if any(c.pre_hook is not None for c in self.kernel.configs):
                raise NotTraceable(f"{self.jit.__name__}'s configs have a pre_hook")
            config = tuned_config(self.kernel, grid, args, meta)
        if callable(grid):
            grid = tuple(grid(self._named(args, meta, config)))
        torch.library.wrap_triton(self.jit)[grid](*args, **meta, **config)

    def _named(self, args: tuple, meta: dict, config: dict) -> dict:
        """Every argument by name, as Triton hands them to a grid function or a pre_hook."""
        return {**dict(zip(self.jit.arg_names, args)), **meta, **config}

    def _plain(self, grid, args: tuple, meta: dict):
        compiled = self.kernel[grid](*args, **meta)
        self.config = self.kernel.best_config.all_kwargs() if self.tuned else {}
        if _recorded is not None:
            config = self.config
            if callable(grid):
                grid = grid(self._named(args, meta, config))
            grid = (*grid, 1, 1)[:3]
            _recorded.append(Launch(self.jit, grid, args, {**meta, **config}, config))
        return compiled

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
        compiled = self._plain(grid, args, meta)
        config, pre_hook, resolved = {}, None, None
        if self.tuned:  # _plain has kept the config the autotuner chose
            config, pre_hook = self.config, self.kernel.best_config.pre_hook
            if callable(grid):
                resolved = tuple(grid(self._named(args, meta, config)))
        given = {**meta, **config}
        constexprs = tuple(given.get(p.name, p.default) for p in params[len(args) :])
        return _Compiled(
            compiled.run, compiled.function, compiled.packed_metadata, resolved, constexprs,
            config, pre_hook,
        )  # fmt: skip


def layout(t: torch.Tensor | None) -> tuple | None:
    """What a plan kept with a KeptLaunch must key on for one tensor (None for None):
    its shape, strides, dtype and device, and whether it starts on a 16-byte boundary,
    which Triton specialises on."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def _profiler_listens() -> bool:
    knobs = _INTERNALS[0]
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_))


class KeptLaunch:
    """`launcher[grid](*args, **meta)` with the grid and meta fixed, for a caller that
    keeps it in a plan of its own, keyed on everything the kernel is specialised for
    (each tensor's `layout`, the integers' values): every call's
    arguments then share the first call's specialisation, and from the second call on
    it goes straight to the compiled kernel that call kept, with no look-up of its key
    (a few µs of a 15 µs launch on an H200's host). A plan keyed on less than that
    would launch a kernel specialised for other arguments: keep one only where the key
    says so. Tensors the caller allocates itself count as aligned: torch's allocator
    (and the checkers' guarded arena) start every tensor on a 256-byte boundary."""

    def __init__(self, launcher: LeanLauncher, grid, meta: dict, tuned: dict | None = None):
        self.launcher, self.grid, self.meta = launcher, grid, meta
        # for a plain kernel launched with an autotuner's choice: that choice, which a
        # recording of the launches reports (Launch.tuned) as the autotuned kernel's own
        self.tuned = None if tuned is None else dict(tuned)
        self.kept: tuple[int, _Compiled] | None = None

    def __call__(self, *args) -> None:
        recorded = len(_recorded) if self.tuned and _recorded is not None else None
        kept = self.kept
        if (
            kept is None
            or _into_graph
            or _profiler_listens()
            # a kernel compiled for another device's context
            or (device := _INTERNALS[1].active.get_current_device()) != kept[0]
        ):
            self.kept = self.launcher.launch(self.grid, args, self.meta)
        else:
            self.launcher.run_compiled(kept[1], self.grid, args, self.meta, device)
        if recorded is not None:
            for launch in _recorded[recorded:]:
                launch.tuned = self.tuned


def tuned_config(kernel: Autotuner, grid: Callable[[dict], tuple], args: tuple, meta: dict) -> dict:
    """The config, as kwargs, that `kernel`'s autotuner chooses for a launch with these
    arguments, traced by torch.compile, for the graph to launch the plain kernel with.

    Given the autotuner itself, Inductor would tune again by its own timing: on an H100
    its tile for lesson 05's kernel at 1024^3 fp16 ran at 0.87 of the speed of ours. So
    the autotuner runs here, once, on scratch tensors (and descriptors over them) with
    the traced ones' sizes, strides and dtypes; a key it has tuned already costs one
    launch. The choice is then part of the compiled graph, which Inductor may keep in
    its cache on disk and reuse in a later process."""
    if not all(_static(a) for a in args):
        raise NotTraceable(f"{kernel.fn.__name__} is autotuned, and these sizes are symbolic")
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
