"""Lesson 09: layer norm and RMSNorm over the last dimensions, forward and backward.

The forward is lesson 04's row reduction: a row that fits one block is read once, its mean
and variance computed in float32 (float64 for float64 inputs) from the values in registers,
and written once, normalised; the mean and the reciprocal standard deviation (rstd) are
saved for the backward. Wider rows loop over blocks of columns: a first loop merges each
block's mean and sum of squared deviations into the row's (Chan's form of Welford's
update), a second normalises.

The backward computes dx row by row (the row's two means, of w·dy and of x̂·w·dy), and the
weight's and bias's gradients, which sum over every row: each program accumulates its own
rows' share in registers and writes one row of dw's and one of db's [programs, N] float32
buffers, and a second small kernel sums the buffers' rows. The order of every sum is fixed,
so the gradients are the same on every run (atomics would not be; lesson 09 measures both).
A forward that no backward can follow saves no statistics.

RMSNorm is the same with no mean and no bias: y = x / sqrt(mean(x²) + eps) · w.
`layer_norm`, `rms_norm`, `LayerNorm` and `RMSNorm` follow torch.nn.functional's and
torch.nn's semantics.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from course_lib import runtime

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
MAX_FUSED_BLOCK = 8192  # widest row kept in registers by one program
LOOP_BLOCK = 4096  # columns per step for wider rows
PROGRAMS_PER_SM = 2  # backward programs: each loops over many rows
PARTIAL_BLOCK_P, PARTIAL_BLOCK_N = 64, 32  # the tile of the kernel that sums the partials


def _config(block_n: int) -> tuple[int, int]:
    """(rows per program, num_warps) for a row block of `block_n` columns: short rows go
    several to a program, so that each program has about 4096 elements' loads in flight;
    wide ones take more warps to hold the row in registers."""
    if block_n <= 2048:
        return min(16, max(1, 4096 // block_n)), 4 if block_n <= 512 else 8
    return 1, 8 if block_n == 4096 else 16


@triton.jit
def norm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, stride_x, stride_y, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, RMS: tl.constexpr, SAVE_STATS: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(axis=0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols[None, :] < n_cols)
    rows = rows.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(ACC_DTYPE)  # [ROWS, BLOCK_N]; statistics never in 16 bits
    if RMS:
        centred = x
    else:
        mean = tl.sum(x, axis=1) / n_cols  # padded lanes hold 0 and add nothing
        # padded lanes would hold -mean: zero them so they add nothing to the variance
        centred = tl.where(mask, x - mean[:, None], 0.0)
        if SAVE_STATS:
            tl.store(mean_ptr + rows, mean, mask=row_mask)
    # the biased variance (divided by n, as torch's layer_norm), from the centred values:
    # a second pass over registers, not over memory
    var = tl.sum(centred * centred, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)  # eps inside the square root
    if SAVE_STATS:  # for the backward; a forward without one saves nothing
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=cols < n_cols).to(ACC_DTYPE)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=cols < n_cols).to(ACC_DTYPE)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


@triton.jit
def norm_fwd_looped_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, n_cols, stride_x, stride_y, eps,
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr, SAVE_STATS: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(axis=0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_x, y_ptr + row * stride_y
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
    rstd = 1.0 / tl.sqrt(m2 / n_cols + eps)
    if SAVE_STATS:
        tl.store(rstd_ptr + row, rstd)
        if not RMS:
            tl.store(mean_ptr + row, mean)
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
def norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
    n_rows, n_cols, stride_dy, stride_x, stride_dx, rows_per_program,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    RMS: tl.constexpr, DX: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    dw_partial_ptr, db_partial_ptr = _partials(partial_ptr, n_cols)
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC_DTYPE) if HAS_WEIGHT else 1.0
    dw_acc = tl.zeros([ROWS, BLOCK_N], ACC_DTYPE)  # this program's share of sum(dy * x_hat)
    db_acc = tl.zeros([ROWS, BLOCK_N], ACC_DTYPE)  # and of sum(dy)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for start in range(first, last, ROWS):
        rows = start + tl.arange(0, ROWS)  # [ROWS]
        row_mask = rows < last
        mask = row_mask[:, None] & col_mask[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        x, dy = x.to(ACC_DTYPE), dy.to(ACC_DTYPE)  # [ROWS, BLOCK_N]
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        if RMS:
            x_hat = x * rstd
        else:
            x_hat = (x - tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]) * rstd
        if DX:
            wdy = dy * w  # 0 on padded lanes, where dy is 0
            # dx = rstd * (w dy - mean(w dy) - x_hat * mean(x_hat w dy)); RMSNorm has no
            # mean to subtract, so no mean(w dy)
            c1 = tl.sum(x_hat * wdy, axis=1) / n_cols
            dx = wdy - x_hat * c1[:, None]
            if not RMS:
                dx -= (tl.sum(wdy, axis=1) / n_cols)[:, None]
            dx_ptrs = dx_ptr + rows[:, None] * stride_dx + cols[None, :]
            tl.store(dx_ptrs, (dx * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        if DW:
            dw_acc += dy * x_hat
        if DB:
            db_acc += dy
    # one row of partial sums per program; a second kernel adds the rows in a fixed order
    if DW:
        tl.store(dw_partial_ptr + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if DB:
        tl.store(db_partial_ptr + pid * n_cols + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def norm_bwd_looped_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
    n_rows, n_cols, stride_dy, stride_x, stride_dx, rows_per_program,
    BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, RMS: tl.constexpr, DX: tl.constexpr,
    DW: tl.constexpr, DB: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """The backward for rows wider than one block: per row, a loop for its two sums, then
    a loop that writes dx and adds to this program's row of partial sums (zeroed by the
    host), which no other program touches."""
    pid = tl.program_id(axis=0)
    dw_partial_ptr, db_partial_ptr = _partials(partial_ptr, n_cols)
    first = pid.to(tl.int64) * rows_per_program  # int64 rows: row * stride stays exact
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        rstd = tl.load(rstd_ptr + row)
        mean = 0.0 if RMS else tl.load(mean_ptr + row)
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
                tl.store(dx_ptr + row * stride_dx + cols, (dx * rstd).to(dx_ptr.dtype.element_ty),
                         mask=mask)  # fmt: skip
            partial = pid.to(tl.int64) * n_cols + cols  # past 2**31 for very wide rows
            if DW:
                dw = tl.load(dw_partial_ptr + partial, mask=mask)
                tl.store(dw_partial_ptr + partial, dw + dy * x_hat, mask=mask)
            if DB:
                db = tl.load(db_partial_ptr + partial, mask=mask)
                tl.store(db_partial_ptr + partial, db + dy, mask=mask)


@triton.jit
def _partials(partial_ptr, n_cols):
    """Where dw's and db's partial sums start in partial [2, programs, n_cols]: one tensor,
    so that the host makes no views of it (each view costs a microsecond)."""
    return partial_ptr, partial_ptr + tl.num_programs(axis=0).to(tl.int64) * n_cols


@triton.jit
def sum_rows_kernel(
    partial_ptr, out_ptr, n_partials, n_cols, first,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[k, n] = sum over p of partial[k, p, n], for partial [2, n_partials, n_cols] and
    k = first + program_id(1), in a fixed order: each program sums its BLOCK_N columns down
    all the rows of one of the two."""
    part = (first + tl.program_id(axis=1)).to(tl.int64)
    partial_ptr += part * n_partials * n_cols
    out_ptr += part * n_cols
    cols = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    acc = tl.zeros([BLOCK_P, BLOCK_N], partial_ptr.dtype.element_ty)
    for start in range(0, n_partials, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)  # [BLOCK_P]
        mask = (p[:, None] < n_partials) & (cols[None, :] < n_cols)
        rows = p[:, None].to(tl.int64) * n_cols  # past 2**31 for very wide rows
        acc += tl.load(partial_ptr + rows + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < n_cols)


