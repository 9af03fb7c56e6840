"""Out-of-bounds protection for kernels run in Triton's interpreter.

In the interpreter, ``tl.load`` and ``tl.store`` dereference raw host addresses. A
store past the end of a tensor (the classic missing mask) overwrites Python's heap
and kills the Jupyter kernel ("corrupted double-linked list", abort) long after the
mistake. This module checks every unmasked lane's address against the memory of
the tensors passed to the launch, and raises ``OutOfBoundsAccess`` *before* the
access happens, naming the argument and how far past its end the program reached.

It is installed by ``course_lib`` in interpreter mode and relies on internals of
``triton.runtime.interpreter``; where those differ, ``install()`` returns False and
kernels run unprotected (the checkers' guard bands still catch stray writes).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass

import numpy as np

from course_lib import gpu_rules


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
    from triton.runtime.interpreter import interpreter_builder

    program = tuple(int(i) for i in interpreter_builder.grid_idx)
    return (
        f"tl.{kind} in program {program} reached {bad.size} address(es) outside every tensor "
        f"passed to the kernel: {where}. Guard the {kind} with a mask, "
        f"e.g. tl.{kind}(..., mask=offsets < n_elements), and check the offsets and strides."
    )


def _check(kind: str, ptrs, mask) -> None:
    extents = _extents.get()
    if not extents:
        return
    addresses = np.asarray(ptrs.data).reshape(-1)
    if mask is not None:
        active = np.broadcast_to(np.asarray(mask.data), np.shape(ptrs.data)).reshape(-1)
        addresses = addresses[active]
    if addresses.size == 0:
        return
    itemsize = np.dtype(_np_dtype(ptrs)).itemsize
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


def _np_dtype(ptrs):
    from triton.runtime.interpreter import _get_np_dtype

    return _get_np_dtype(ptrs.get_element_ty())


def install() -> bool:
    """Patch the interpreter once. Returns whether protection is active."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter as interp

        builder_cls = interp.InterpreterBuilder
        executor_cls = interp.GridExecutor
        masked_load = builder_cls.create_masked_load
        masked_store = builder_cls.create_masked_store
        init_args = executor_cls._init_args_hst
        call = executor_cls.__call__
        interp._get_np_dtype  # noqa: B018  (needed by _np_dtype)
    except (ImportError, AttributeError):
        return False

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        _check("load", ptrs, mask)
        return masked_load(self, ptrs, mask, other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        _check("store", ptrs, mask)
        return masked_store(self, ptrs, value, mask, *args, **kwargs)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        extents: list[_Extent] = []
        for name, arg in zip(self.arg_names, args_hst):
            _collect(name, arg, extents)
        for name, arg in kwargs_hst.items():
            _collect(name, arg, extents)
        _extents.set(tuple(extents))
        return args_hst, kwargs_hst

    def __call__(self, *args, **kwargs):
        gpu_rules.check_launch(self.fn, args, kwargs)
        token = _extents.set(None)
        try:
            # a GPU makes NaN and inf silently; so does the interpreter, without warnings
            with np.errstate(all="ignore"):
                return call(self, *args, **kwargs)
        except Exception as error:
            # show the learner our message, not Triton's InterpreterError wrapping of it
            oob = find_out_of_bounds(error)
            if oob is not None and oob is not error:
                raise oob.with_traceback(None) from None
            raise
        finally:
            _extents.reset(token)

    builder_cls.create_masked_load = create_masked_load
    builder_cls.create_masked_store = create_masked_store
    executor_cls._init_args_hst = _init_args_hst
    executor_cls.__call__ = __call__
    _installed = True
    return True


def find_out_of_bounds(error: BaseException) -> OutOfBoundsAccess | None:
    """The OutOfBoundsAccess behind an interpreter error, if that is what it was."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OutOfBoundsAccess):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
