"""Guard bands: every tensor a check touches lives inside a larger, poisoned buffer.

A checker cannot see the learner's output buffer before the launch, because the
learner's launcher allocates it. So for the length of one call, ``GuardedArena``
serves ``torch.empty``/``empty_like``/``zeros``/... from buffers laid out as

    [ guard (poison) | the tensor (poison for empty*) | guard (poison) ]

Afterwards the checker counts elements still holding the poison (never written)
and guard elements that lost it (written out of bounds). The guards also keep a
stray store from landing in somebody else's memory: on a GPU it would corrupt a
neighbouring tensor, in the interpreter Python's own heap.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from course_lib import runtime
from course_lib.interpreter_guard import span as storage_span

# Quiet NaNs with a payload no arithmetic produces, so "still poison" means "never written".
# The guards around inputs hold another payload: on the CPU, x + NaN keeps the NaN's
# payload, and a kernel that stores a sum of input-guard NaNs into an output's guard
# must still show as a stray write there.
_POISON_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF8_DEAD_BEEF_0BAD),
    torch.float32: (torch.int32, 0x7FDE_ADBE),
    torch.float16: (torch.int16, 0x7EAD),
    torch.bfloat16: (torch.int16, 0x7FED),
}
_INPUT_GUARD_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF8_0BAD_F00D_CAFE),
    torch.float32: (torch.int32, 0x7FCA_FE01),
    torch.float16: (torch.int16, 0x7E01),
    torch.bfloat16: (torch.int16, 0x7FC1),
}

GUARD_MIN = runtime.by_mode(gpu=1 << 16, interpreter=1 << 12)
GUARD_MAX = 1 << 22


def poison_(t: torch.Tensor, input_guard: bool = False) -> torch.Tensor:
    """Fill `t` with the poison pattern of its dtype (or the input guards'), in place."""
    table = _INPUT_GUARD_BITS if input_guard else _POISON_BITS
    if t.dtype in table:
        int_dtype, bits = table[t.dtype]
        t.view(int_dtype).fill_(bits)
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)  # for integers an unlikely value, not a proof
    return t


def is_poison(t: torch.Tensor, input_guard: bool = False) -> torch.Tensor:
    """Boolean mask of the elements of `t` that still hold the poison (or the input guards')."""
    table = _INPUT_GUARD_BITS if input_guard else _POISON_BITS
    if t.dtype in table:
        int_dtype, bits = table[t.dtype]
        return t.view(int_dtype) == bits
    if t.dtype == torch.bool:
        return torch.zeros_like(t, dtype=torch.bool)
    return t == torch.iinfo(t.dtype).max


@dataclass
class GuardedBuffer:
    """One allocation and where its tensor sits inside it."""

    label: str
    buffer: torch.Tensor  # 1-D, [guard | span | guard]
    offset: int  # where the tensor's storage starts, in elements
    span: int
    input_guard: bool = False  # guards hold the input guards' poison

    def owns(self, t: torch.Tensor) -> bool:
        return (
            t.device == self.buffer.device
            and t.untyped_storage().data_ptr() == self.buffer.untyped_storage().data_ptr()
        )

    def stray_writes(self) -> tuple[int, int]:
        """(before the start, past the end): guard elements that lost their poison."""
        before = self.buffer[: self.offset]
        after = self.buffer[self.offset + self.span :]
        mark = self.input_guard
        return int((~is_poison(before, mark)).sum()), int((~is_poison(after, mark)).sum())

    def byte_ranges(self) -> list[tuple[int, int, str]]:
        """Address ranges of the two guards, for the interpreter's read watch."""
        base, size = self.buffer.data_ptr(), self.buffer.element_size()
        end = base + self.buffer.numel() * size
        return [
            (base, base + self.offset * size, f"before the start of {self.label}"),
            (base + (self.offset + self.span) * size, end, f"past the end of {self.label}"),
        ]


def guarded_empty(
    shape, stride, dtype, device, label: str, input_guard: bool = False
) -> tuple[torch.Tensor, GuardedBuffer]:
    """A poisoned tensor of the given layout inside a poisoned, guarded buffer."""
    span = storage_span(shape, stride)
    guard = min(max(span, GUARD_MIN), GUARD_MAX)
    # a whole number of 256-byte units: the tensor starts as aligned as torch's allocator
    # would start it, which launchers and the kernels they keep may count on
    unit = max(1, 256 // dtype.itemsize)
    guard = -(-guard // unit) * unit
    buffer = torch.empty(guard + span + guard, dtype=dtype, device=device)
    poison_(buffer, input_guard)
    view = buffer.as_strided(shape, stride, guard)
    return view, GuardedBuffer(label, buffer, guard, span, input_guard)


def guarded_copy(values: torch.Tensor, label: str) -> tuple[torch.Tensor, GuardedBuffer]:
    """`values` copied into a guarded buffer with the same strides.

    The whole stretch of memory the view spans is copied, gaps between its elements
    included (a slice with steps, a row stride wider than the row), so a kernel
    that walks that memory with the wrong strides reads what it would have read
    in the original and computes the same wrong answer the checker can name.
    """
    view, guarded = guarded_empty(
        values.shape, values.stride(), values.dtype, values.device, label, input_guard=True
    )
    if guarded.span:
        spanned = values.as_strided((guarded.span,), (1,), values.storage_offset())
        guarded.buffer[guarded.offset : guarded.offset + guarded.span].copy_(spanned)
    return view, guarded


_EMPTY = {
    torch.empty,
    torch.empty_like,
    torch.empty_strided,
    torch.Tensor.new_empty,
    torch.Tensor.new_empty_strided,
}
_FILLED = {
    torch.zeros,
    torch.zeros_like,
    torch.ones,
    torch.ones_like,
    torch.full,
    torch.full_like,
    torch.Tensor.new_zeros,
    torch.Tensor.new_ones,
    torch.Tensor.new_full,
}


def _called_by_triton() -> bool:
    """Whether Triton itself asked (the autotuner's cache-flush buffer, its scratch)."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        name = frame.f_globals.get("__name__", "")
        if name.startswith("triton.") and not name.startswith("triton.language"):
            return True
        frame = frame.f_back
    return False


class GuardedArena(TorchFunctionMode):
    """While active, tensor factories return guarded tensors and remember them."""

    def __init__(self):
        super().__init__()
        self.buffers: list[GuardedBuffer] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func not in _EMPTY and func not in _FILLED or _called_by_triton():
            return result
        if not isinstance(result, torch.Tensor) or result.numel() == 0 or result.is_sparse:
            return result
        if result.is_meta:  # a layout worked out, with no memory to write past
            return result
        name = getattr(func, "__name__", "tensor")
        view, guarded = guarded_empty(
            result.shape,
            result.stride(),
            result.dtype,
            result.device,
            f"the tensor from {name}() #{len(self.buffers) + 1}",
        )
        if func in _FILLED:
            view.copy_(result)
        if result.requires_grad:
            view.requires_grad_(True)
        self.buffers.append(guarded)
        return view

    def owner(self, t: torch.Tensor) -> GuardedBuffer | None:
        return next((b for b in self.buffers if b.owns(t)), None)
