"""Lesson 01: elementwise addition of two vectors, one block of elements per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.kernels._args import cdiv, check_same
from course_lib.kernels._launch import LeanLauncher

BLOCK_SIZE = 1024
NUM_WARPS = 4


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    # int64 so that tensors of 2^31 elements and more index correctly
    block_start = pid.to(tl.int64) * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)  # [BLOCK_SIZE]
    mask = offsets < n_elements  # the last block runs past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# add_kernel[grid](...) as the lesson writes it, minus the host work Triton repeats on every
# call (see _launch.py): in a loop over small vectors that work outlasts the addition
add_launcher = LeanLauncher(add_kernel)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two tensors [*] of one shape, dtype and device; returns a new tensor."""
    check_same("add", x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n_elements = out.numel()
    if n_elements == 0:
        return out
    grid = (cdiv(n_elements, BLOCK_SIZE),)
    add_launcher[grid](x, y, out, n_elements, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
    return out
