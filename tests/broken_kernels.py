"""Deliberately broken launchers, one classic mistake each, for testing the checkers.

Each kernel differs from the finished one in exactly the way its name says.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib import references, runtime

# --- lesson 01: vector add and axpy -------------------------------------------------------


BLOCK_SIZE = 128


@triton.jit
def add_no_mask_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y)  # mistake: no mask on the store


@triton.jit
def add_no_load_mask_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets)  # mistake: unmasked loads
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_no_store_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    x + y  # noqa: B018  (mistake: computed, never stored)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x - y, mask=mask)  # mistake: wrong operation


def _launch(kernel, x, y, *, grid=None, out=None):
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    grid = grid if grid is not None else (triton.cdiv(n, BLOCK_SIZE),)
    kernel[grid](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return out


def add_without_mask(x, y):
    return _launch(add_no_mask_kernel, x, y)


def add_without_load_mask(x, y):
    return _launch(add_no_load_mask_kernel, x, y)


def add_without_store(x, y):
    return _launch(add_no_store_kernel, x, y)


def add_grid_too_small(x, y):
    return _launch(add_kernel, x, y, grid=(x.numel() // BLOCK_SIZE or 1,))  # floor, not ceil


def add_grid_floor(x, y):
    return _launch(add_kernel, x, y, grid=(x.numel() // BLOCK_SIZE,))  # 0 programs below a block


def add_wrong_op(x, y):
    return _launch(sub_kernel, x, y)


def add_wrong_dtype(x, y):
    return _launch(add_kernel, x, y, out=torch.empty(x.shape, dtype=torch.float32, device=x.device))


def add_returns_input(x, y):
    _launch(add_kernel, x, y, out=x)  # writes into x and returns it
    return x


def add_forgets_return(x, y):
    _launch(add_kernel, x, y)


def add_raises(x, y):
    raise RuntimeError("launcher exploded")


def add_zero_output(x, y):
    out = torch.zeros_like(x)
    add_kernel[(1,)](x, y, out, min(x.numel(), BLOCK_SIZE), BLOCK_SIZE=BLOCK_SIZE)
    return out


@triton.jit
def add_no_masks_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))  # no masks


def add_without_any_mask(x, y):
    return _launch(add_no_masks_kernel, x, y)


@triton.jit
def add_shifted_kernel(
    x_ptr,
    y_ptr,
    out_ptr,
    n_elements,
    BLOCK_SIZE: tl.constexpr,
    SHIFT: tl.constexpr,
    SPREAD: tl.constexpr,
    INTO_X: tl.constexpr,
):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE * SPREAD + tl.arange(0, BLOCK_SIZE) - SHIFT
    mask = (offsets < n_elements) & (offsets >= -SHIFT)
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    if INTO_X:  # mistake: the result goes to an input
        tl.store(x_ptr + offsets, x + y, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def _shifted(x, y, shift=0, spread=1, into_x=False):
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), BLOCK_SIZE),)
    add_shifted_kernel[grid](x, y, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE, SHIFT=shift,
                             SPREAD=spread, INTO_X=into_x)  # fmt: skip
    return out


def add_offsets_shifted_back(x, y):
    return _shifted(x, y, shift=3)  # every block starts 3 elements early


def add_blocks_spread_apart(x, y):
    return _shifted(x, y, spread=2)  # program p covers block 2p: every other block is skipped


def add_writes_into_x(x, y):
    return _shifted(x, y, into_x=True)


# mistakes whose hints must not point at the wrong fix


@triton.jit
def add_unscaled_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) + tl.arange(0, BLOCK_SIZE)  # mistake: pid not times the block
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add_unscaled_offsets(x, y, block=BLOCK_SIZE):
    out = torch.empty_like(x)
    add_unscaled_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK_SIZE=block)
    return out


def add_unscaled_offsets_notebook_block(x, y):
    return add_unscaled_offsets(x, y, block=1024)  # lesson 01's BLOCK_SIZE


def add_grid_too_small_notebook_block(x, y):
    out = torch.empty_like(x)
    add_kernel[(x.numel() // 1024 or 1,)](x, y, out, x.numel(), BLOCK_SIZE=1024)
    return out


@triton.jit
def axpy_kernel(
    x_ptr, y_ptr, out_ptr, alpha, n_elements,
    BLOCK_SIZE: tl.constexpr, FORM: tl.constexpr, MASK_STORE: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    if FORM == "alpha on y":  # mistake: y is scaled instead of x
        out = x + alpha * y
    elif FORM == "alpha on both":  # mistake: the sum is scaled
        out = alpha * (x + y)
    elif FORM == "no alpha":  # mistake: alpha never used
        out = x + y
    elif FORM == "no y":  # mistake: y never added
        out = alpha * x
    else:
        out = alpha * x + y
    if MASK_STORE:
        tl.store(out_ptr + offsets, out, mask=mask)
    else:  # mistake: the last block writes past the end
        tl.store(out_ptr + offsets, out)


def _axpy(alpha, x, y, *, form="right", mask_store=True, floor_grid=False):
    out = torch.empty_like(x)
    n = x.numel()
    grid = (max(n // BLOCK_SIZE, 1),) if floor_grid else (triton.cdiv(n, BLOCK_SIZE),)
    axpy_kernel[grid](x, y, out, alpha, n, BLOCK_SIZE=BLOCK_SIZE, FORM=form,
                      MASK_STORE=mask_store)  # fmt: skip
    return out


def axpy(alpha, x, y):  # right
    return _axpy(alpha, x, y)


def axpy_alpha_truncated(alpha, x, y):
    return _axpy(int(alpha), x, y)  # mistake: alpha made an int on the way in


def axpy_alpha_on_y(alpha, x, y):
    return _axpy(alpha, x, y, form="alpha on y")


def axpy_alpha_on_both(alpha, x, y):
    return _axpy(alpha, x, y, form="alpha on both")


def axpy_without_alpha(alpha, x, y):
    return _axpy(alpha, x, y, form="no alpha")


def axpy_without_y(alpha, x, y):
    return _axpy(alpha, x, y, form="no y")


def axpy_without_store_mask(alpha, x, y):
    return _axpy(alpha, x, y, mask_store=False)


def axpy_grid_floor(alpha, x, y):
    return _axpy(alpha, x, y, floor_grid=True)


# --- lesson 02: ReLU and an autotuned leaky ReLU ------------------------------------------


@triton.jit
def relu_identity_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)  # no max


@triton.jit
def relu_min_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.minimum(x, 0.0), mask=mask)  # min instead of max


@triton.jit
def relu_no_mask_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets, mask=offsets < n_elements)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0))  # no mask


def _relu_launch(kernel, x):
    out = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), BLOCK_SIZE),)](x, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
    return out


def relu_identity(x):
    return _relu_launch(relu_identity_kernel, x)


def relu_minimum(x):
    return _relu_launch(relu_min_kernel, x)


def relu_without_mask(x):
    return _relu_launch(relu_no_mask_kernel, x)


# mistakes whose hints must not point at the wrong fix


@triton.jit
def relu_nan_to_zero_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.where(x > 0.0, x, 0.0), mask=mask)  # NaN > 0 is False


def relu_nan_to_zero(x):
    return _relu_launch(relu_nan_to_zero_kernel, x)


def relu_grid_for_one_block_size(x, BLOCK_SIZE=1024):  # noqa: N803  (the lesson's name)
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), 1024),)  # mistake: the grid ignores BLOCK_SIZE
    relu_nan_keeping_kernel[grid](x, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
    return out


@triton.jit
def relu_nan_keeping_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    out = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(out_ptr + offsets, out, mask=mask)


def relu_nan_keeping_launcher(x, BLOCK_SIZE=1024):  # noqa: N803  (right: the grid follows it)
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), BLOCK_SIZE),)
    relu_nan_keeping_kernel[grid](x, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
    return out


@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n_elements, negative_slope, BLOCK_SIZE: tl.constexpr,
                      FORM: tl.constexpr):  # fmt: skip
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    if FORM == "max min":  # mistake: tl.maximum and tl.minimum drop NaN
        out = tl.maximum(x, 0.0) + negative_slope * tl.minimum(x, 0.0)
    elif FORM == "slope on positives":  # mistake: the wrong side is scaled
        out = tl.where(x > 0, x * negative_slope, x)
    elif FORM == "fixed slope":  # mistake: the default slope, whatever was passed
        out = tl.where(x < 0, x * 0.01, x)
    elif FORM == "relu":  # mistake: negatives become 0
        out = tl.where(x < 0, 0.0, x)
    else:  # NaN < 0 is False: NaN passes through
        out = tl.where(x < 0, x * negative_slope, x)
    tl.store(out_ptr + offsets, out, mask=mask)


LEAKY_RELU_CONFIGS = [triton.Config({"BLOCK_SIZE": 512}, num_warps=4)]


leaky_relu_autotuned = triton.autotune(configs=LEAKY_RELU_CONFIGS, key=["n_elements"])(
    leaky_relu_kernel
)


# several configs: right on a GPU, and refused in the interpreter, which cannot time them
leaky_relu_many_configs = triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 256}), triton.Config({"BLOCK_SIZE": 1024})],
    key=["n_elements"],
)(leaky_relu_kernel)


def _leaky_relu(x, negative_slope, *, form="right", kernel=leaky_relu_autotuned, grid=None,
                **meta):  # fmt: skip
    out = torch.empty_like(x)
    n = x.numel()
    grid = grid or (lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),))
    kernel[grid](x, out, n, negative_slope, FORM=form, **meta)
    return out


def leaky_relu(x, negative_slope=0.01):  # right
    return _leaky_relu(x, negative_slope)


def leaky_relu_nan_to_zero(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, form="max min")


def leaky_relu_slope_on_positives(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, form="slope on positives")


def leaky_relu_fixed_slope(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, form="fixed slope")


def leaky_relu_as_relu(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, form="relu")


def leaky_relu_passes_block_size(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, BLOCK_SIZE=512)  # mistake: a config sets it


def leaky_relu_tuple_grid(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, grid=(triton.cdiv(x.numel(), 512),))  # for 512 only


def leaky_relu_grid_ignores_meta(x, negative_slope=0.01):
    n = x.numel()
    return _leaky_relu(x, negative_slope, grid=lambda meta: (triton.cdiv(n, 512),))


def leaky_relu_many_configs_everywhere(x, negative_slope=0.01):
    return _leaky_relu(x, negative_slope, kernel=leaky_relu_many_configs)


def leaky_relu_not_autotuned(x, negative_slope=0.01):
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, 512),)
    leaky_relu_kernel[grid](x, out, n, negative_slope, BLOCK_SIZE=512, FORM="right")
    return out


# --- lesson 03: 2-D add and transpose -----------------------------------------------------


BLOCK_M, BLOCK_N = 16, 32


@triton.jit
def add_2d_kernel(
    x_ptr, y_ptr, out_ptr, M, N, sxm, sxn, sym, syn, som, son,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SWAP_AXES: tl.constexpr, ROW_MASK_ONLY: tl.constexpr,
):  # fmt: skip
    if SWAP_AXES:  # mistake: rows taken from the grid's second axis
        pid_m, pid_n = tl.program_id(1), tl.program_id(0)
    else:
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if ROW_MASK_ONLY:  # mistake: the columns of the right-most tiles are not masked
        mask = (offs_m[:, None] < M) & (offs_n[None, :] >= 0)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    x = tl.load(x_ptr + offs_m[:, None] * sxm + offs_n[None, :] * sxn, mask=mask)
    y = tl.load(y_ptr + offs_m[:, None] * sym + offs_n[None, :] * syn, mask=mask)
    tl.store(out_ptr + offs_m[:, None] * som + offs_n[None, :] * son, x + y, mask=mask)


def _add_2d(x, y, *, strides=None, swap=False, row_mask_only=False, floor_grid=False,
            tiles=(BLOCK_M, BLOCK_N), out=None):  # fmt: skip
    M, N = x.shape
    out = torch.empty((M, N), dtype=x.dtype, device=x.device) if out is None else out
    div = (lambda a, b: max(a // b, 1)) if floor_grid else triton.cdiv
    grid = (div(M, tiles[0]), div(N, tiles[1]))
    strides = strides or (*x.stride(), *y.stride())
    add_2d_kernel[grid](x, y, out, M, N, *strides, *out.stride(), BLOCK_M=tiles[0],
                        BLOCK_N=tiles[1], SWAP_AXES=swap, ROW_MASK_ONLY=row_mask_only)  # fmt: skip
    return out


def add_2d_assumes_contiguous(x, y):
    N = x.shape[1]
    return _add_2d(x, y, strides=(N, 1, N, 1))


def add_2d_swapped_axes(x, y):
    return _add_2d(x, y, swap=True)


def add_2d_row_mask_only(x, y):
    return _add_2d(x, y, row_mask_only=True)


def add_2d_grid_floor(x, y):
    return _add_2d(x, y, floor_grid=True)


# mistakes whose hints must not point at the wrong fix


def add_2d_swapped_axes_notebook_tiles(x, y):
    return _add_2d(x, y, swap=True, tiles=(32, 128))  # lesson 03's tiles


def add_2d_swapped_x_strides(x, y, tiles=(BLOCK_M, BLOCK_N)):
    return _add_2d(x, y, strides=(*x.stride()[::-1], *y.stride()), tiles=tiles)


def add_2d_swapped_x_strides_notebook_tiles(x, y):
    return add_2d_swapped_x_strides(x, y, tiles=(32, 128))


def add_2d_output_like_x(x, y):
    return _add_2d(x, y, out=torch.empty_like(x))  # keeps a transposed x's strides


TRANSPOSE_TILES = (16, 32)  # smaller than lesson 03's 32 x 128, and not square either


NOTEBOOK_TILES = (32, 128)  # lesson 03's BLOCK_M, BLOCK_N


@triton.jit
def transpose_kernel(
    x_ptr, out_ptr, M, N, sxm, sxn, son, som,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SWAP_AXES: tl.constexpr, MASK_ROWS: tl.constexpr, MASK_COLUMNS: tl.constexpr,
):  # fmt: skip
    if SWAP_AXES:  # mistake: x's row tile taken from the grid's second axis
        pid_m, pid_n = tl.program_id(1), tl.program_id(0)
    else:
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask = (offs_m[:, None] >= 0) & (offs_n[None, :] >= 0)  # all true
    if MASK_ROWS:  # either flag off is the mistake of a mask on one axis only
        mask = mask & (offs_m[:, None] < M)
    if MASK_COLUMNS:
        mask = mask & (offs_n[None, :] < N)
    tile = tl.load(x_ptr + offs_m[:, None] * sxm + offs_n[None, :] * sxn, mask=mask)
    tl.store(out_ptr + offs_n[None, :] * son + offs_m[:, None] * som, tile, mask=mask)


def _transpose(x, *, tiles=TRANSPOSE_TILES, x_strides=None, out_strides=None, out=None,
               grid=None, swap=False, mask_rows=True, mask_columns=True):  # fmt: skip
    M, N = x.shape
    out = torch.empty((N, M), dtype=x.dtype, device=x.device) if out is None else out
    grid = grid or (triton.cdiv(M, tiles[0]), triton.cdiv(N, tiles[1]))
    transpose_kernel[grid](
        x, out, M, N, *(x_strides or x.stride()), *(out_strides or out.stride()),
        BLOCK_M=tiles[0], BLOCK_N=tiles[1],
        SWAP_AXES=swap, MASK_ROWS=mask_rows, MASK_COLUMNS=mask_columns,
    )  # fmt: skip
    return out


def transpose_tiled(x):  # right
    return _transpose(x)


def transpose_tiled_notebook_tiles(x):  # right
    return _transpose(x, tiles=NOTEBOOK_TILES)


def transpose_returns_view(x):
    return x.t()  # a view of x: no copy, no kernel


def transpose_returns_input(x):
    return x


def transpose_into_transposed_view(x):
    M, N = x.shape
    # right values, but the [N, M] result is a view of an [M, N] tensor: not contiguous
    return _transpose(x, out=torch.empty((M, N), dtype=x.dtype, device=x.device).t())


def transpose_assumes_contiguous(x):
    return _transpose(x, x_strides=(x.shape[1], 1))


def transpose_in_x_order(x, tiles=TRANSPOSE_TILES):
    # stores element (m, n) at m * N + n, where a contiguous x holds it: x.reshape(N, M)
    return _transpose(x, out_strides=(1, x.shape[1]), tiles=tiles)


def transpose_in_x_order_notebook_tiles(x):
    return transpose_in_x_order(x, tiles=NOTEBOOK_TILES)


def transpose_swapped_x_strides(x):
    return _transpose(x, x_strides=x.stride()[::-1])


def transpose_row_mask_only(x, tiles=TRANSPOSE_TILES):
    return _transpose(x, mask_columns=False, tiles=tiles)


def transpose_row_mask_only_notebook_tiles(x):
    return transpose_row_mask_only(x, tiles=NOTEBOOK_TILES)


def transpose_column_mask_only(x):
    return _transpose(x, mask_rows=False)


def transpose_swapped_axes(x, tiles=TRANSPOSE_TILES):
    return _transpose(x, swap=True, tiles=tiles)


def transpose_swapped_axes_notebook_tiles(x):
    return transpose_swapped_axes(x, tiles=NOTEBOOK_TILES)


def transpose_grid_over_output_notebook_tiles(x):
    M, N = x.shape  # mistake: a grid for the [N, M] output, with x's tile names
    grid = (triton.cdiv(N, NOTEBOOK_TILES[0]), triton.cdiv(M, NOTEBOOK_TILES[1]))
    return _transpose(x, tiles=NOTEBOOK_TILES, grid=grid)


def _floor_grid(x, rows, columns, tiles=TRANSPOSE_TILES):
    (M, N), (bm, bn) = x.shape, tiles
    grid = (max(M // bm, 1) if rows else triton.cdiv(M, bm),
            max(N // bn, 1) if columns else triton.cdiv(N, bn))  # fmt: skip
    return _transpose(x, grid=grid, tiles=tiles)


def transpose_grid_floor(x):
    return _floor_grid(x, rows=True, columns=True)


def transpose_grid_floor_notebook_tiles(x):
    return _floor_grid(x, rows=True, columns=True, tiles=NOTEBOOK_TILES)


def transpose_grid_floor_rows(x):
    return _floor_grid(x, rows=True, columns=False)


def transpose_grid_floor_columns(x):
    return _floor_grid(x, rows=False, columns=True)


# --- lesson 04: softmax -------------------------------------------------------------------


@triton.jit
def softmax_kernel(
    x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out,
    BLOCK_SIZE: tl.constexpr, PAD: tl.constexpr, SUBTRACT_MAX: tl.constexpr,
    TENSOR_MASK: tl.constexpr = False, HALF_SUM: tl.constexpr = False,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    load_mask = mask
    if TENSOR_MASK:  # mistake: the mask keeps the block inside the tensor, not the row
        load_mask = row * stride_x + cols < n_rows * n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=load_mask, other=PAD).to(tl.float32)
    if SUBTRACT_MAX:
        x = x - tl.max(x, axis=0)
    numerator = tl.exp(x)
    if HALF_SUM:  # mistake: the exponentials, and so their sum, kept in float16
        numerator = numerator.to(tl.float16)
    out = numerator / tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _softmax(x, *, block=None, pad=-float("inf"), subtract_max=True, row_stride=None,
             tensor_mask=False, half_sum=False):  # fmt: skip
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block = block or triton.next_power_of_2(n_cols)
    stride = row_stride if row_stride is not None else x.stride(0)
    softmax_kernel[(n_rows,)](x, out, n_rows, n_cols, stride, out.stride(0), BLOCK_SIZE=block,
                              PAD=pad, SUBTRACT_MAX=subtract_max, TENSOR_MASK=tensor_mask,
                              HALF_SUM=half_sum)  # fmt: skip
    return out


def softmax_fixed_block_256(x):
    return _softmax(x, block=256)  # the seed's pitfall: right only for rows of <= 256


def softmax_zero_padding(x):
    return _softmax(x, pad=0.0)


def softmax_no_max_subtraction(x):
    return _softmax(x, subtract_max=False)


def softmax_ignores_row_stride(x):
    return _softmax(x, row_stride=x.shape[1])


@triton.jit
def softmax_columns_kernel(
    x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.arange(0, ROWS)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    numerator = tl.exp(x.to(tl.float32) - tl.max(x.to(tl.float32), axis=0)[None, :])
    out = numerator / tl.sum(numerator, axis=0)[None, :]  # mistake: axis 0, the columns
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)  # fmt: skip


def softmax_over_columns(x):
    # a block of columns per program: a transposed one-row-per-program launch would take a
    # program per column, 70,001 of them on the float16 case, minutes in the interpreter
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    softmax_columns_kernel[(triton.cdiv(n_cols, 128),)](
        x, out, n_rows, n_cols, x.stride(0), out.stride(0),
        ROWS=triton.next_power_of_2(n_rows), BLOCK_N=128,
    )  # fmt: skip
    return out


def softmax_sums_in_half_precision(x):
    # (leaving out x.to(tl.float32) alone is not this mistake: tl.exp returns float32 for a
    # float16 input, so the sum that follows runs in float32 anyway)
    return _softmax(x, half_sum=x.dtype == torch.float16)


def softmax_whole_tensor_mask(x):
    # the store keeps the row mask: with the tensor mask there too, programs race for the
    # next row's first columns on a GPU, and a test wants one answer
    return _softmax(x.contiguous(), tensor_mask=True)


@triton.jit
def softmax_looped_variant_kernel(
    x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_SIZE: tl.constexpr,
    RESCALE: tl.constexpr, GUARD: tl.constexpr, ONE_PASS: tl.constexpr,
    SECOND_OFFSETS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        block = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(block, axis=0))
        shift = m_new
        if GUARD:  # mistake when False: -inf - (-inf) = NaN while the max is -inf
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        if RESCALE:  # mistake when False: old terms keep the old max
            s = s * tl.exp(m - shift)
        s = s + tl.sum(tl.exp(block - shift), axis=0)
        m = m_new
        if ONE_PASS:  # mistake: each block normalised with the statistics so far
            tl.store(out_row + cols, (tl.exp(block - m) / s).to(out_ptr.dtype.element_ty),
                     mask=cols < n_cols)  # fmt: skip
    if not ONE_PASS:
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = tl.arange(0, BLOCK_SIZE)
            if SECOND_OFFSETS:  # mistake when False: every trip stores the first block
                cols = start + tl.arange(0, BLOCK_SIZE)
            block = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"))
            probs = tl.exp(block.to(tl.float32) - m) / s
            tl.store(out_row + cols, probs.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def _softmax_looped(x, BLOCK_SIZE=2048, *, rescale=True, guard=True, one_pass=False,  # noqa: N803
                    second_offsets=True):  # fmt: skip
    x = x if x.stride(1) == 1 else x.contiguous()
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block = min(BLOCK_SIZE, triton.next_power_of_2(n_cols))
    softmax_looped_variant_kernel[(n_rows,)](
        x, out, n_cols, x.stride(0), out.stride(0), BLOCK_SIZE=block, RESCALE=rescale,
        GUARD=guard, ONE_PASS=one_pass, SECOND_OFFSETS=second_offsets,
    )  # fmt: skip
    return out


def softmax_looped_correct(x, BLOCK_SIZE=2048):  # noqa: N803  (the lesson's name)
    return _softmax_looped(x, BLOCK_SIZE)


def softmax_looped_no_rescale(x, BLOCK_SIZE=2048):  # noqa: N803
    return _softmax_looped(x, BLOCK_SIZE, rescale=False)


def softmax_looped_no_inf_guard(x, BLOCK_SIZE=2048):  # noqa: N803
    return _softmax_looped(x, BLOCK_SIZE, guard=False)


def softmax_looped_one_pass(x, BLOCK_SIZE=2048):  # noqa: N803
    return _softmax_looped(x, BLOCK_SIZE, one_pass=True)


def softmax_looped_second_pass_no_offsets(x, BLOCK_SIZE=2048):  # noqa: N803
    return _softmax_looped(x, BLOCK_SIZE, second_offsets=False)


@triton.jit
def softmax_persistent_variant_kernel(
    x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out, BLOCK_SIZE: tl.constexpr,
    LOOP: tl.constexpr, FROM_ZERO: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid
    if FROM_ZERO:  # mistake: every program starts at row 0
        first_row = pid * 0
    end = n_rows
    if not LOOP:  # mistake: one row per program, as in the one-program-per-row kernel
        end = tl.minimum(first_row + 1, n_rows)
    for row in tl.range(first_row, end, tl.num_programs(0)):
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
        numerator = tl.exp(x.to(tl.float32) - tl.max(x.to(tl.float32), axis=0))
        out = numerator / tl.sum(numerator, axis=0)
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _softmax_persistent(x, n_programs=None, *, loop=True, from_zero=False):
    x = x if x.stride(1) == 1 else x.contiguous()
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    n_programs = n_programs or 4
    softmax_persistent_variant_kernel[(min(n_rows, n_programs),)](
        x, out, n_rows, n_cols, x.stride(0), out.stride(0),
        BLOCK_SIZE=triton.next_power_of_2(n_cols), LOOP=loop, FROM_ZERO=from_zero,
    )  # fmt: skip
    return out


def softmax_persistent_correct(x, n_programs=None):
    return _softmax_persistent(x, n_programs)


def softmax_persistent_no_loop(x, n_programs=None):
    return _softmax_persistent(x, n_programs, loop=False)


def softmax_persistent_loop_from_zero(x, n_programs=None):
    return _softmax_persistent(x, n_programs, from_zero=True)


# --- lesson 05: matmul --------------------------------------------------------------------


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MASK_K: tl.constexpr, ADVANCE: tl.constexpr, FP16_ACC: tl.constexpr, MASK_STORE: tl.constexpr,
    SWAP_B_IN_FORMULA: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    if SWAP_B_IN_FORMULA:  # mistake: B's strides exchanged in the pointers, not in the advance
        b_ptrs = b_ptr + offs_k[:, None] * sbn + offs_n[None, :] * sbk
    if FP16_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)  # mistake: half accumulator
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        if not MASK_K:  # mistake: the last K step reads past the end
            k_mask = offs_k >= 0
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b).to(acc.dtype)
        if ADVANCE:
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if not MASK_STORE:  # mistake: edge tiles write past the matrix
        c_mask = offs_m[:, None] >= 0
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def _matmul(a, b, *, mask_k=True, advance=True, fp16_acc=False, mask_store=True,
            out_dtype=None, swap_a=False, swap_b_in_formula=False, tiles=(32, 32, 32)):  # fmt: skip
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=out_dtype or a.dtype, device=a.device)
    sa = a.stride()[::-1] if swap_a else a.stride()
    block_m, block_n, block_k = tiles
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel[grid](a, b, c, M, N, K, *sa, *b.stride(), *c.stride(), BLOCK_M=block_m,
                        BLOCK_N=block_n, BLOCK_K=block_k, MASK_K=mask_k, ADVANCE=advance,
                        FP16_ACC=fp16_acc, MASK_STORE=mask_store,
                        SWAP_B_IN_FORMULA=swap_b_in_formula)  # fmt: skip
    return c


def matmul_without_k_mask(a, b):
    return _matmul(a, b, mask_k=False)


def matmul_pointers_not_advanced(a, b):
    return _matmul(a, b, advance=False)


def matmul_fp16_accumulator(a, b):
    return _matmul(a, b, fp16_acc=a.dtype != torch.float32)


def matmul_fp32_output(a, b):
    return _matmul(a, b, out_dtype=torch.float32)


def matmul_without_store_mask(a, b):
    return _matmul(a, b, mask_store=False)


def matmul_swapped_a_strides(a, b):
    return _matmul(a, b, swap_a=True)


def matmul_b_strides_swapped_in_formula(a, b):
    return _matmul(a, b, swap_b_in_formula=True, tiles=(16, 16, 16))


def matmul_b_strides_swapped_in_formula_notebook_tiles(a, b):
    tiles = runtime.by_mode(gpu=(128, 128, 32), interpreter=(32, 32, 32))  # lesson 05's
    return _matmul(a, b, swap_b_in_formula=True, tiles=tiles)


MATMUL_TILE = 32  # BLOCK_M = BLOCK_N = BLOCK_K, the interpreter's tile in lesson 05


@triton.jit
def _matmul_tile(a_ptr, b_ptr, M, N, K, sam, sak, sbk, sbn, offs_m, offs_n,
                 BLOCK_K: tl.constexpr):  # fmt: skip
    """The float32 product of rows offs_m of A and columns offs_n of B."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    return acc


