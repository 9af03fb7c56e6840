"""What the Hopper fast paths (matmul's, linear's, conv2d's and attention's TMA kernels)
share: which GPUs take them, the TMA unit's rules for a matrix, and its descriptors."""

from __future__ import annotations

import functools

import torch

from course_lib import runtime
from course_lib.kernels._launch import descriptor
from course_lib.kernels._plan import into_graph

__all__ = ["TMA_GPUS", "by_rows", "capability", "column_major", "descriptor", "sm_count",
           "tma_available", "tma_rule_broken"]  # fmt: skip

# the GPUs (compute capability) where the TMA kernels were measured and take over
TMA_GPUS = {(9, 0)}


@functools.cache
def capability(device: int) -> tuple[int, int]:
    """The compute capability of the GPU with this index."""
    return torch.cuda.get_device_capability(device)


@functools.cache
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def tma_available() -> bool:
    """Whether a TMA kernel can run here: in the interpreter, or on a GPU with a TMA unit
    (compute capability 9.0, Hopper, or later)."""
    return runtime.INTERPRETED or capability(torch.cuda.current_device()) >= (9, 0)


def column_major(t: torch.Tensor) -> bool:
    """Whether the 2-D `t` has its first axis contiguous and not its last: K-major, for b."""
    row_stride, col_stride = t.stride()
    return row_stride == 1 and col_stride != 1


def by_rows(t: torch.Tensor) -> torch.Tensor:
    """A matrix as the TMA unit reads it: itself when row-major, its transpose when its
    first axis is contiguous (a K-major B, an M-major A)."""
    return t.t() if column_major(t) else t


def tma_rule_broken(t: torch.Tensor) -> str | None:
    """Which of the TMA unit's rules the 2-D `t` breaks, if any."""
    row_stride, col_stride = t.stride()
    if col_stride != 1:
        return "its last axis must be contiguous (b: either axis)"
    if row_stride < t.shape[1] or row_stride * t.element_size() % 16 != 0:
        return "its rows must not overlap and must lie a multiple of 16 bytes apart"
    # a traced tensor has no address: Inductor starts its buffers 16-byte aligned, and
    # copies an input that is not when its graph was compiled for an aligned one
    start = t.storage_offset() * t.element_size() if into_graph() else t.data_ptr()
    if start % 16 != 0:
        return "it must start at a 16-byte aligned address"
    return None
