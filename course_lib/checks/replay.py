"""A check split across two processes, for grading code that is not trusted.

The learner's process runs the check as usual, under `recording()`: for every case it
keeps what the learner's function returned (a bit-exact CPU copy), or what it raised,
how many kernels it launched, and the problems only that process can see (writes into
the guard bands, reads outside the inputs, an input modified). The grader's process runs
the same check under `replaying(records)`: it calls nothing of the learner's, takes each
case's output from the records and judges it against its own inputs and references.

Only data crosses: lists of dicts of str, int, float, bool, None and tensors, which
`torch.load(..., weights_only=True)` reads without running code. A case passes only if
the grader's judgement passes and the learner's process reported no problem, so a
tampered process can make its own cases fail, never pass a wrong result. What only the
learner's process can see rests on it alone: the guard bands, and for lesson 08's
operator what torch.library.opcheck and the compiler found; the values are still judged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

# bit-exact copies: the guard's poison is a NaN payload that a float copy may not keep
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy src's bits into dst (same shape and dtype)."""
    as_int = _SAME_WIDTH_INT[src.element_size()]
    dst.view(as_int).copy_(src.view(as_int))


@dataclass
class Recorder:
    """Collects one record per case run while `recording()` is active."""

    records: list[dict] = field(default_factory=list)


@dataclass
class Replayer:
    """Hands out recorded cases by check name and label, in recorded order."""

    records: list[dict]
    used: set[int] = field(default_factory=set)

    def take(self, check: str, label: str) -> dict | None:
        for i, record in enumerate(self.records):
            if i not in self.used and record.get("check") == check and record.get("label") == label:
                self.used.add(i)
                return record
        return None

    def taken(self, check: str) -> list[dict]:
        """The records of `check` handed out so far."""
        return [self.records[i] for i in sorted(self.used) if self.records[i].get("check") == check]


_active: Recorder | Replayer | None = None


def active() -> Recorder | Replayer | None:
    return _active


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Run checks as usual, and keep what each case's call produced."""
    global _active
    saved, _active = _active, Recorder()
    try:
        yield _active
    finally:
        _active = saved


@contextlib.contextmanager
def replaying(records: list[dict]) -> Iterator[Replayer]:
    """Run checks on recorded outputs instead of calling the function given."""
    global _active
    saved, _active = _active, Replayer(list(records))
    try:
        yield _active
    finally:
        _active = saved


def output_record(out) -> dict:
    """What the learner's function returned, as data."""
    if out is None:
        return {"returned": "None"}
    if not isinstance(out, torch.Tensor):
        return {"returned": type(out).__name__}
    copy = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="cpu")
    if out.numel():
        raw_copy(out.detach().cpu() if out.device.type != "cpu" else out.detach(), copy)
    return {"returned": "Tensor", "output": copy}


class _Returned:
    """Stands for a non-tensor the learner's function returned; only its type name is kept."""


def replayed_output(record: dict, expected: torch.Tensor, arena):
    """The recorded output, rebuilt in this process: a tensor served by `arena` with the
    recorded layout and bits, so that unwritten (poisoned) elements show as they did."""
    from course_lib.checks.guard import guarded_empty, storage_span

    returned = record["returned"]
    if returned == "None":
        return None
    if returned != "Tensor":
        name = str(returned)[:60]
        return type(name if name.isidentifier() else "object", (_Returned,), {})()
    recorded = record["output"]
    if not isinstance(recorded, torch.Tensor) or recorded.is_sparse:
        raise TypeError("the output is not a dense tensor")
    if recorded.element_size() not in _SAME_WIDTH_INT:
        raise TypeError(f"the output's dtype {recorded.dtype} is not one a kernel writes here")
    room = 4 * expected.numel() + 4096
    if recorded.numel() > room or storage_span(recorded.shape, recorded.stride()) > room:
        raise ValueError(f"the output spans far more memory than the expected {expected.numel()}")
    view, guarded = guarded_empty(
        recorded.shape, recorded.stride(), recorded.dtype, expected.device, "your output"
    )
    arena.buffers.append(guarded)
    if recorded.numel():
        raw_copy(recorded.to(expected.device), view)
    return view