@triton.jit
def grouped_matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    MAPPING: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    if MAPPING == "first row not scaled":  # mistake: groups start GROUP_M times too close
        first_pid_m = pid // num_pid_in_group
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    if MAPPING == "full last group":  # mistake: the last group walked as if it were full
        group_size_m = GROUP_M + 0 * num_pid_m
    within = pid % num_pid_in_group
    pid_m = first_pid_m + within % group_size_m
    pid_n = within // group_size_m
    if MAPPING == "% and // exchanged":  # mistake
        pid_m = first_pid_m + within // group_size_m
        pid_n = within % group_size_m
    if MAPPING == "exchanged":  # mistake: the right values, each in the other's place
        pid_m, pid_n = pid_n, pid_m
    if MAPPING == "row-major":  # mistake: lesson 05's first kernel's order
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _matmul_tile(a_ptr, b_ptr, M, N, K, sam, sak, sbk, sbn, offs_m, offs_n, BLOCK_K)
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def _grouped(a, b, GROUP_M, mapping="", grid_floor=False):
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    tiles = (M // MATMUL_TILE) * (N // MATMUL_TILE) if grid_floor else (
        triton.cdiv(M, MATMUL_TILE) * triton.cdiv(N, MATMUL_TILE)
    )  # fmt: skip
    grouped_matmul_kernel[(tiles,)](
        a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=MATMUL_TILE,
        BLOCK_N=MATMUL_TILE, BLOCK_K=MATMUL_TILE, GROUP_M=GROUP_M, MAPPING=mapping,
    )  # fmt: skip
    return c


