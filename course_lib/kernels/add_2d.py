"""Lesson 03: adding two matrices tile by tile, on a two-dimensional grid."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.kernels import vector_add
from course_lib.kernels._args import cdiv, check_same
from course_lib.kernels._launch import LeanLauncher

# square tiles read transposed inputs down columns and contiguous ones along rows
# equally well (measured on a Hopper GPU, 8192 x 8192 float32)
BLOCK_M, BLOCK_N = 64, 64
NUM_WARPS = 4


@triton.jit
def add_2d_kernel(
    x_ptr, y_ptr, out_ptr, M, N,
    stride_xm, stride_xn, stride_ym, stride_yn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    # int64 so that offsets into tensors of 2^31 elements and more do not wrap
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BLOCK_M]
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BLOCK_N]
    # both masks: the edge tiles overhang the bottom rows and the right columns
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask)
    y = tl.load(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, mask=mask)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, x + y, mask=mask)


add_2d_launcher = LeanLauncher(add_2d_kernel)  # add_2d_kernel[grid], lean: see _launch.py


def add_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for [M, N] tensors of any strides; returns a new contiguous [M, N] tensor."""
    check_same("add_2d", x, y)
    if x.dim() != 2:
        raise ValueError(f"add_2d expects 2-D tensors, got {x.dim()}-D; use add() for others")
    M, N = x.shape
    if x.is_contiguous() and y.is_contiguous():
        # two contiguous matrices are two long vectors: the 1-D kernel moves them faster
        return vector_add.add(x, y)
    out = x.new_empty((M, N))  # contiguous, with x's dtype and device
    if out.numel() == 0:
        return out
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    if grid[1] > 65535:  # CUDA's limit on the second grid axis
        raise ValueError(f"add_2d: {N} columns need {grid[1]} column tiles; at most 65535 fit")
    add_2d_launcher[grid](
        x, y, out, M, N, *x.stride(), *y.stride(), *out.stride(),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
