"""Lesson 09's layer norm and RMSNorm for rows wider than one block (norm_plans.py's
MAX_FUSED_BLOCK): a program takes a row and loops over it in blocks of LOOP_BLOCK columns.

The forward merges each block's mean and sum of squared deviations into the row's (Chan's
form of Welford's update), then normalises in a second loop. The backward loops once for
the row's two sums and once to write dx and add to its program's row of partial sums.
norm_plans.py hands these rows here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course_lib.kernels._launch import BoundLaunch, LeanLauncher

LOOP_BLOCK = 4096  # columns per step
WARPS = 16


@triton.jit
def norm_fwd_looped_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, n_cols, stride_x,
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr, SAVE_STATS: tl.constexpr, ACC_DTYPE: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(axis=0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_x, y_ptr + row * n_cols
    mean = tl.zeros([], ACC_DTYPE)  # of the columns seen so far
    m2 = tl.zeros([], ACC_DTYPE)  # their sum of squared deviations from `mean`
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC_DTYPE)
        if RMS:
            m2 += tl.sum(x * x, axis=0)
        else:
            # merge this block's mean and m2 into the row's (Chan et al.): no sum of squares
            # of raw values, whose difference loses the digits that matter
            count = tl.minimum(n_cols - start, BLOCK_N).to(ACC_DTYPE)
            block_mean = tl.sum(x, axis=0) / count
            deviation = tl.where(mask, x - block_mean, 0.0)
            delta = block_mean - mean
            total = start + count
            mean += delta * (count / total)
            m2 += tl.sum(deviation * deviation, axis=0) + delta * delta * (start * count / total)
    rstd = 1.0 / tl.sqrt(m2 / n_cols + EPS)
    if SAVE_STATS:  # stats [2, n_rows]: the means, then the rstds; RMSNorm's [1, n_rows]
        if RMS:
            tl.store(stats_ptr + row, rstd)
        else:
            tl.store(stats_ptr + row, mean)
            tl.store(stats_ptr + tl.num_programs(axis=0) + row, rstd)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC_DTYPE)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask).to(ACC_DTYPE)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask).to(ACC_DTYPE)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def norm_bwd_looped_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, partial_ptr,
    n_rows, n_cols, stride_dy, stride_x, rows_per_program,
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, RMS: tl.constexpr, DX: tl.constexpr,
    DW: tl.constexpr, DB: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """Per row, a loop for its two sums, then a loop that writes dx and adds to this
    program's row of partial sums (zeroed by the host), which no other program touches."""
    pid = tl.program_id(axis=0)
    # partial [2, programs, n_cols]: dw's partial sums, then db's
    dw_partial_ptr = partial_ptr
    db_partial_ptr = partial_ptr + tl.num_programs(axis=0).to(tl.int64) * n_cols
    first = pid.to(tl.int64) * rows_per_program  # int64 rows: row * stride stays exact
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        if RMS:
            mean = 0.0
            rstd = tl.load(stats_ptr + row)
        else:
            mean = tl.load(stats_ptr + row)
            rstd = tl.load(stats_ptr + n_rows + row)
        c1 = tl.zeros([], ACC_DTYPE)  # sum(x_hat * w dy)
        c2 = tl.zeros([], ACC_DTYPE)  # sum(w dy)
        if DX:
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < n_cols
                x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(ACC_DTYPE)
                dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0)
                wdy = dy.to(ACC_DTYPE)
                if HAS_WEIGHT:
                    wdy *= tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC_DTYPE)
                c1 += tl.sum((x - mean) * rstd * wdy, axis=0)
                c2 += tl.sum(wdy, axis=0)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(ACC_DTYPE)
            dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(ACC_DTYPE)
            x_hat = (x - mean) * rstd
            if DX:
                wdy = dy
                if HAS_WEIGHT:
                    wdy = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC_DTYPE)
                dx = wdy - x_hat * (c1 / n_cols)
                if not RMS:
                    dx -= c2 / n_cols
                tl.store(dx_ptr + row * n_cols + cols, (dx * rstd).to(dx_ptr.dtype.element_ty),
                         mask=mask)  # fmt: skip
            partial = pid.to(tl.int64) * n_cols + cols  # past 2**31 for very wide rows
            if DW:
                dw = tl.load(dw_partial_ptr + partial, mask=mask)
                tl.store(dw_partial_ptr + partial, dw + dy * x_hat, mask=mask)
            if DB:
                db = tl.load(db_partial_ptr + partial, mask=mask)
                tl.store(db_partial_ptr + partial, db + dy, mask=mask)


fwd_looped_launcher = LeanLauncher(norm_fwd_looped_kernel)
bwd_looped_launcher = LeanLauncher(norm_bwd_looped_kernel)


def forward_launch(n_rows: int, n_cols: int, stride_x: int, flags: dict):
    """The looped forward's launch for n_rows rows of n_cols columns, bound: a function of
    (x, y, w, b, stats), as norm_plans' fused one."""
    meta = flags | dict(BLOCK_N=LOOP_BLOCK, num_warps=WARPS)
    launch = BoundLaunch(fwd_looped_launcher, (n_rows,), meta)
    return lambda x, y, w, b, stats: launch(x, y, w, b, stats, n_cols, stride_x)


def backward_launch(programs: int, sizes: tuple, flags: dict):
    """The looped backward's launch over `programs` programs, bound: a function of
    (dy, x, w, stats, dx, partial), as norm_plans' fused one."""
    meta = flags | dict(BLOCK_N=LOOP_BLOCK, num_warps=WARPS)
    launch = BoundLaunch(bwd_looped_launcher, (programs,), meta)
    return lambda *tensors: launch(*tensors, *sizes)
