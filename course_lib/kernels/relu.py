"""Lesson 02: ReLU, the simplest elementwise map after a copy."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.kernels._args import cdiv, check_same
from course_lib.kernels._launch import LeanLauncher

BLOCK_SIZE = 1024
NUM_WARPS = 4


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # [BLOCK_SIZE]
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    # NaN in, NaN out, as torch.relu does; a plain maximum would turn NaN into 0
    out = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(out_ptr + offsets, out, mask=mask)


relu_launcher = LeanLauncher(relu_kernel)  # relu_kernel[grid], lean: see _launch.py


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0) for a tensor [*]; returns a new tensor of the same shape and dtype."""
    check_same("relu", x)
    x = x.contiguous()
    out = torch.empty_like(x)
    n_elements = out.numel()
    if n_elements == 0:
        return out
    grid = (cdiv(n_elements, BLOCK_SIZE),)
    relu_launcher[grid](x, out, n_elements, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
    return out