def _with_mapping(mapping: str, name: str):
    """The launcher of grouped_matmul_kernel with this mapping from pid to tile."""

    def launcher(a, b, GROUP_M=8):
        return _grouped(a, b, GROUP_M, mapping)

    launcher.__name__ = name
    return launcher


matmul_grouped = _with_mapping("", "matmul_grouped")  # right


matmul_grouped_full_last_group = _with_mapping("full last group", "matmul_grouped_full_last_group")


matmul_grouped_rest_swapped = _with_mapping("% and // exchanged", "matmul_grouped_rest_swapped")


matmul_grouped_exchanged = _with_mapping("exchanged", "matmul_grouped_exchanged")


matmul_grouped_row_major = _with_mapping("row-major", "matmul_grouped_row_major")


matmul_grouped_first_row_not_scaled = _with_mapping(
    "first row not scaled", "matmul_grouped_first_row_not_scaled"
)


def matmul_grouped_ignores_group_m(a, b, GROUP_M=8):
    return _grouped(a, b, 8)  # mistake: the argument never reaches the kernel


def matmul_grouped_grid_floor(a, b, GROUP_M=8):
    return _grouped(a, b, GROUP_M, grid_floor=True)  # mistake: no program for edge tiles


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "leaky_relu":
        x = tl.where(x >= 0, x, 0.01 * x)
    return x


@triton.jit
def matmul_bias_act_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ACTIVATION: tl.constexpr, MISTAKE: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _matmul_tile(a_ptr, b_ptr, M, N, K, sam, sak, sbk, sbn, offs_m, offs_n, BLOCK_K)
    if MISTAKE == "rounded first":  # mistake: C's dtype before the epilogue
        acc = acc.to(c_ptr.dtype.element_ty)
    if MISTAKE == "activation first":  # mistake
        acc = _activate(acc, ACTIVATION)
    if MISTAKE == "bias per row":  # mistake: bias[m] added to row m
        acc += tl.load(bias_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    elif MISTAKE == "bias down the tile":  # mistake: bias[:, None] (square tiles)
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    elif MISTAKE == "bias in full tiles":  # mistake: the partial last tile gets none
        if (tl.program_id(1) + 1) * BLOCK_N <= N:
            acc += tl.load(bias_ptr + offs_n)[None, :]
    elif MISTAKE != "no bias":
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if MISTAKE == "always relu":  # mistake: whatever ACTIVATION says
        acc = tl.maximum(acc, 0.0)
    elif MISTAKE != "activation first" and MISTAKE != "no activation":
        acc = _activate(acc, ACTIVATION)
    c_ptrs = c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))  # fmt: skip


def _bias_act(a, b, bias, activation, mistake=""):
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, MATMUL_TILE), triton.cdiv(N, MATMUL_TILE))
    matmul_bias_act_kernel[grid](
        a, b, bias, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=MATMUL_TILE,
        BLOCK_N=MATMUL_TILE, BLOCK_K=MATMUL_TILE, ACTIVATION=activation, MISTAKE=mistake,
    )  # fmt: skip
    return c


def _with_epilogue_mistake(mistake: str):
    """The launcher of matmul_bias_act_kernel making `mistake`, named after it."""

    def launcher(a, b, bias, activation=None):
        return _bias_act(a, b, bias, activation, mistake)

    launcher.__name__ = "_".join(["matmul_bias_act", *mistake.split()])
    return launcher


matmul_bias_act = _with_epilogue_mistake("")  # right


matmul_bias_act_no_bias = _with_epilogue_mistake("no bias")


matmul_bias_act_bias_per_row = _with_epilogue_mistake("bias per row")


matmul_bias_act_bias_down_the_tile = _with_epilogue_mistake("bias down the tile")


matmul_bias_act_bias_in_full_tiles = _with_epilogue_mistake("bias in full tiles")


matmul_bias_act_activation_first = _with_epilogue_mistake("activation first")


matmul_bias_act_rounded_first = _with_epilogue_mistake("rounded first")


