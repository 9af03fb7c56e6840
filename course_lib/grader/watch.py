"""What PyTorch computes while a learner's launcher runs, seen at the ATen level.

Reading an answer's text (lesson.py) misses torch reached through an alias, `getattr`,
`exec` of encoded text or NumPy. Every one of those ends in ATen operators, which a
`TorchDispatchMode` sees whatever spelling reached them. While the learner's function runs
under a check, `Watch` lets through what a launcher does:

- allocate (``empty``, ``empty_like``, ``zeros``, ``new_empty``, ...), fill with a
  constant, and read metadata;
- make views (``view``, ``reshape``, ``t``, ``permute``, ``as_strided``, ...);
- copy an input, or a view of it that keeps its element order, as it is (``.contiguous()``,
  ``.to(dtype)``, ``reshape`` of a strided input), on its own device.

Anything else (arithmetic, reductions, activations, an index or a gather), a copy of a
transposed or permuted view (which is a transpose computed by PyTorch), a copy of a tensor
PyTorch did not make in this call (NumPy's, say) or a copy to another device is a finding
that names the operator; so it is in the backward of a `torch.autograd.Function` the
notebook defines (`watching_backwards`), whose gradients kernels must write too. Triton's
own work during a launch (the interpreter copies tensors
to NumPy and back) is not watched. The learner's function must also hand back a tensor that
one of the notebook's own kernels received: `Watch.unlaunched` counts the calls that did not.

This runs in the learner's process: code written to find and switch it off can evade it,
and the review (lesson.py) flags the reflection that takes (``gc``, ``sys``, ``inspect``).
Written for torch 2.11-2.13 and triton 3.6-3.9.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

from course_lib.triton_internals import KERNEL_CLASSES, TUNER_CLASSES, wrapping_launches

ALLOCATING = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
              "ones_like", "full", "full_like", "new_empty", "new_empty_strided", "new_zeros",
              "new_ones", "new_full", "scalar_tensor", "arange", "fill", "fill_", "zero_",
              "resize_", "set_"}  # fmt: skip
# a tensor made from data PyTorch did not compute (torch.from_numpy, torch.tensor): using
# it is fine, copying it into the result is not
LIFTING = {"lift_fresh", "lift_fresh_copy", "lift"}
# views that keep the element order: a copy of one is a plain copy of the input
ORDER_KEEPING = {"view", "_unsafe_view", "_reshape_alias", "alias", "detach", "unsqueeze",
                 "squeeze", "view_as", "reshape", "flatten", "unflatten"}  # fmt: skip
REORDERING = {"t", "transpose", "permute", "as_strided", "expand", "select", "slice", "narrow",
              "diagonal", "unfold", "split", "split_with_sizes", "chunk", "unbind", "movedim",
              "numpy_T", "mT", "T", "swapaxes", "swapdims", "view_as_real",
              "view_as_complex", "unsafe_split", "split_with_sizes_copy"}  # fmt: skip
COPYING = {"clone", "_to_copy", "copy", "copy_", "contiguous", "to", "_copy_from"}
METADATA = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride",
            "numel", "dim", "is_contiguous", "is_same_size", "_local_scalar_dense",
            "is_non_overlapping_and_dense", "storage_offset", "_has_compatible_shallow_copy_type",
            "record_stream", "_nested_tensor_from_mask_left_aligned",
            "is_pinned", "equal_"}  # fmt: skip

# kinds of tensors, by where they came from in this call
INPUT, ALLOCATED, REORDERED = "input", "allocated", "reordered"


@dataclass
class Watch:
    """Findings over every call of one learner's function: operators that computed, and
    calls whose returned tensor no kernel of the notebook received."""

    computed: list[str] = field(default_factory=list)  # one line per finding, first few
    calls: int = 0
    unlaunched: int = 0

    def finding(self, text: str) -> None:
        if text not in self.computed and len(self.computed) < 5:
            self.computed.append(text)

    def as_record(self) -> dict:
        return {"computed": self.computed, "calls": self.calls, "unlaunched": self.unlaunched}


def _tensors(value, depth: int = 0):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)) and depth < 3:
        for item in value:
            yield from _tensors(item, depth + 1)
    elif isinstance(value, dict) and depth < 3:
        for item in value.values():
            yield from _tensors(item, depth + 1)


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _from_the_guard_bands() -> bool:
    """Whether the op was asked for by the checker's guard bands (course_lib.checks.guard),
    which put every tensor the launcher allocates inside poisoned margins."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None or frame.f_code in _WRAPPER_CODES:
            return False
        # every op passes through the arena's __torch_function__; its helpers are its own
        if (
            frame.f_globals.get("__name__") == "course_lib.checks.guard"
            and frame.f_code.co_name != "__torch_function__"
        ):
            return True
        frame = frame.f_back
    return False


