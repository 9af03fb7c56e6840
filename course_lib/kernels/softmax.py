"""Lesson 04: softmax over the rows of a matrix, fused into one pass over memory.

Rows that fit in one block are read once and written once, several rows per program
when rows are short. Wider rows are split across programs: a first kernel reduces
each chunk of a row to its max and its sum of exponentials, a second combines a
row's chunks and writes the normalised chunk. That reads the row twice, but keeps
every SM busy even when there are fewer rows than SMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.kernels._args import cdiv, check_same, next_power_of_2
from course_lib.kernels._launch import LeanLauncher

MAX_FUSED_BLOCK = 16384  # widest row kept in registers in one program (64 KiB of fp32)
CHUNK = 8192  # columns per program for wider rows


def _config(block_n: int) -> tuple[int, int]:
    """(rows per program, num_warps) for a row block of `block_n` columns.

    Measured on a Hopper GPU over rows of 781 to 16384 columns: short rows go two to a
    program so that each program has enough loads in flight; rows of 4096 and more
    take one program each, with 16 warps to hold them in registers.
    """
    if block_n <= 1024:
        return 2, 4
    if block_n == 2048:
        return 2, 8
    return 1, 16


@triton.jit
def softmax_kernel(
    x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(axis=0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    rows = rows.to(tl.int64)
    # pad with -inf so padded lanes vanish from the max and add exp(-inf) = 0 to the sum
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)  # [ROWS, BLOCK_N]
    # subtract the row max so that exp never overflows
    numerator = tl.exp(x - tl.max(x, axis=1)[:, None])
    # one reciprocal per row and a multiply per element: a division per element costs
    # several instructions, and with the row in registers the instructions show
    out = numerator * (1.0 / tl.sum(numerator, axis=1))[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_out + cols[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_chunk_stats_kernel(x_ptr, stats_ptr, n_cols, stride_x, n_chunks, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    chunk = tl.program_id(axis=1)
    # stats holds [2, rows, n_chunks]: each chunk's max, then its sum of exponentials
    max_ptr, sum_ptr = _chunk_stats(stats_ptr, n_chunks)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=-float("inf"))
    x = x.to(tl.float32)
    chunk_max = tl.max(x, axis=0)
    # a chunk of only -inf has max -inf; shift by 0 there so exp gives 0, not NaN
    shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    tl.store(max_ptr + row * n_chunks + chunk, chunk_max)
    tl.store(sum_ptr + row * n_chunks + chunk, tl.sum(tl.exp(x - shift), axis=0))


@triton.jit
def softmax_chunk_normalize_kernel(
    x_ptr, out_ptr, stats_ptr, n_cols, stride_x, stride_out, n_chunks,
    BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(axis=0).to(tl.int64)
    chunk = tl.program_id(axis=1)
    max_ptr, sum_ptr = _chunk_stats(stats_ptr, n_chunks)
    # every program of a row combines the row's chunk statistics: a few loads from L2
    idx = tl.arange(0, CHUNKS)
    chunk_max = tl.load(max_ptr + row * n_chunks + idx, mask=idx < n_chunks, other=-float("inf"))
    chunk_sum = tl.load(sum_ptr + row * n_chunks + idx, mask=idx < n_chunks, other=0.0)
    row_max = tl.max(chunk_max, axis=0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(chunk_sum * tl.exp(chunk_max - shift), axis=0)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    out = tl.exp(x - row_max) * (1.0 / row_sum)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_stats(stats_ptr, n_chunks):
    """Where the chunk maxima and the chunk sums start in stats [2, rows, n_chunks]: one
    tensor, so that the host makes no views of it (each view costs a microsecond)."""
    return stats_ptr, stats_ptr + tl.num_programs(axis=0).to(tl.int64) * n_chunks


# each kernel[grid], lean: see _launch.py
softmax_launcher = LeanLauncher(softmax_kernel)
chunk_stats_launcher = LeanLauncher(softmax_chunk_stats_kernel)
chunk_normalize_launcher = LeanLauncher(softmax_chunk_normalize_kernel)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of x [M, N]; returns a new contiguous [M, N] tensor.

    The row stride may differ from N (a slice of wider rows); if the columns are
    not adjacent in memory, x is copied to a contiguous tensor first.
    """
    check_same("softmax", x)
    if x.dim() != 2:
        raise ValueError(f"softmax expects a 2-D tensor [M, N], got {x.dim()}-D")
    if x.stride(1) != 1:
        x = x.contiguous()
    n_rows, n_cols = x.shape
    out = x.new_empty((n_rows, n_cols))  # contiguous, with x's dtype and device
    if out.numel() == 0:
        return out
    block_n = next_power_of_2(n_cols)
    if block_n <= MAX_FUSED_BLOCK:
        rows, num_warps = _config(block_n)
        grid = (cdiv(n_rows, rows),)
        softmax_launcher[grid](
            x, out, n_rows, n_cols, x.stride(0), out.stride(0),
            BLOCK_N=block_n, ROWS=rows, num_warps=num_warps,
        )  # fmt: skip
        return out
    n_chunks = cdiv(n_cols, CHUNK)
    stats = x.new_empty((2, n_rows, n_chunks), dtype=torch.float32)
    grid = (n_rows, n_chunks)
    chunk_stats_launcher[grid](x, stats, n_cols, x.stride(0), n_chunks, BLOCK_N=CHUNK, num_warps=8)
    chunk_normalize_launcher[grid](
        x, out, stats, n_cols, x.stride(0), out.stride(0), n_chunks,
        BLOCK_N=CHUNK, CHUNKS=next_power_of_2(n_chunks), num_warps=8,
    )  # fmt: skip
    return out
