"""Out-of-bounds protection for kernels run in Triton's interpreter.

In the interpreter, ``tl.load`` and ``tl.store`` dereference raw host addresses. A
store past the end of a tensor (the classic missing mask) overwrites Python's heap
and kills the Jupyter kernel ("corrupted double-linked list", abort) long after the
mistake. This module checks every unmasked lane's address against the memory of
the tensors passed to the launch, and raises ``OutOfBoundsAccess`` *before* the
access happens, naming the argument and how far past its end the program reached.

It is installed by ``course_lib`` in interpreter mode, through the interpreter's hooks
in course_lib.triton_internals; where the interpreter differs from what those expect,
``install()`` returns False and kernels run unprotected (the checkers' guard bands still
catch stray writes).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass

import numpy as np

from course_lib import gpu_rules, triton_internals


class OutOfBoundsAccess(IndexError):
    """A kernel's tl.load or tl.store reached memory outside every tensor argument."""


@dataclass(frozen=True)
class _Extent:
    name: str
    start: int  # first byte of the argument's storage: accesses from here on are allowed
    end: int  # one past the storage's last byte
    tensor_start: int  # the tensor's own first byte, to say how far off an access is
    tensor_end: int  # one past the byte of its last element
    numel: int


_extents: contextvars.ContextVar[tuple[_Extent, ...] | None] = contextvars.ContextVar(
    "course_lib_extents", default=None
)
_watched: contextvars.ContextVar[tuple[list, Counter] | None] = contextvars.ContextVar(
    "course_lib_watched", default=None
)
_installed = False


@contextlib.contextmanager
def watching(ranges: list[tuple[int, int, str]]):
    """Count the interpreted loads and stores that land in `ranges` (start, end, label).

    Yields a Counter keyed by (kind, label), kind being "load" or "store". The
    checkers watch their guard bands this way to report unmasked loads, which
    leave no trace in memory.
    """
    hits: Counter = Counter()
    token = _watched.set((ranges, hits))
    try:
        yield hits
    finally:
        _watched.reset(token)


def span(shape, stride) -> int:
    """Elements of storage a strided tensor reaches, from its first element."""
    reach = 1  # a plain loop: matmul asks this on every call
    for n, s in zip(shape, stride):
        if n == 0:
            return 0
        reach += (n - 1) * abs(s)
    return reach


def _collect(name: str, arg, out: list[_Extent]) -> None:
    import torch

    if isinstance(arg, (tuple, list)):
        for i, item in enumerate(arg):
            _collect(f"{name}[{i}]", item, out)
        return
    # TensorWrapper (reinterpreted dtypes) and TensorDescriptor keep their tensor in .base
    tensor = arg if isinstance(arg, torch.Tensor) else getattr(arg, "base", None)
    if not isinstance(tensor, torch.Tensor):
        return
    storage = tensor.untyped_storage()
    start, size = storage.data_ptr(), tensor.element_size()
    first = tensor.data_ptr()
    last = first + span(tensor.shape, tensor.stride()) * size
    out.append(_Extent(name, start, start + storage.nbytes(), first, last, tensor.numel()))


def _describe(kind: str, addresses: np.ndarray, itemsize: int, extents: tuple[_Extent, ...]):
    """Say which argument the stray lanes are nearest to, in elements."""
    bad = addresses.astype(np.int64)
    first, last = int(bad.min()), int(bad.max())
    nearest = min(extents, key=lambda e: min(abs(first - e.end), abs(last - e.start)))
    if first >= nearest.end:
        # distances from the tensor's last element, not from the end of its storage
        low = (first - nearest.tensor_end) // itemsize + 1
        high = (last - nearest.tensor_end) // itemsize + 1
        where = f"{low}–{high} elements past the end of `{nearest.name}` ({nearest.numel} elements)"
    else:
        before = (nearest.tensor_start - first) // itemsize
        where = f"up to {before} elements before the start of `{nearest.name}`"
    program = triton_internals.current_program()
    return (
        f"tl.{kind} in program {program} reached {bad.size} address(es) outside every tensor "
        f"passed to the kernel: {where}. Guard the {kind} with a mask, "
        f"e.g. tl.{kind}(..., mask=offsets < n_elements), and check the offsets and strides."
    )


def _check(kind: str, ptrs, mask) -> None:
    extents = _extents.get()
    if not extents:
        return
    addresses, itemsize = triton_internals.addresses_reached(ptrs, mask)
    if addresses.size == 0:
        return
    watched = _watched.get()
    if watched is not None:
        ranges, hits = watched
        for start, end, label in ranges:
            count = int(((addresses >= start) & (addresses < end)).sum())
            if count:
                hits[kind, label] += count
    inside = np.zeros(addresses.shape, dtype=bool)
    for e in extents:
        inside |= (addresses >= e.start) & (addresses + itemsize <= e.end)
    if not inside.all():
        raise OutOfBoundsAccess(_describe(kind, addresses[~inside], itemsize, extents))


def install() -> bool:
    """Hook the interpreter once. Returns whether protection is active."""
    global _installed
    if not _installed:
        _installed = triton_internals.hook_interpreter(_check, _collect_extents, _guarded_launch)
    return _installed


def _collect_extents(named: list[tuple[str, object]]) -> None:
    """The memory of a launch's tensor arguments, for the accesses that follow."""
    extents: list[_Extent] = []
    for name, arg in named:
        _collect(name, arg, extents)
    _extents.set(tuple(extents))


def _guarded_launch(fn, args: tuple, kwargs: dict, launch):
    gpu_rules.check_launch(fn, args, kwargs)
    token = _extents.set(None)
    try:
        # a GPU makes NaN and inf silently; so does the interpreter, without warnings
        with np.errstate(all="ignore"):
            return launch()
    except Exception as error:
        # show the learner our message, not Triton's InterpreterError wrapping of it
        oob = find_out_of_bounds(error)
        if oob is not None and oob is not error:
            raise oob.with_traceback(None) from None
        raise
    finally:
        _extents.reset(token)


def find_out_of_bounds(error: BaseException) -> OutOfBoundsAccess | None:
    """The OutOfBoundsAccess behind an interpreter error, if that is what it was."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OutOfBoundsAccess):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