matmul_bias_act_no_activation = _with_epilogue_mistake("no activation")


matmul_bias_act_always_relu = _with_epilogue_mistake("always relu")


# --- lesson 06: conv2d --------------------------------------------------------------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@triton.jit
def conv2d_variant_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, B, C, H, W, O, OH, OW,
    sxb, sxc, sxh, sxw, swo, swc, swr, sws, sob, soc, soh, sow,
    SH, SW, PH, PW, DH, DW, KH: tl.constexpr, KW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MASK_PADDING: tl.constexpr, FLIP: tl.constexpr, WHOLE_C_TILES: tl.constexpr,
    MASK_X_CHANNELS: tl.constexpr, STORE_AS_MATRIX: tl.constexpr, EPILOGUE: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b, oh, ow = offs_m // (OH * OW), (offs_m // OW) % OH, offs_m % OW
    m_ok, n_ok = offs_m < B * OH * OW, offs_n < O
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_end = C
    if WHOLE_C_TILES:  # mistake: the channels past the last full tile are dropped
        c_end = C // BLOCK_K * BLOCK_K
    for r in range(KH):
        for s in range(KW):
            ih = oh * SH - PH + r * DH
            iw = ow * SW - PW + s * DW
            pixel_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            if not MASK_PADDING:  # mistake: taps in the padding are read
                pixel_ok = m_ok
            wr, ws = r, s
            if FLIP:  # mistake: a textbook convolution's flipped filter
                wr, ws = KH - 1 - r, KW - 1 - s
            for c0 in range(0, c_end, BLOCK_K):
                c = c0 + offs_k
                x_ptrs = (x_ptr + b[:, None] * sxb + c[None, :] * sxc + ih[:, None] * sxh
                          + iw[:, None] * sxw)  # fmt: skip
                x_mask = pixel_ok[:, None] & (c[None, :] < C)
                if not MASK_X_CHANNELS:  # mistake: the padding masked, the channels not
                    x_mask = pixel_ok[:, None]
                x_tile = tl.load(x_ptrs, mask=x_mask, other=0.0)
                w_ptrs = w_ptr + offs_n[None, :] * swo + c[:, None] * swc + wr * swr + ws * sws
                w_tile = tl.load(w_ptrs, mask=(c[:, None] < C) & n_ok[None, :], other=0.0)
                acc = tl.dot(x_tile, w_tile, acc)
    out_ptrs = (out_ptr + b[:, None] * sob + offs_n[None, :] * soc + oh[:, None] * soh
                + ow[:, None] * sow)  # fmt: skip
    if STORE_AS_MATRIX:  # mistake: out stored as the [M, N] matrix of the product
        out_ptrs = out_ptr + offs_m[:, None] * O + offs_n[None, :]
    if EPILOGUE == "relu first":  # mistake: the ReLU before the bias
        acc = tl.maximum(acc, 0.0)
    if EPILOGUE == "bias per pixel":  # mistake: the bias along the tile's rows
        acc += tl.load(bias_ptr + offs_m, mask=offs_m < O, other=0.0)[:, None]
    elif EPILOGUE != "" and EPILOGUE != "no bias":
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if EPILOGUE == "bias relu" or EPILOGUE == "bias per pixel" or EPILOGUE == "no bias":
        acc = tl.maximum(acc, 0.0)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _conv2d(x, weight, stride=1, padding=0, dilation=1, *, mask_padding=True, flip=False,
            whole_c_tiles=False, size_without=None, window_without=None, x_strides="right",
            w_strides="right", out_hw_swapped=False, out_like_x=False, block_k=16,
            mask_x_channels=True, store_as_matrix=False, bias=None, epilogue=""):  # fmt: skip
    (B, C, H, W), (O, _, KH, KW) = x.shape, weight.shape
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    plain = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1)}
    in_size = {"stride": stride, "padding": padding, "dilation": dilation}
    if size_without:  # mistake: the output size leaves one parameter out
        in_size[size_without] = plain[size_without]
    (SH, SW), (PH, PW), (DH, DW) = in_size["stride"], in_size["padding"], in_size["dilation"]
    OH = (H + 2 * PH - DH * (KH - 1) - 1) // SH + 1
    OW = (W + 2 * PW - DW * (KW - 1) - 1) // SW + 1
    out = torch.empty((B, O, OW, OH) if out_hw_swapped else (B, O, OH, OW), dtype=x.dtype,
                      device=x.device)  # fmt: skip
    so = out.stride()
    if out_like_x:  # mistake: allocated in x's memory format, stored as if NCHW-contiguous
        out = out.contiguous(memory_format=torch.channels_last) if x.stride(1) == 1 else out
    in_window = {"stride": stride, "padding": padding, "dilation": dilation}
    if window_without:  # mistake: the window leaves one parameter out
        in_window[window_without] = plain[window_without]
    sx = {
        "right": x.stride(),
        "nchw": torch.empty(x.shape).stride(),  # mistake: x read as NCHW-contiguous
        "hw_swapped": (x.stride(0), x.stride(1), x.stride(3), x.stride(2)),
    }[x_strides]
    sw = {
        "right": weight.stride(),
        "oc_swapped": (weight.stride(1), weight.stride(0), *weight.stride()[2:]),
        "rs_swapped": (*weight.stride()[:2], weight.stride(3), weight.stride(2)),
    }[w_strides]
    grid = (triton.cdiv(B * OH * OW, 32), triton.cdiv(O, 32))
    conv2d_variant_kernel[grid](
        x, weight, out, out if bias is None else bias, B, C, H, W, O, OH, OW, *sx, *sw, *so,
        *in_window["stride"], *in_window["padding"], *in_window["dilation"], KH=KH, KW=KW,
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=block_k,
        MASK_PADDING=mask_padding, FLIP=flip, WHOLE_C_TILES=whole_c_tiles,
        MASK_X_CHANNELS=mask_x_channels, STORE_AS_MATRIX=store_as_matrix, EPILOGUE=epilogue,
    )  # fmt: skip
    return out


def conv2d(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation)


def conv2d_padding_not_masked(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, mask_padding=False)


def conv2d_flipped_filter(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, flip=True)


def conv2d_drops_last_channel_tile(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, whole_c_tiles=True)


def conv2d_size_without_stride(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, size_without="stride")


def conv2d_size_without_padding(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, size_without="padding")


def conv2d_size_without_dilation(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, size_without="dilation")


def conv2d_window_without_stride(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, window_without="stride")


def conv2d_window_without_dilation(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, window_without="dilation")


def conv2d_strides_ignored(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, x_strides="nchw")


def conv2d_x_hw_strides_swapped(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, x_strides="hw_swapped")


def conv2d_output_hw_swapped(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, out_hw_swapped=True)


def conv2d_output_stored_as_nchw(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, out_like_x=True)


def conv2d_weight_oc_swapped(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, w_strides="oc_swapped")


def conv2d_weight_rs_swapped(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, w_strides="rs_swapped")


def conv2d_x_channels_not_masked(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, mask_x_channels=False)


def conv2d_output_stored_as_matrix(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, store_as_matrix=True)


def conv2d_bias_relu(x, weight, bias, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, bias=bias, epilogue="bias relu")


def conv2d_bias_relu_relu_first(x, weight, bias, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, bias=bias, epilogue="relu first")


def conv2d_bias_relu_bias_per_pixel(x, weight, bias, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, bias=bias, epilogue="bias per pixel")


def conv2d_bias_relu_no_relu(x, weight, bias, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, bias=bias, epilogue="bias")


def conv2d_bias_relu_no_bias(x, weight, bias, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, bias=bias, epilogue="no bias")


def conv2d_dot_tile_of_8(x, weight, stride=1, padding=0, dilation=1):
    return _conv2d(x, weight, stride, padding, dilation, block_k=8)  # mistake: K side of 8


@triton.jit
def conv2d_direct_variant_kernel(
    x_ptr, w_ptr, out_ptr, C, H, W, O, OH, OW,
    sxb, sxc, sxh, sxw, swo, swc, swr, sws, sob, soc, soh, sow,
    SH, SW, PH, PW, KH: tl.constexpr, KW: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    COLUMNS_PADDED_AS_ROWS: tl.constexpr, ACC_FP16: tl.constexpr,
):  # fmt: skip
    pid_bo = tl.program_id(0)
    b, o = pid_bo // O, pid_bo % O
    offsets = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    oh, ow = offsets // OW, offsets % OW
    in_image = offsets < OH * OW
    if ACC_FP16:  # mistake: the inputs' dtype for the accumulator, float16 for float16
        acc = tl.zeros((BLOCK_SIZE,), dtype=x_ptr.dtype.element_ty)
    else:
        acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    pw = PW
    if COLUMNS_PADDED_AS_ROWS:  # mistake: padding[0] for the columns too
        pw = PH
    for c in range(C):
        for r in range(KH):
            for s in range(KW):
                ih = oh * SH - PH + r
                iw = ow * SW - pw + s
                mask = in_image & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                x = tl.load(x_ptr + b * sxb + c * sxc + ih * sxh + iw * sxw, mask=mask, other=0.0)
                w = tl.load(w_ptr + o * swo + c * swc + r * swr + s * sws)
                if ACC_FP16:
                    acc += x * w
                else:
                    acc += x.to(tl.float32) * w.to(tl.float32)
    out_ptrs = out_ptr + b * sob + o * soc + oh * soh + ow * sow
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_image)


def _conv2d_direct(x, weight, stride=1, padding=0, *, columns_padded_as_rows=False,
                   acc_fp16=False):  # fmt: skip
    (B, C, H, W), (O, _, KH, KW) = x.shape, weight.shape
    (SH, SW), (PH, PW) = _pair(stride), _pair(padding)
    OH, OW = (H + 2 * PH - KH) // SH + 1, (W + 2 * PW - KW) // SW + 1
    out = torch.empty((B, O, OH, OW), dtype=x.dtype, device=x.device)
    conv2d_direct_variant_kernel[(B * O, triton.cdiv(OH * OW, 128))](
        x, weight, out, C, H, W, O, OH, OW, *x.stride(), *weight.stride(), *out.stride(),
        SH, SW, PH, PW, KH=KH, KW=KW, BLOCK_SIZE=128,  # the notebook's BLOCK_SIZE
        COLUMNS_PADDED_AS_ROWS=columns_padded_as_rows, ACC_FP16=acc_fp16,
    )  # fmt: skip
    return out


def conv2d_direct(x, weight, stride=1, padding=0):
    return _conv2d_direct(x, weight, stride, padding)


def conv2d_direct_columns_padded_as_rows(x, weight, stride=1, padding=0):
    return _conv2d_direct(x, weight, stride, padding, columns_padded_as_rows=True)


def conv2d_direct_fp16_accumulator(x, weight, stride=1, padding=0):
    return _conv2d_direct(x, weight, stride, padding, acc_fp16=True)