# --- the launchers --------------------------------------------------------------------------


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _backward_programs(x: torch.Tensor) -> int:
    """Programs of the backward: a few per SM, so that the partial-sum buffer stays small."""
    if runtime.INTERPRETED:
        return 4
    return PROGRAMS_PER_SM * _sm_count(x.device.index or 0)


def _check(what: str, x, normalized_shape, params: dict) -> tuple[int, ...]:
    """Raise a clear error unless x, normalized_shape and the parameters fit; returns
    normalized_shape as a tuple."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} expects a tensor x, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(f"{what}: x has dtype {x.dtype}; use one of {names}")
    if x.dtype == torch.bfloat16:
        runtime.require_supported_dtype(x.dtype, what)  # the interpreter refuses bfloat16
    if x.device.type != runtime.DEVICE.type:
        raise ValueError(f"{what}: x is on {x.device}; move it to {runtime.DEVICE} first")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(x.shape[-len(shape) :]) != shape or len(shape) > x.dim():
        raise ValueError(
            f"{what}: normalized_shape {list(shape)} must be x's last dimensions, and x has "
            f"shape {list(x.shape)}"
        )
    for name, p in params.items():
        if p is None:
            continue
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape:
            got = list(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"{what}: {name} must have shape {list(shape)}, got {got}")
        if p.device != x.device or p.dtype not in DTYPES:
            raise ValueError(
                f"{what}: {name} must be a floating tensor on x's device ({x.device}), "
                f"got {p.dtype} on {p.device}"
            )
    return shape


def _rows(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """x as [rows, n_cols] with adjacent columns: a view where x's strides allow it."""
    x2d = x.reshape(-1, n_cols)
    return x2d if x2d.stride(1) == 1 or n_cols == 1 else x2d.contiguous()


