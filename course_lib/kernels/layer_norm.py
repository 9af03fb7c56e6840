"""Lesson 09: layer norm and RMSNorm over the last dimensions, forward and backward.

The forward is lesson 04's row reduction: a row that fits one block is read once, its mean
and variance computed in float32 (float64 for float64 inputs) from the values in registers,
and written once, normalised; the mean and the reciprocal standard deviation (rstd) are
saved for the backward. A forward that no backward can follow saves no statistics.

The backward computes dx row by row (the row's two means, of w·dy and of x̂·w·dy), and the
weight's and bias's gradients, which sum over every row: each program accumulates its own
rows' share in registers and writes one row of dw's and one of db's float32 partial sums,
and a second small kernel sums those rows into each gradient, in its parameter's dtype.
The order of every sum is fixed, so the gradients are the same on every run (atomics would
not be; lesson 09 measures both).

RMSNorm is the same with no mean and no bias: y = x / sqrt(mean(x²) + eps) · w.
`layer_norm`, `rms_norm`, `LayerNorm` and `RMSNorm` follow torch.nn.functional's and
torch.nn's semantics. What the lesson does not cover is elsewhere: the checks, the kernels'
configs and what a call works out once (norm_plans.py), and rows wider than one block
(layer_norm_wide_rows.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from course_lib.kernels import norm_plans as plans
from course_lib.kernels._launch import LeanLauncher
from course_lib.kernels._plan import PlanCache, signature


@triton.jit
def norm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, stats_ptr, n_rows, n_cols, stride_x,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, RMS: tl.constexpr, SAVE_STATS: tl.constexpr,
    ACC_DTYPE: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """y [n_rows, n_cols] contiguous; stats [2, n_rows], the means then the rstds (RMSNorm's
    [1, n_rows], the rstds)."""
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
            tl.store(stats_ptr + rows, mean, mask=row_mask)
    # the biased variance (divided by n, as torch's layer_norm), from the centred values:
    # a second pass over registers, not over memory
    var = tl.sum(centred * centred, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + EPS)  # eps inside the square root
    if SAVE_STATS:  # for the backward; a forward without one saves nothing
        tl.store(stats_ptr + (0 if RMS else n_rows) + rows, rstd, mask=row_mask)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=cols < n_cols).to(ACC_DTYPE)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=cols < n_cols).to(ACC_DTYPE)[None, :]
    tl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


@triton.jit
def norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, partial_ptr,
    n_rows, n_cols, stride_dy, stride_x, rows_per_program,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    RMS: tl.constexpr, DX: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """dx [n_rows, n_cols] contiguous; partial [2, programs, n_cols], dw's partial sums then
    db's, one row per program."""
    pid = tl.program_id(axis=0)
    dw_partial_ptr = partial_ptr
    db_partial_ptr = partial_ptr + tl.num_programs(axis=0).to(tl.int64) * n_cols
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
        rstd = tl.load(stats_ptr + (0 if RMS else n_rows) + rows, mask=row_mask, other=0.0)
        if RMS:
            x_hat = x * rstd[:, None]
        else:
            mean = tl.load(stats_ptr + rows, mask=row_mask, other=0.0)
            x_hat = (x - mean[:, None]) * rstd[:, None]
        if DX:
            wdy = dy * w  # 0 on padded lanes, where dy is 0
            # dx = rstd * (w dy - mean(w dy) - x_hat * mean(x_hat w dy)); RMSNorm has no
            # mean to subtract, so no mean(w dy)
            c1 = tl.sum(x_hat * wdy, axis=1) / n_cols
            dx = wdy - x_hat * c1[:, None]
            if not RMS:
                dx -= (tl.sum(wdy, axis=1) / n_cols)[:, None]
            dx_ptrs = dx_ptr + rows[:, None] * n_cols + cols[None, :]
            tl.store(dx_ptrs, (dx * rstd[:, None]).to(dx_ptr.dtype.element_ty), mask=mask)
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
def sum_rows_kernel(
    partial_ptr, dw_ptr, db_ptr, n_partials, n_cols, first,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dw[n] = sum over p of partial[0, p, n] and db[n] of partial[1, p, n], for partial
    [2, n_partials, n_cols], in a fixed order: each program sums its BLOCK_N columns down
    all the rows of one of the two (first + program_id(1)), in float32, and rounds the
    total once, to its parameter's dtype."""
    part = first + tl.program_id(axis=1)
    partial_ptr += part.to(tl.int64) * n_partials * n_cols
    cols = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    acc = tl.zeros([BLOCK_P, BLOCK_N], partial_ptr.dtype.element_ty)
    for start in range(0, n_partials, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)  # [BLOCK_P]
        mask = (p[:, None] < n_partials) & (cols[None, :] < n_cols)
        rows = p[:, None].to(tl.int64) * n_cols  # past 2**31 for very wide rows
        acc += tl.load(partial_ptr + rows + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if part == 0:
        tl.store(dw_ptr + cols, total.to(dw_ptr.dtype.element_ty), mask=cols < n_cols)
    else:
        tl.store(db_ptr + cols, total.to(db_ptr.dtype.element_ty), mask=cols < n_cols)


# --- the launchers --------------------------------------------------------------------------

# each kernel[grid], lean (see _launch.py), bound once per plan (see norm_plans.py)
KERNELS = plans.Kernels(
    LeanLauncher(norm_fwd_kernel), LeanLauncher(norm_bwd_kernel), LeanLauncher(sum_rows_kernel)
)
# the plans by the call's signature: checking and choosing again on every call would cost
# the host more than the launch itself (see _plan.py)
_plans = PlanCache()


def plan_for(x, normalized_shape, weight, bias, eps, rms: bool) -> plans.ForwardPlan:
    """The forward's plan for a call with these arguments (see norm_plans.ForwardPlan)."""
    key = signature((x, weight, bias), plans.options(normalized_shape, eps, rms))
    plan = _plans.get(key)
    if plan is None:  # the first call laid out like this: checks, configs, which kernels
        plan = _plans.put(key, plans.ForwardPlan(x, normalized_shape, weight, bias, eps, rms,
                                                 KERNELS))  # fmt: skip
    return plan


def _norm(x, normalized_shape, weight, bias, eps, rms: bool) -> torch.Tensor:
    plan = plan_for(x, normalized_shape, weight, bias, eps, rms)
    if torch.is_grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return NormFunction.apply(x, weight, bias, plan)
    return plan(x, weight, bias, save_stats=False)[0]  # no backward can come: no statistics


def layer_norm(
    x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, eps: float = 1e-5,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.layer_norm: x [..., *normalized_shape] normalised over its last
    dimensions to mean 0 and variance 1 (biased, eps inside the square root), times weight
    plus bias (each of shape normalized_shape, or None); differentiable."""
    return _norm(x, normalized_shape, weight, bias, eps, False)


def rms_norm(
    x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.rms_norm: x / sqrt(mean(x²) + eps) over x's last dimensions, times
    weight (of shape normalized_shape, or None); differentiable. eps None is torch's default,
    the machine epsilon of the dtype the statistics are computed in (float32 for 16-bit x)."""
    return _norm(x, normalized_shape, weight, None, eps, True)


def norm_backward(dy, x, weight, stats, needs, plan: plans.ForwardPlan):
    """(dx, dweight, dbias) for the output's gradient dy, each None where `needs` (for x,
    weight, bias) says it is not wanted, from what the forward's `plan` saved."""
    return plans.backward(dy, x, weight, stats, needs, plan.rms, plan.bias_dtype,
                          plan.param_shape, KERNELS)  # fmt: skip


class NormFunction(torch.autograd.Function):
    """LayerNorm or RMSNorm (as the plan says), forward and backward by the kernels above."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan):
        y, stats, x_read = plan(x, weight, bias, save_stats=True)
        ctx.save_for_backward(x_read, weight, stats)
        ctx.plan, ctx.has_bias = plan, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        needs = (need_x, weight is not None and need_w, ctx.has_bias and need_b)
        return (*norm_backward(dy, x, weight, stats, needs, ctx.plan), None)


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