@triton.jit
def conv2d_one_output_kernel(
    x_ptr, w_ptr, out_ptr, C, H, W, O, KH, KW, SH, SW, PH, PW, OH, OW,
):  # fmt: skip
    # the source guide's structure: one program per output element, flat NCHW addresses
    # (the tensors' strides never asked), the padding tested with a Python if
    pid = tl.program_id(0)
    b = pid // (O * OH * OW)
    o = (pid // (OH * OW)) % O
    oh = (pid // OW) % OH
    ow = pid % OW
    acc = 0.0
    for c in range(C):
        for r in range(KH):
            for s in range(KW):
                ih = oh * SH - PH + r
                iw = ow * SW - PW + s
                if ih >= 0 and ih < H and iw >= 0 and iw < W:
                    x = tl.load(x_ptr + ((b * C + c) * H + ih) * W + iw)
                    w = tl.load(w_ptr + ((o * C + c) * KH + r) * KW + s)
                    acc += x.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + ((b * O + o) * OH + oh) * OW + ow, acc)


def conv2d_one_program_per_output(x, weight, stride=1, padding=0):
    (B, C, H, W), (O, _, KH, KW) = x.shape, weight.shape
    (SH, SW), (PH, PW) = _pair(stride), _pair(padding)
    OH, OW = (H + 2 * PH - KH) // SH + 1, (W + 2 * PW - KW) // SW + 1
    out = torch.empty((B, O, OH, OW), dtype=x.dtype, device=x.device)
    conv2d_one_output_kernel[(B * O * OH * OW,)](
        x, weight, out, C, H, W, O, KH, KW, SH, SW, PH, PW, OH, OW
    )
    return out


# --- lesson 07: Linear --------------------------------------------------------------------


@triton.jit
def linear_variant_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, z_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr,
    ACC_DTYPE: tl.constexpr, ACT_FIRST: tl.constexpr, BIAS_PER_ROW: tl.constexpr,
    Z_AFTER_ACT: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)  # fmt: skip
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)  # fmt: skip
        acc = tl.dot(a, b, acc, out_dtype=ACC_DTYPE)
    if HAS_BIAS and not ACT_FIRST:
        if BIAS_PER_ROW:  # mistake: bias[m] on row m
            acc += tl.load(bias_ptr + offs_m, mask=offs_m < N, other=0.0)[:, None]
        else:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    offs_c = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SAVE_Z and not Z_AFTER_ACT:
        tl.store(z_ptr + offs_c, acc.to(z_ptr.dtype.element_ty), mask=mask)
    if ACTIVATION == "relu":
        acc = tl.maximum(acc, 0.0)
    elif ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    if SAVE_Z and Z_AFTER_ACT:  # mistake: z stored once the activation has overwritten acc
        tl.store(z_ptr + offs_c, acc.to(z_ptr.dtype.element_ty), mask=mask)
    if HAS_BIAS and ACT_FIRST:  # mistake: the bias after the activation
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    tl.store(c_ptr + offs_c, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _linear_launch(a, b, bias=None, activation=None, save_z=False, *, rows=None,
                   b_strides=None, act_first=False, bias_per_row=False, acc=None,
                   z_after_act=False, block_k=32):  # fmt: skip
    """activation(a @ b + bias) (and z) by linear_variant_kernel, each mistake a keyword."""
    M, K = a.shape
    N = b.shape[1] if b_strides is None else b.shape[0]
    M = M if rows is None else rows
    c = torch.empty((a.shape[0], N), dtype=a.dtype, device=a.device)
    z = torch.empty_like(c) if save_z else c
    acc = acc or (tl.float64 if a.dtype == torch.float64 else tl.float32)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))  # the notebook's interpreter tiles
    linear_variant_kernel[grid](
        a, b, c if bias is None else bias, c, z, M, N, K, *a.stride(),
        *(b.stride() if b_strides is None else b_strides), *c.stride(),
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=block_k, HAS_BIAS=bias is not None,
        ACTIVATION=activation or "", SAVE_Z=save_z, ACC_DTYPE=acc, ACT_FIRST=act_first,
        BIAS_PER_ROW=bias_per_row, Z_AFTER_ACT=z_after_act,
    )  # fmt: skip
    return (c, z) if save_z else c


def _linear_forward(x, weight, bias=None, activation=None, save_z=False, *, swapped_strides=False,
                    first_rows=False, keep_2d=False, act=..., view=False, z_flat=False,
                    **mistake):  # fmt: skip
    x2d = x.view(-1, x.shape[-1]) if view else x.reshape(-1, x.shape[-1])
    w_t = weight.t()
    strides = (weight.stride(0), weight.stride(1)) if swapped_strides else None
    rows = x.shape[0] if first_rows else None  # mistake: M = x.shape[0]
    activation = activation if act is ... else act
    out = _linear_launch(x2d, weight if swapped_strides else w_t, bias, activation, save_z,
                         rows=rows, b_strides=strides, **mistake)  # fmt: skip
    y = out[0] if save_z else out
    if not keep_2d:
        y = y.reshape(*x.shape[:-1], weight.shape[0])
    if not save_z:
        return y
    return y, out[1] if keep_2d or z_flat else out[1].reshape(y.shape)


def linear_forward(x, weight, bias=None, activation=None, save_z=False):
    return _linear_forward(x, weight, bias, activation, save_z)


def linear_forward_weight_not_transposed(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, swapped_strides=True)


def linear_forward_bias_per_row(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, bias_per_row=True)


def linear_forward_without_bias(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, None, activation)


def linear_forward_activation_first(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, act_first=True)


def linear_forward_relu_for_gelu(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, act="relu" if activation else None)


def linear_forward_rows_of_first_dim(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, first_rows=True)


def linear_forward_not_reshaped(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, keep_2d=True)


def linear_forward_views_x(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, view=True)


def linear_forward_fp32_accumulator(x, weight, bias=None, activation=None):
    return _linear_forward(x, weight, bias, activation, acc=tl.float32)


def linear_forward_z_after_activation(x, weight, bias=None, activation=None, save_z=False):
    return _linear_forward(x, weight, bias, activation, save_z, z_after_act=True)


def linear_forward_ignores_save_z(x, weight, bias=None, activation=None, save_z=False):
    return _linear_forward(x, weight, bias, activation)  # mistake: y alone, whatever save_z


def linear_forward_z_flat(x, weight, bias=None, activation=None, save_z=False):
    # mistake: z left [M, out] where y gets x's leading dimensions
    return _linear_forward(x, weight, bias, activation, save_z, z_flat=True)


def linear_forward_dot_tile_of_8(x, weight, bias=None, activation=None, save_z=False):
    return _linear_forward(x, weight, bias, activation, save_z, block_k=8)


def _product(a, b):
    return _linear_launch(a, b)