class _Mode(TorchDispatchMode):
    def __init__(self, watch: Watch, inputs: list[torch.Tensor]):
        super().__init__()
        self.watch = watch
        self.kinds = WeakIdKeyDictionary()
        for t in inputs:
            self.kinds[t] = INPUT

    def kind(self, t: torch.Tensor) -> str | None:
        return self.kinds.get(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        namespace = getattr(func, "namespace", "aten")
        tensors_in = [t for t in _tensors(list(args) + list(kwargs.values()))]
        if _from_the_guard_bands() or name in ALLOCATING and namespace == "aten":
            self._mark(out, ALLOCATED)
            return out
        if name in METADATA or name in LIFTING:
            return out
        if namespace != "aten" and namespace != "prims":
            self.watch.finding(f"an operator of its own, {func}, computed on PyTorch's side")
            return out
        if name in ORDER_KEEPING:
            source = self.kind(tensors_in[0]) if tensors_in else None
            self._mark(out, source)
            return out
        if name in REORDERING:
            source = self.kind(tensors_in[0]) if tensors_in else None
            self._mark(out, ALLOCATED if source == ALLOCATED else REORDERED if source else None)
            return out
        if name in COPYING:
            source = tensors_in[-1 if name in ("copy_", "copy", "_copy_from") else 0]
            self._check_copy(func, source, out, kwargs)
            return out
        self.watch.finding(f"PyTorch computed with aten.{func.__name__}")
        return out

    def _check_copy(self, func, source: torch.Tensor, out, kwargs) -> None:
        kind = self.kind(source)
        device = kwargs.get("device")
        if device is not None and torch.device(device) != source.device:
            self.watch.finding(
                f"aten.{func.__name__} copied a tensor from {source.device} to {device}"
            )
        elif kind == REORDERED:
            self.watch.finding(
                f"aten.{func.__name__} copied a transposed or sliced view of an input: "
                "PyTorch rearranged the values, not your kernel"
            )
        elif kind is None:
            self.watch.finding(
                f"aten.{func.__name__} copied a tensor PyTorch did not make here (NumPy's, "
                "or one computed before the call) into the result"
            )
        else:
            self._mark(out, kind)

    def _mark(self, out, kind: str | None) -> None:
        if kind is None:
            return
        for t in _tensors(out):
            self.kinds[t] = kind


def _kernel_function(kernel):
    """The Python function under a launched kernel (through autotuners and heuristics)."""
    for _ in range(6):
        inner = getattr(kernel, "fn", None)
        if inner is None:
            break
        kernel = inner
    return kernel


def _notebooks_own(kernel) -> bool:
    """Whether a kernel was defined in one of the notebook's cells (child.run_cell names
    them '<cell N>'), not taken from a library."""
    code = getattr(_kernel_function(kernel), "__code__", None)
    return code is not None and code.co_filename.startswith("<cell ")


@contextlib.contextmanager
def _launches_unwatched(received: set[int]):
    """Launches run with the mode off (Triton's interpreter computes with torch and NumPy
    on its own account, an autotuner times configs); `received` collects the storages the
    notebook's kernels got."""

    def wrap(run):
        @functools.wraps(run)
        def unwatched(self, *args, **kwargs):
            if _notebooks_own(self):
                for t in _tensors(list(args) + list(kwargs.values())):
                    if (ptr := _storage(t)) is not None:
                        received.add(ptr)
            with _disable_current_modes():
                return run(self, *args, **kwargs)

        return unwatched

    with wrapping_launches(wrap, KERNEL_CLASSES + TUNER_CLASSES):
        yield


def watched(fn, watch: Watch):
    """`fn`, run under the watch at every call; its signature and name stay `fn`'s."""

    @functools.wraps(fn)
    def learners_function(*args, **kwargs):
        inputs = list(_tensors(list(args) + list(kwargs.values())))
        received: set[int] = set()
        watch.calls += 1
        with _launches_unwatched(received), _Mode(watch, inputs):
            out = fn(*args, **kwargs)
        returned = [t for t in _tensors(out) if t.numel()]  # nothing to write, no launch
        if returned and not any(_storage(t) in received for t in returned):
            watch.unlaunched += 1
        return out

    return learners_function


def _backward_watched(backward, watch: Watch):
    @functools.wraps(backward)
    def learners_backward(ctx, *grads):
        saved = list(getattr(ctx, "saved_tensors", ()) or ())
        inputs = list(_tensors([*grads, *saved]))
        received: set[int] = set()
        with _launches_unwatched(received), _Mode(watch, inputs):
            out = backward(ctx, *grads)
        returned = [t for t in _tensors(out) if t.numel()]
        if not all(_storage(t) in received for t in returned):
            watch.finding("a gradient its backward returned came from no kernel of yours")
        return out

    return learners_backward


@contextlib.contextmanager
def watching_backwards(namespace: dict, watch: Watch):
    """Watch the backward of every torch.autograd.Function the notebook defined, for the
    block: autograd calls it after the learner's function has returned (lesson 07)."""
    classes = [
        value
        for value in list(namespace.values())
        if isinstance(value, type)
        and issubclass(value, torch.autograd.Function)
        and value.__module__ == "__main__"
        and "backward" in value.__dict__
    ]
    originals = {cls: cls.__dict__["backward"] for cls in classes}
    for cls, original in originals.items():
        function = original.__func__ if isinstance(original, staticmethod) else original
        cls.backward = staticmethod(_backward_watched(function, watch))
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.backward = original


_WRAPPER_CODES = (
    watched(lambda: None, Watch()).__code__,
    _backward_watched(lambda ctx: None, Watch()).__code__,
)