def norm_forward(
    x2d: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    rms: bool = False, save_stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """y [M, N] (x's dtype), mean [M] and rstd [M] (float32, float64 for float64 x) of the
    rows of x2d [M, N], whose columns are adjacent; for RMSNorm (`rms`) mean is empty.
    Without `save_stats` (no backward to come), mean and rstd are None."""
    n_rows, n_cols = x2d.shape
    y = torch.empty((n_rows, n_cols), dtype=x2d.dtype, device=x2d.device)
    mean = rstd = None
    if save_stats:
        stats_dtype = torch.float64 if x2d.dtype == torch.float64 else torch.float32
        mean = torch.empty(0 if rms else n_rows, dtype=stats_dtype, device=x2d.device)
        rstd = torch.empty(n_rows, dtype=stats_dtype, device=x2d.device)
    if n_rows == 0 or n_cols == 0:
        return (
            y,
            mean if mean is None else mean.fill_(math.nan),
            rstd if rstd is None else rstd.fill_(math.nan),
        )
    # the kernels read the parameters' columns adjacent, whatever strides they came with
    w = weight.reshape(-1).contiguous() if weight is not None else x2d  # x2d: never read
    b = bias.reshape(-1).contiguous() if bias is not None else x2d
    flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, RMS=rms,
                 SAVE_STATS=save_stats, ACC_DTYPE=_acc_dtype(x2d.dtype))  # fmt: skip
    if not save_stats:
        mean = rstd = y  # pointers never written

    block_n = triton.next_power_of_2(n_cols)
    if block_n <= MAX_FUSED_BLOCK:
        rows, num_warps = _config(block_n)
        norm_fwd_kernel[(triton.cdiv(n_rows, rows),)](
            x2d, y, w, b, mean if not rms else rstd, rstd, n_rows, n_cols, x2d.stride(0),
            y.stride(0), eps, BLOCK_N=block_n, ROWS=rows, num_warps=num_warps, **flags,
        )  # fmt: skip
    else:
        norm_fwd_looped_kernel[(n_rows,)](
            x2d, y, w, b, mean if not rms else rstd, rstd, n_cols, x2d.stride(0), y.stride(0),
            eps, BLOCK_N=LOOP_BLOCK, num_warps=16, **flags,
        )  # fmt: skip
    return (y, mean, rstd) if save_stats else (y, None, None)