def _product_variant(a, b, *, a_strides=None, b_strides=None, grid_floor=False):
    """Lesson 07's product(a, b) by linear_variant_kernel at the notebook's interpreter
    tiles, 32 x 32 x 32, each mistake a keyword."""
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    if grid_floor:  # mistake: whole tiles only
        grid = (max(M // 32, 1), max(N // 32, 1))
    linear_variant_kernel[grid](
        a, b, c, c, c, M, N, K, *(a_strides or a.stride()), *(b_strides or b.stride()),
        *c.stride(), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, HAS_BIAS=False, ACTIVATION="",
        SAVE_Z=False, ACC_DTYPE=tl.float64 if a.dtype == torch.float64 else tl.float32,
        ACT_FIRST=False, BIAS_PER_ROW=False, Z_AFTER_ACT=False,
    )  # fmt: skip
    return c


def product(a, b):
    return _product_variant(a, b)


def product_b_strides_swapped(a, b):
    return _product_variant(a, b, b_strides=b.stride()[::-1])


def product_a_strides_swapped(a, b):
    return _product_variant(a, b, a_strides=a.stride()[::-1])


def product_grid_floor(a, b):
    return _product_variant(a, b, grid_floor=True)


def _slope(saved, activation):
    return references.linear_activation_slope(saved.double(), activation)


def _linear_function(name, *, slope="z", grad_x="right", grad_weight="right", grad_bias="right",
                     count=4, view=False, needs="followed", order="right"):  # fmt: skip
    """A LinearFunction with one mistake in its backward, chosen by keyword."""

    class LinearFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, activation):
            needs_x, needs_weight = ctx.needs_input_grad[:2]
            if needs == "ignored":  # mistake: everything saved and computed, whatever is wanted
                needs_x = needs_weight = True
            x2d = x.reshape(-1, x.shape[-1]) if needs_weight else None
            y, z = linear_forward(x, weight, bias, activation, save_z=True)
            kept = weight if needs_x else None
            if order == "swapped":  # mistake: saved in another order than unpacked
                ctx.save_for_backward(kept, x2d, z, y)
            else:
                ctx.save_for_backward(x2d, kept, z, y)
            ctx.activation, ctx.x_shape, ctx.has_bias = activation, x.shape, bias is not None
            ctx.needs = (needs_x, needs_weight, ctx.needs_input_grad[2] or needs == "ignored")
            if needs == "saved only":  # mistake: saved as asked, every gradient computed
                ctx.needs = (True, True, True)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x2d, weight, z, y = ctx.saved_tensors
            needs_x, needs_weight, needs_bias = ctx.needs
            g = (grad_y.view if view else grad_y.reshape)(-1, grad_y.shape[-1])
            y, z = y.reshape(len(g), -1), z.reshape(len(g), -1)
            if slope != "none" and ctx.activation is not None:  # mistake "none": no slope
                g = (g.double() * _slope(y if slope == "y" else z, ctx.activation)).to(g.dtype)
            rows = ctx.x_shape[0] if "first rows" in (grad_weight, grad_bias) else len(g)
            gx = gw = gb = None
            if needs_x:
                gx = _product(g, weight.t() if grad_x == "transposed" else weight)
                gx = gx.reshape(ctx.x_shape)
            if needs_weight:
                gw = {
                    "right": lambda: _product(g.t(), x2d),
                    "transposed": lambda: _product(x2d.t(), g),
                    "from y": lambda: _product(g.t(), y),
                    "first rows": lambda: _product(g[:rows].t(), x2d[:rows]),
                    "torch": lambda: g.t() @ x2d,  # mistake: PyTorch's product
                }[grad_weight]()
            if ctx.has_bias and needs_bias and grad_bias != "none":
                gb = g.sum(1) if grad_bias == "wrong axis" else g[:rows].sum(0)
            grads = (gx, gw, gb, None)
            return grads[:count]

    def apply(x, weight, bias=None, activation=None):
        return LinearFunction.apply(x, weight, bias, activation)

    apply.__name__ = apply.__qualname__ = name
    return apply


linear_autograd = _linear_function("linear_autograd")


linear_autograd_without_slope = _linear_function("linear_autograd_without_slope", slope="none")


linear_autograd_slope_at_output = _linear_function("linear_autograd_slope_at_output", slope="y")


linear_autograd_grad_x_transposed = _linear_function(
    "linear_autograd_grad_x_transposed", grad_x="transposed"
)


linear_autograd_grad_weight_transposed = _linear_function(
    "linear_autograd_grad_weight_transposed", grad_weight="transposed"
)


linear_autograd_grad_weight_from_y = _linear_function(
    "linear_autograd_grad_weight_from_y", grad_weight="from y"
)


linear_autograd_rows_of_first_dim = _linear_function(
    "linear_autograd_rows_of_first_dim", grad_weight="first rows", grad_bias="first rows"
)


linear_autograd_bias_wrong_axis = _linear_function(
    "linear_autograd_bias_wrong_axis", grad_bias="wrong axis"
)


linear_autograd_no_bias_gradient = _linear_function(
    "linear_autograd_no_bias_gradient", grad_bias="none"
)


linear_autograd_views_grad = _linear_function("linear_autograd_views_grad", view=True)


linear_autograd_three_gradients = _linear_function("linear_autograd_three_gradients", count=3)


linear_autograd_ignores_needs_input_grad = _linear_function(
    "linear_autograd_ignores_needs_input_grad", needs="ignored"
)


linear_autograd_computes_every_gradient = _linear_function(
    "linear_autograd_computes_every_gradient", needs="saved only"
)


linear_autograd_saved_out_of_order = _linear_function(
    "linear_autograd_saved_out_of_order", order="swapped"
)


linear_autograd_torch_grad_weight = _linear_function(
    "linear_autograd_torch_grad_weight", grad_weight="torch"
)


def linear_autograd_without_function(x, weight, bias=None, activation=None):
    """The belief that a Triton kernel differentiates itself: it does not."""
    return linear_forward(x, weight, bias, activation)


# --- lesson 08: torch.compile --------------------------------------------------------------


@triton.jit
def softmax_backward_variant_kernel(
    y_ptr, g_ptr, out_ptr, n_cols, stride_ym, stride_yn, stride_gm, stride_gn, stride_out,
    BLOCK_SIZE: tl.constexpr, MISTAKE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    y = tl.load(y_ptr + row * stride_ym + cols * stride_yn, mask=mask, other=0.0).to(tl.float32)
    if MISTAKE == "g read with y's strides":
        g_ptrs = g_ptr + row * stride_ym + cols * stride_yn
    else:
        g_ptrs = g_ptr + row * stride_gm + cols * stride_gn
    g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
    if MISTAKE == "diagonal":  # mistake: the Jacobian's diagonal alone
        grad = y * (1.0 - y) * g
    elif MISTAKE == "no factor y":
        grad = g - tl.sum(g * y, axis=0)
    else:
        grad = y * (g - tl.sum(g * y, axis=0))
    tl.store(out_ptr + row * stride_out + cols, grad.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_backward_launch(y, grad_y, mistake=""):
    n_rows, n_cols = y.shape
    out = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device)
    softmax_backward_variant_kernel[(n_rows,)](
        y, grad_y, out, n_cols, *y.stride(), *grad_y.stride(), out.stride(0),
        BLOCK_SIZE=triton.next_power_of_2(n_cols), MISTAKE=mistake,
    )  # fmt: skip
    return out


@triton.jit
def add_into_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add_into_launch(x, y, out):
    n_elements = out.numel()
    add_into_kernel[(triton.cdiv(n_elements, 1024),)](x, y, out, n_elements, BLOCK_SIZE=1024)


# --- lesson 09: layer norm and RMSNorm, at the lesson's block sizes -----------------------

NORM_PROGRAMS = 4  # the backward's programs, as the lesson's launcher has in the interpreter


@triton.jit
def norm_fwd_variant_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, n_cols, stride_x, stride_y, eps,
    BLOCK_SIZE: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr, LOOP: tl.constexpr,
    UNBIASED: tl.constexpr, EPS_OUTSIDE: tl.constexpr, STATS_DTYPE: tl.constexpr,
    ONE_PASS: tl.constexpr, SAVE_STD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_x, y_ptr + row * stride_y
    end = n_cols
    if not LOOP:  # mistake: one block per row, whatever the row's width
        end = tl.minimum(n_cols, BLOCK_SIZE)
    acc = tl.zeros([BLOCK_SIZE], STATS_DTYPE)  # mistake when float16: statistics in 16 bits
    squares = tl.zeros([BLOCK_SIZE], STATS_DTYPE)
    for start in range(0, end, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(STATS_DTYPE)
        acc += x
        squares += x * x  # used by the one-pass mistake only
    mean = (tl.sum(acc, axis=0) / n_cols).to(STATS_DTYPE)
    if RMS:
        mean = mean * 0
    if ONE_PASS:  # mistake: E[x²] - mean², two large numbers nearly equal
        var = tl.sum(squares, axis=0) / n_cols - mean * mean
    else:
        acc = tl.zeros([BLOCK_SIZE], STATS_DTYPE)
        for start in range(0, end, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(STATS_DTYPE)
            centred = tl.where(cols < n_cols, x - mean, 0.0).to(STATS_DTYPE)
            acc += centred * centred
        var = tl.sum(acc, axis=0) / (n_cols - 1 if UNBIASED else n_cols)  # mistake: n - 1
    if EPS_OUTSIDE:  # mistake: eps outside the square root
        rstd = 1.0 / (tl.sqrt(var.to(tl.float32)) + eps)
    else:
        rstd = 1.0 / tl.sqrt(var.to(tl.float32) + eps)
    tl.store(mean_ptr + row, mean.to(tl.float32))
    # mistake when SAVE_STD: the standard deviation saved where the backward expects rstd
    tl.store(rstd_ptr + row, 1.0 / rstd if SAVE_STD else rstd)
    for start in range(0, end, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean.to(tl.float32)) * rstd * tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def norm_by_column_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, n_rows, n_cols, stride_x, stride_y, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The mistake of the wrong axis: a [BLOCK_M, BLOCK_N] tile of whole columns, reduced
    along axis 0, over the rows."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=0) / n_rows  # mistake: axis=0
    centred = tl.where(mask, x - mean[None, :], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_rows + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n_cols).to(tl.float32)
    y = centred * (rstd * w)[None, :] + b[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def _norm_forward(x, weight, bias=None, eps=1e-5, BLOCK_SIZE=None, *, rms=False,  # noqa: N803
                  loop=True, unbiased=False, eps_outside=False, stats16=False, one_pass=False,
                  save_std=False, by_column=False):  # fmt: skip
    x = x if x.stride(1) == 1 else x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if by_column:
        norm_by_column_kernel[(triton.cdiv(n_cols, 64),)](
            x, y, weight, bias, n_rows, n_cols, x.stride(0), y.stride(0), eps,
            BLOCK_M=triton.next_power_of_2(n_rows), BLOCK_N=64,
        )  # fmt: skip
        return y, mean.fill_(0.0), rstd.fill_(1.0)
    block = BLOCK_SIZE or min(1024, triton.next_power_of_2(n_cols))
    norm_fwd_variant_kernel[(n_rows,)](
        x, y, weight, bias if bias is not None else weight, mean, rstd, n_cols, x.stride(0),
        y.stride(0), eps, BLOCK_SIZE=block, RMS=rms, HAS_BIAS=bias is not None, LOOP=loop,
        UNBIASED=unbiased, EPS_OUTSIDE=eps_outside,
        STATS_DTYPE=tl.float16 if stats16 and x.dtype == torch.float16 else tl.float32,
        ONE_PASS=one_pass, SAVE_STD=save_std,
    )  # fmt: skip
    return y, mean, rstd


def layer_norm_forward(x, weight, bias, eps=1e-5, BLOCK_SIZE=None):  # noqa: N803
    return _norm_forward(x, weight, bias, eps, BLOCK_SIZE)


def _forward_variant(name, **mistake):
    def forward(x, weight, bias, eps=1e-5, BLOCK_SIZE=None):  # noqa: N803
        return _norm_forward(x, weight, bias, eps, BLOCK_SIZE, **mistake)

    forward.__name__ = forward.__qualname__ = name
    return forward


layer_norm_forward_one_block = _forward_variant("layer_norm_forward_one_block", loop=False)
layer_norm_forward_unbiased = _forward_variant("layer_norm_forward_unbiased", unbiased=True)
layer_norm_forward_eps_outside = _forward_variant(
    "layer_norm_forward_eps_outside", eps_outside=True
)
layer_norm_forward_stats_in_half = _forward_variant(
    "layer_norm_forward_stats_in_half", stats16=True
)
layer_norm_forward_one_pass = _forward_variant("layer_norm_forward_one_pass", one_pass=True)
layer_norm_forward_saves_std = _forward_variant("layer_norm_forward_saves_std", save_std=True)
layer_norm_forward_by_column = _forward_variant("layer_norm_forward_by_column", by_column=True)


@triton.jit
def norm_bwd_variant_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    n_rows, n_cols, stride_dy, stride_x, stride_dx, BLOCK_SIZE: tl.constexpr,
    RMS: tl.constexpr, MEAN_TERM: tl.constexpr, XHAT_TERM: tl.constexpr,
    ACCUMULATE: tl.constexpr, DW_XHAT: tl.constexpr, RSTD_NO_EPS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_SIZE], tl.float32)
    db_acc = tl.zeros([BLOCK_SIZE], tl.float32)
    for row in tl.range(pid, n_rows, tl.num_programs(0)):
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = 0.0
        if not RMS:
            mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        if RSTD_NO_EPS:  # mistake: rstd recomputed from the row, without eps
            centred = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols)
        x_hat = (x - mean) * rstd
        wdy = w * dy
        dx = wdy
        if XHAT_TERM:  # mistake when False: the variance's term left out
            dx -= x_hat * (tl.sum(x_hat * wdy, axis=0) / n_cols)
        if MEAN_TERM:  # mistake when False for layer norm, when True for RMSNorm
            dx -= tl.sum(wdy, axis=0) / n_cols
        tl.store(dx_ptr + row * stride_dx + cols, (dx * rstd).to(dx_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip
        product = dy * x_hat if DW_XHAT else dy  # mistake when False: no x_hat
        if ACCUMULATE:
            dw_acc += product
            db_acc += dy
        else:  # mistake: each row replaces the one before
            dw_acc = product
            db_acc = dy
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw_acc, mask=mask)
    tl.store(db_partial_ptr + pid * n_cols + cols, db_acc, mask=mask)


@triton.jit
def norm_sum_rows_kernel(partial_ptr, out_ptr, n_partials, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for p in range(0, n_partials):
        acc += tl.load(partial_ptr + p * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def _norm_backward(dy, x2d, weight, mean, rstd, *, rms=False, mean_term=None, xhat_term=True,
                   accumulate=True, dw_xhat=True, rstd_no_eps=False, reduce=True):  # fmt: skip
    dy = dy.contiguous()
    n_rows, n_cols = x2d.shape
    dx = torch.empty((n_rows, n_cols), dtype=x2d.dtype, device=x2d.device)
    programs = min(n_rows, NORM_PROGRAMS)
    partials = torch.empty((2, programs, n_cols), dtype=torch.float32, device=x2d.device)
    norm_bwd_variant_kernel[(programs,)](
        dy, x2d, weight, mean, rstd, dx, partials[0], partials[1], n_rows, n_cols,
        dy.stride(0), x2d.stride(0), dx.stride(0), BLOCK_SIZE=triton.next_power_of_2(n_cols),
        RMS=rms, MEAN_TERM=(not rms) if mean_term is None else mean_term, XHAT_TERM=xhat_term,
        ACCUMULATE=accumulate, DW_XHAT=dw_xhat, RSTD_NO_EPS=rstd_no_eps,
    )  # fmt: skip
    sums = []
    for partial in partials:
        if not reduce:  # mistake: the first program's partial row taken for the sum
            sums.append(partial[0].to(weight.dtype))
            continue
        out = torch.empty(n_cols, dtype=weight.dtype, device=x2d.device)
        # wide column blocks: few programs, which is what costs in the interpreter
        norm_sum_rows_kernel[(triton.cdiv(n_cols, 1024),)](
            partial, out, programs, n_cols, BLOCK_N=1024
        )  # fmt: skip
        sums.append(out)
    return dx, sums[0], sums[1]


def _norm_function(name, *, rms=False, forward=None, backward=None, default_eps=None):
    """A layer norm (or RMSNorm) through autograd with the lesson's kernels, with the
    mistakes `forward` and `backward` (keyword arguments of _norm_forward, _norm_backward)."""

    class NormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            x2d = x.reshape(-1, x.shape[-1])
            y, mean, rstd = _norm_forward(
                x2d, weight, bias, eps, **({"rms": rms} | (forward or {}))
            )
            ctx.save_for_backward(x2d, weight, mean, rstd)
            ctx.x_shape = x.shape
            return y.view(x.shape)

        @staticmethod
        def backward(ctx, dy):
            x2d, weight, mean, rstd = ctx.saved_tensors
            dx, dw, db = _norm_backward(dy.reshape(x2d.shape), x2d, weight, mean, rstd,
                                        **({"rms": rms} | (backward or {})))  # fmt: skip
            return dx.view(ctx.x_shape), dw, None if rms else db, None

    if rms:

        def apply(x, weight, eps=None):
            if eps is None:  # torch's default: the epsilon of the statistics' dtype
                wide = torch.float64 if x.dtype == torch.float64 else torch.float32
                eps = default_eps if default_eps is not None else torch.finfo(wide).eps
            return NormFunction.apply(x, weight, None, eps)

    else:

        def apply(x, weight, bias, eps=1e-5):
            return NormFunction.apply(x, weight, bias, eps)

    apply.__name__ = apply.__qualname__ = name
    return apply


layer_norm = _norm_function("layer_norm")
layer_norm_dx_without_mean_term = _norm_function(
    "layer_norm_dx_without_mean_term", backward={"mean_term": False}
)
layer_norm_dx_without_xhat_term = _norm_function(
    "layer_norm_dx_without_xhat_term", backward={"xhat_term": False}
)
layer_norm_dw_not_accumulated = _norm_function(
    "layer_norm_dw_not_accumulated", backward={"accumulate": False}
)
layer_norm_dw_partials_not_summed = _norm_function(
    "layer_norm_dw_partials_not_summed", backward={"reduce": False}
)
layer_norm_dw_without_xhat = _norm_function(
    "layer_norm_dw_without_xhat", backward={"dw_xhat": False}
)
layer_norm_saved_std = _norm_function("layer_norm_saved_std", forward={"save_std": True})
layer_norm_rstd_recomputed_without_eps = _norm_function(
    "layer_norm_rstd_recomputed_without_eps", backward={"rstd_no_eps": True}
)
rms_norm = _norm_function("rms_norm", rms=True)
rms_norm_subtracts_mean = _norm_function(
    "rms_norm_subtracts_mean", rms=True, forward={"rms": False}, backward={"rms": False}
)
rms_norm_eps_outside = _norm_function("rms_norm_eps_outside", rms=True,
                                      forward={"eps_outside": True})  # fmt: skip
rms_norm_default_eps_1e6 = _norm_function("rms_norm_default_eps_1e6", rms=True, default_eps=1e-6)
# float32's epsilon whatever x's dtype: wrong for float64 alone
rms_norm_float32_eps_always = _norm_function(
    "rms_norm_float32_eps_always", rms=True, default_eps=torch.finfo(torch.float32).eps
)
rms_norm_dx_with_mean_term = _norm_function(
    "rms_norm_dx_with_mean_term", rms=True, backward={"mean_term": True}
)
rms_norm_dx_without_xhat_term = _norm_function(
    "rms_norm_dx_without_xhat_term", rms=True, backward={"xhat_term": False}
)
rms_norm_dw_without_xhat = _norm_function(
    "rms_norm_dw_without_xhat", rms=True, backward={"dw_xhat": False}
)


# --- lesson 10: flash attention, at the lesson's block sizes --------------------------------
# Every tl.dot asks for input_precision="ieee": on a GPU, Triton multiplies float32 in TF32
# by default, which the checks' float32 tolerances (and torch's own default) do not allow.

ATTN_BLOCK = 16  # BLOCK_M = BLOCK_N, as the lesson's exercises use in the interpreter


@triton.jit
def attn_fwd_variant_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    RESCALE: tl.constexpr, SCALES: tl.constexpr, MASK_VALUE: tl.constexpr,
    DIAGONAL: tl.constexpr, NORMALISE_EACH_STEP: tl.constexpr, LSE: tl.constexpr,
    MASK_KEYS: tl.constexpr, LOAD_MASK: tl.constexpr, ACC_DTYPE: tl.constexpr,
    TF32_LIKE: tl.constexpr, END_AT_N_K: tl.constexpr, Q_MOVED: tl.constexpr,
    KV_MOVED: tl.constexpr, O_MOVED: tl.constexpr, EXP: tl.constexpr,
    KEY_END_INCLUSIVE: tl.constexpr,
):  # fmt: skip
    """One program per block of queries of one (batch, head), over q, k, v, o as contiguous
    [B*H, N, d] and lse [B*H, n_q]; each switch but the right value makes one mistake."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_head = bh * n_q * HEAD_DIM  # where this program's head starts in q (and o)
    kv_head = bh * n_k * HEAD_DIM
    if not Q_MOVED:  # mistake: every program reads the first head's queries
        q_head = 0 * q_head
    if not KV_MOVED:  # mistake: every program reads the first head's keys and values
        kv_head = 0 * kv_head
    q = tl.load(q_ptr + q_head + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < n_q, other=0.0)  # fmt: skip
    if TF32_LIKE:  # mistake: float32 multiplied with 10 bits of mantissa, as TF32 does
        q = q.to(tl.float16).to(q.dtype)
    qk_scale = 1.0 if EXP == "exp2 without LOG2E" else 1.44269504
    for _ in tl.static_range(SCALES):  # right: once; mistakes: never, or twice
        qk_scale = qk_scale * scale
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], ACC_DTYPE)  # mistake when float16: the sums in 16 bits
    acc = tl.zeros([BLOCK_M, HEAD_DIM], ACC_DTYPE)
    end = n_k
    if CAUSAL:
        end = start_m + BLOCK_M + (BLOCK_N if DIAGONAL == 1 else 0)
        if END_AT_N_K:  # right; the mistake: the diagonal's end alone, past n_k
            end = tl.minimum(n_k, end)
        if DIAGONAL == 2:  # mistake: the diagonal aligned bottom right
            end = n_k
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_offs = kv_head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        if LOAD_MASK:  # masked by the loop's end, as the lesson's attend_keys masks by hi
            k = tl.load(k_ptr + kv_offs, mask=offs_n[:, None] < end, other=0.0)
            v = tl.load(v_ptr + kv_offs, mask=offs_n[:, None] < end, other=0.0)
        else:  # mistake: reads past the end of k and v
            k = tl.load(k_ptr + kv_offs)
            v = tl.load(v_ptr + kv_offs)
        if TF32_LIKE:
            k = k.to(tl.float16).to(k.dtype)
            v = v.to(tl.float16).to(v.dtype)
        s = (
            tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        )  # [BLOCK_M, BLOCK_N], in log2 units
        visible = offs_n[None, :] < n_k
        if not MASK_KEYS:  # mistake: keys past n_k keep their score
            visible = offs_n[None, :] < n_k + BLOCK_N
        if CAUSAL:
            if DIAGONAL == 0:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            elif DIAGONAL == -1:  # mistake: j < i
                visible = visible & (offs_n[None, :] < offs_m[:, None])
            elif DIAGONAL == 1:  # mistake: j <= i + 1
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + 1)
            else:  # mistake: bottom right, j <= i + n_k - n_q
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + n_k - n_q)
        if KEY_END_INCLUSIVE:  # mistake: the lesson's mask written offs_n <= key_end
            if CAUSAL:
                key_end = tl.minimum(offs_m + 1, n_k)
            else:
                key_end = tl.full([BLOCK_M], n_k, tl.int32)
            visible = offs_n[None, :] <= key_end[:, None]
        s = tl.where(visible, s, MASK_VALUE)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if EXP == "exp":  # mistake: scores in log2 units taken to the base e
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
        else:
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
        if RESCALE:
            l_i = (l_i * alpha + tl.sum(p, axis=1)).to(ACC_DTYPE)
            acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")).to(
                ACC_DTYPE
            )
        else:  # mistake: the running sums kept on the old max's scale
            l_i = (l_i * alpha + tl.sum(p, axis=1)).to(ACC_DTYPE)
            acc = (acc + tl.dot(p.to(v.dtype), v, input_precision="ieee")).to(ACC_DTYPE)
        if NORMALISE_EACH_STEP:  # mistake: divided by the running sum at every step
            acc = acc / l_i[:, None]
        m_i = m_new
    if not NORMALISE_EACH_STEP:
        acc = acc / l_i[:, None]
    o_head = bh * n_q * HEAD_DIM
    if not O_MOVED:  # mistake: every program stores into the first head's rows
        o_head = 0 * o_head
    o_offs = o_head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptr + o_offs, acc.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < n_q)
    l_i = l_i.to(tl.float32)
    if LSE == "natural":
        lse = (m_i + tl.log2(l_i)) * 0.69314718
    elif LSE == "log2":  # mistake: left in base 2
        lse = m_i + tl.log2(l_i)
    else:  # mistake: the max alone
        lse = m_i * 0.69314718
    tl.store(lse_ptr + bh * n_q + offs_m, lse, mask=offs_m < n_q)


ATTN_FORWARD_RIGHT = dict(
    RESCALE=True, SCALES=1, MASK_VALUE=float("-inf"), DIAGONAL=0, NORMALISE_EACH_STEP=False,
    LSE="natural", MASK_KEYS=True, LOAD_MASK=True, ACC_DTYPE=tl.float32, TF32_LIKE=False,
    END_AT_N_K=True, Q_MOVED=True, KV_MOVED=True, O_MOVED=True, EXP="exp2",
    KEY_END_INCLUSIVE=False,
)  # fmt: skip


def _attn_forward(q, k, v, causal, scale, *, grid_floor=False, **mistake):
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    q3, k3, v3 = (t.contiguous().view(B * H, -1, d) for t in (q, k, v))
    o = torch.empty((B, H, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    rows = n_q // ATTN_BLOCK if grid_floor else triton.cdiv(n_q, ATTN_BLOCK)
    attn_fwd_variant_kernel[(rows, B * H)](
        q3, k3, v3, o, lse, n_q, n_k, scale, HEAD_DIM=d, BLOCK_M=ATTN_BLOCK,
        BLOCK_N=ATTN_BLOCK, CAUSAL=causal, **(ATTN_FORWARD_RIGHT | mistake),
    )  # fmt: skip
    return o, lse


def attention_forward(q, k, v, causal, scale):  # right
    return _attn_forward(q, k, v, causal, scale)


def _attn_forward_variant(name, **mistake):
    def forward(q, k, v, causal, scale):
        return _attn_forward(q, k, v, causal, scale, **mistake)

    forward.__name__ = forward.__qualname__ = name
    return forward


attention_forward_no_rescale = _attn_forward_variant("attention_forward_no_rescale", RESCALE=False)
attention_forward_key_end_inclusive = _attn_forward_variant(
    "attention_forward_key_end_inclusive", KEY_END_INCLUSIVE=True
)
attention_forward_scale_never = _attn_forward_variant("attention_forward_scale_never", SCALES=0)
attention_forward_scale_twice = _attn_forward_variant("attention_forward_scale_twice", SCALES=2)
attention_forward_mask_zero = _attn_forward_variant("attention_forward_mask_zero", MASK_VALUE=0.0)
attention_forward_diagonal_hidden = _attn_forward_variant(
    "attention_forward_diagonal_hidden", DIAGONAL=-1
)
attention_forward_one_past_diagonal = _attn_forward_variant(
    "attention_forward_one_past_diagonal", DIAGONAL=1
)
attention_forward_bottom_right = _attn_forward_variant("attention_forward_bottom_right", DIAGONAL=2)
attention_forward_normalise_each_step = _attn_forward_variant(
    "attention_forward_normalise_each_step", NORMALISE_EACH_STEP=True
)
attention_forward_lse_log2 = _attn_forward_variant("attention_forward_lse_log2", LSE="log2")
attention_forward_lse_max = _attn_forward_variant("attention_forward_lse_max", LSE="max")
attention_forward_keys_not_masked = _attn_forward_variant(
    "attention_forward_keys_not_masked", MASK_KEYS=False
)
attention_forward_no_load_mask = _attn_forward_variant(
    "attention_forward_no_load_mask", LOAD_MASK=False
)
attention_forward_tf32_like = _attn_forward_variant("attention_forward_tf32_like", TF32_LIKE=True)
attention_forward_kv_of_head_0 = _attn_forward_variant(
    "attention_forward_kv_of_head_0", KV_MOVED=False
)
attention_forward_qkv_of_head_0 = _attn_forward_variant(
    "attention_forward_qkv_of_head_0", Q_MOVED=False, KV_MOVED=False
)
# q and o at the same offsets, neither moved: every program writes the first head's rows
attention_forward_q_and_o_of_head_0 = _attn_forward_variant(
    "attention_forward_q_and_o_of_head_0", Q_MOVED=False, O_MOVED=False
)
attention_forward_exp_of_log2 = _attn_forward_variant("attention_forward_exp_of_log2", EXP="exp")
attention_forward_exp2_without_log2e = _attn_forward_variant(
    "attention_forward_exp2_without_log2e", EXP="exp2 without LOG2E"
)
# a causal loop bound by the diagonal alone, hi = (pid_m + 1) * BLOCK_M: its loads, masked by
# that bound, read past the end of k and v where the block's diagonal passes n_k
attention_forward_end_past_keys = _attn_forward_variant(
    "attention_forward_end_past_keys", END_AT_N_K=False
)
attention_forward_grid_floor = _attn_forward_variant(
    "attention_forward_grid_floor", grid_floor=True
)


def attention_forward_sums_in_half(q, k, v, causal, scale):
    """The mistake of 16-bit running sums, where the inputs are 16-bit."""
    acc = tl.float16 if q.dtype == torch.float16 else tl.float32
    return _attn_forward(q, k, v, causal, scale, ACC_DTYPE=acc)


@triton.jit
def attn_bwd_preprocess_variant_kernel(o_ptr, do_ptr, delta_ptr, n_rows,
                                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """D = rowsum(dO * O) for the rows of o and do as contiguous [rows, d]."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    mask = offs_m[:, None] < n_rows
    o = tl.load(o_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + offs_m, tl.sum(o * do, axis=1), mask=offs_m < n_rows)


@triton.jit
def attn_bwd_dkdv_variant_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    D_TERM: tl.constexpr, P_FROM_LSE: tl.constexpr, DK_SCALED: tl.constexpr,
    LSE_UNITS: tl.constexpr, CAUSAL_MASK: tl.constexpr, DELTA_ROWS: tl.constexpr,
    LSE_ROWS: tl.constexpr, LSE_PAST: tl.constexpr,
):  # fmt: skip
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_offs = bh * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=offs_n[:, None] < n_k, other=0.0)
    v = tl.load(v_ptr + kv_offs, mask=offs_n[:, None] < n_k, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    qk_scale = scale * 1.44269504
    start = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(start, n_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_offs = bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=offs_m[:, None] < n_q, other=0.0)
        do = tl.load(do_ptr + q_offs, mask=offs_m[:, None] < n_q, other=0.0)
        # past n_q: inf, so P is 0 there; the lesson's kernel loads 0 and masks P instead
        lse = tl.load(lse_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=LSE_PAST)
        if LSE_UNITS == "natural":
            lse = lse * 1.44269504
        s_t = (
            tl.dot(k, tl.trans(q), input_precision="ieee") * qk_scale
        )  # [BLOCK_N, BLOCK_M]: the scores transposed
        if LSE_ROWS:  # mistake: the lse broadcast along the keys, as if not transposed
            p_t = tl.exp2(s_t - lse[:, None])
        elif P_FROM_LSE:
            p_t = tl.exp2(s_t - lse[None, :])
        else:  # mistake: P left unnormalised, exp(S) without the lse
            p_t = tl.exp2(s_t)
        if CAUSAL and CAUSAL_MASK:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        p_t = tl.where(offs_n[:, None] < n_k, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision="ieee")
        dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")
        delta = tl.load(delta_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=0.0)
        if DELTA_ROWS:  # mistake: D broadcast along the keys, as if the tile were not transposed
            ds_t = p_t * (dp_t - delta[:, None])
        elif D_TERM:
            ds_t = p_t * (dp_t - delta[None, :])
        else:  # mistake: D left out of dS
            ds_t = p_t * dp_t
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision="ieee")
    if DK_SCALED:
        dk *= scale
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=offs_n[:, None] < n_k)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=offs_n[:, None] < n_k)