def norm_backward(
    dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
    rstd: torch.Tensor, needs: Sequence[bool], rms: bool = False,
    bias_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """(dx [M, N], dweight [N], dbias [N]) for the output's gradient dy2d [M, N], each None
    where `needs` (for x, weight, bias) says it is not wanted; the parameters' gradients in
    weight's dtype and in `bias_dtype` (default: x's)."""
    need_dx, need_dw, need_db = needs
    dy2d = dy2d if dy2d.stride(1) == 1 or dy2d.shape[1] == 1 else dy2d.contiguous()
    n_rows, n_cols = x2d.shape
    dx = torch.empty((n_rows, n_cols), dtype=x2d.dtype, device=x2d.device) if need_dx else None
    dtypes = (weight.dtype if weight is not None else x2d.dtype, bias_dtype or x2d.dtype)
    if n_rows == 0 or n_cols == 0:
        zeros = [torch.zeros(n_cols, dtype=d, device=x2d.device) for d in dtypes]
        return dx, zeros[0] if need_dw else None, zeros[1] if need_db else None
    block_n = triton.next_power_of_2(n_cols)
    fused = block_n <= MAX_FUSED_BLOCK
    rows, num_warps = _config(block_n) if fused else (1, 16)
    # the backward holds about six [ROWS, BLOCK_N] tiles at once, the forward two or three:
    # at least 8 warps, so that no thread holds more than 16 values of each
    num_warps = max(num_warps, 8)
    programs = min(_backward_programs(x2d), triton.cdiv(n_rows, rows))
    # rows per program, a multiple of the program's ROWS so that its steps stay aligned
    rows_per_program = triton.cdiv(triton.cdiv(n_rows, programs), rows) * rows
    programs = triton.cdiv(n_rows, rows_per_program)
    make = torch.empty if fused else torch.zeros  # the looped kernel adds into its row
    # dw's and db's partial sums, [2, programs, N], one row per program
    partial = rstd
    if need_dw or need_db:
        partial = make((2, programs, n_cols), dtype=rstd.dtype, device=x2d.device)
    w = weight.reshape(-1).contiguous() if weight is not None else x2d
    args = (
        dy2d, x2d, w, mean if not rms else rstd, rstd, dx if need_dx else x2d, partial,
        n_rows, n_cols, dy2d.stride(0), x2d.stride(0), dx.stride(0) if need_dx else 0,
        rows_per_program,
    )  # fmt: skip
    flags = dict(HAS_WEIGHT=weight is not None, RMS=rms, DX=need_dx, DW=need_dw, DB=need_db,
                 ACC_DTYPE=_acc_dtype(x2d.dtype), num_warps=num_warps)  # fmt: skip
    if fused:
        norm_bwd_kernel[(programs,)](*args, BLOCK_N=block_n, ROWS=rows, **flags)
    else:
        norm_bwd_looped_kernel[(programs,)](*args, BLOCK_N=LOOP_BLOCK, **flags)
    if not (need_dw or need_db):
        return dx, None, None
    # both sums in one launch: dw's in out[0], db's in out[1]
    out = torch.empty((2, n_cols), dtype=dtypes[0], device=x2d.device)
    grid = (triton.cdiv(n_cols, PARTIAL_BLOCK_N), need_dw + need_db)
    sum_rows_kernel[grid](
        partial, out, programs, n_cols, 0 if need_dw else 1,
        BLOCK_P=PARTIAL_BLOCK_P, BLOCK_N=PARTIAL_BLOCK_N,
    )  # fmt: skip
    db = out[1] if dtypes[1] == dtypes[0] else out[1].to(dtypes[1])
    return dx, out[0] if need_dw else None, db if need_db else None


class NormFunction(torch.autograd.Function):
    """LayerNorm (or, with `rms`, RMSNorm) over the last len(shape) dimensions, forward
    and backward by the kernels above."""

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps, rms):
        x2d = _rows(x, math.prod(shape))
        y, mean, rstd = norm_forward(x2d, weight, bias, eps, rms)
        ctx.save_for_backward(x2d, weight, mean, rstd)
        ctx.rms, ctx.x_shape, ctx.shape = rms, x.shape, shape
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2d, weight, mean, rstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        needs = (needs[0], weight is not None and needs[2], ctx.bias_dtype is not None and needs[3])
        dx, dw, db = norm_backward(
            dy.reshape(x2d.shape), x2d, weight, mean, rstd, needs, ctx.rms, ctx.bias_dtype
        )  # fmt: skip
        dx = dx.view(ctx.x_shape) if dx is not None else None
        dw = dw.view(ctx.shape) if dw is not None else None
        db = db.view(ctx.shape) if db is not None else None
        return dx, None, dw, db, None, None


def _tracked(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _untracked(x, shape, weight, bias, eps, rms) -> torch.Tensor:
    """The forward alone, for a call no backward can follow: y only, with no views where x
    is already [M, N] with adjacent columns (each costs the host a microsecond)."""
    if x.dim() == 2 and len(shape) == 1 and x.stride(1) == 1:
        return norm_forward(x, weight, bias, eps, rms, save_stats=False)[0]
    return norm_forward(_rows(x, math.prod(shape)), weight, bias, eps, rms, False)[0].view(x.shape)


def layer_norm(
    x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, eps: float = 1e-5,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.layer_norm: x [..., *normalized_shape] normalised over its last
    dimensions to mean 0 and variance 1 (biased, eps inside the square root), times weight
    plus bias (each of shape normalized_shape, or None); differentiable."""
    shape = _check("layer_norm", x, normalized_shape, {"weight": weight, "bias": bias})
    if not _tracked(x, weight, bias):  # no backward can come: no autograd, no statistics
        return _untracked(x, shape, weight, bias, eps, False)
    return NormFunction.apply(x, shape, weight, bias, float(eps), False)


def rms_norm(
    x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.rms_norm: x / sqrt(mean(x²) + eps) over x's last dimensions, times
    weight (of shape normalized_shape, or None); differentiable. eps None is torch's default,
    the machine epsilon of the dtype the statistics are computed in (float32 for 16-bit x)."""
    shape = _check("rms_norm", x, normalized_shape, {"weight": weight})
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    if not _tracked(x, weight):
        return _untracked(x, shape, weight, None, eps, True)
    return NormFunction.apply(x, shape, weight, None, float(eps), True)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm (same parameters, initialisation and state_dict), computed by
    the kernels above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm (same parameters, initialisation and state_dict), computed by the
    kernels above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)