@triton.jit
def attn_bwd_dq_variant_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    D_TERM: tl.constexpr, DQ_SCALED: tl.constexpr, LSE_UNITS: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_offs = bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=offs_m[:, None] < n_q, other=0.0)
    do = tl.load(do_ptr + q_offs, mask=offs_m[:, None] < n_q, other=0.0)
    lse = tl.load(lse_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=float("inf"))
    if LSE_UNITS == "natural":
        lse = lse * 1.44269504
    delta = tl.load(delta_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = scale * 1.44269504
    end = tl.minimum(n_k, start_m + BLOCK_M) if CAUSAL else n_k
    for start_n in range(0, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_offs = bh * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=offs_n[:, None] < n_k, other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=offs_n[:, None] < n_k, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale - lse[:, None])
        if CAUSAL and CAUSAL_MASK:
            p = tl.where(offs_n[None, :] <= offs_m[:, None], p, 0.0)
        p = tl.where(offs_n[None, :] < n_k, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None]) if D_TERM else p * dp
        dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
    if DQ_SCALED:
        dq *= scale
    tl.store(dq_ptr + q_offs, dq.to(dq_ptr.dtype.element_ty), mask=offs_m[:, None] < n_q)


ATTN_BACKWARD_RIGHT = dict(D_TERM=True, P_FROM_LSE=True, DK_SCALED=True, DQ_SCALED=True,
                           LSE_UNITS="natural", CAUSAL_MASK=True, DELTA_ROWS=False,
                           LSE_ROWS=False, LSE_PAST=float("inf"))  # fmt: skip


def _attn_backward(q, k, v, o, lse, do, causal, scale, *, key_grid_floor=False, **mistake):
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    flags = ATTN_BACKWARD_RIGHT | mistake
    q3, k3, v3, o3, do3 = (t.contiguous().view(B * H, -1, d) for t in (q, k, v, o, do))
    lse = lse.contiguous()
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    attn_bwd_preprocess_variant_kernel[(triton.cdiv(B * H * n_q, ATTN_BLOCK),)](
        o3, do3, delta, B * H * n_q, HEAD_DIM=d, BLOCK_M=ATTN_BLOCK
    )  # fmt: skip
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = dict(HEAD_DIM=d, BLOCK_M=ATTN_BLOCK, BLOCK_N=ATTN_BLOCK, CAUSAL=causal,
                  D_TERM=flags["D_TERM"], LSE_UNITS=flags["LSE_UNITS"],
                  CAUSAL_MASK=flags["CAUSAL_MASK"])  # fmt: skip
    key_blocks = n_k // ATTN_BLOCK if key_grid_floor else triton.cdiv(n_k, ATTN_BLOCK)
    attn_bwd_dkdv_variant_kernel[(key_blocks, B * H)](
        q3, k3, v3, do3, lse, delta, dk, dv, n_q, n_k, scale, **common,
        P_FROM_LSE=flags["P_FROM_LSE"], DK_SCALED=flags["DK_SCALED"],
        DELTA_ROWS=flags["DELTA_ROWS"], LSE_ROWS=flags["LSE_ROWS"], LSE_PAST=flags["LSE_PAST"],
    )  # fmt: skip
    attn_bwd_dq_variant_kernel[(triton.cdiv(n_q, ATTN_BLOCK), B * H)](
        q3, k3, v3, do3, lse, delta, dq, n_q, n_k, scale, **common, DQ_SCALED=flags["DQ_SCALED"]
    )  # fmt: skip
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


def attention_backward(q, k, v, o, lse, do, causal, scale):  # right
    return _attn_backward(q, k, v, o, lse, do, causal, scale)


def _attn_backward_variant(name, **mistake):
    def backward(q, k, v, o, lse, do, causal, scale):
        return _attn_backward(q, k, v, o, lse, do, causal, scale, **mistake)

    backward.__name__ = backward.__qualname__ = name
    return backward


attention_backward_without_d = _attn_backward_variant("attention_backward_without_d", D_TERM=False)
attention_backward_dv_unnormalised = _attn_backward_variant(
    "attention_backward_dv_unnormalised", P_FROM_LSE=False
)
attention_backward_unscaled = _attn_backward_variant(
    "attention_backward_unscaled", DQ_SCALED=False, DK_SCALED=False
)
attention_backward_lse_as_log2 = _attn_backward_variant(
    "attention_backward_lse_as_log2", LSE_UNITS="log2"
)
attention_backward_key_grid_floor = _attn_backward_variant(
    "attention_backward_key_grid_floor", key_grid_floor=True
)
attention_backward_no_causal_mask = _attn_backward_variant(
    "attention_backward_no_causal_mask", CAUSAL_MASK=False
)
attention_backward_delta_rows = _attn_backward_variant(
    "attention_backward_delta_rows", DELTA_ROWS=True
)
attention_backward_lse_rows = _attn_backward_variant("attention_backward_lse_rows", LSE_ROWS=True)


def _attention_function(name, forward=None, backward=None, nones=2, ctx_scale=True):
    """The lesson's forward and backward through autograd, with the mistakes `forward` and
    `backward` (keyword arguments of _attn_forward and _attn_backward); backward returns
    `nones` Nones after the gradients (the right count: 2, for causal and scale), and
    without `ctx_scale` takes the default scale, not the forward's."""

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o, lse = _attn_forward(q, k, v, causal, scale, **(forward or {}))
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            scale = ctx.scale if ctx_scale else q.shape[-1] ** -0.5
            grads = _attn_backward(q, k, v, o, lse, do, ctx.causal, scale, **(backward or {}))
            return *grads, *[None] * nones

    def apply(q, k, v, causal=False, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return AttentionFunction.apply(q, k, v, causal, scale)

    apply.__name__ = apply.__qualname__ = name
    return apply


attention = _attention_function("attention")
attention_without_d = _attention_function("attention_without_d", backward={"D_TERM": False})
attention_lse_log2 = _attention_function("attention_lse_log2", forward={"LSE": "log2"})
attention_no_rescale = _attention_function("attention_no_rescale", forward={"RESCALE": False})
attention_end_past_keys = _attention_function(
    "attention_end_past_keys", forward={"END_AT_N_K": False}
)
attention_three_gradients = _attention_function("attention_three_gradients", nones=0)
attention_default_scale_in_backward = _attention_function(
    "attention_default_scale_in_backward", ctx_scale=False
)


def attention_without_function(q, k, v, causal=False, scale=None):
    """The forward alone, with no autograd Function: its output has no gradient."""
    return _attn_forward(q, k, v, causal, q.shape[-1] ** -0.5 if scale is None else scale)[0]
