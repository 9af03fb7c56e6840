"""Deliberately broken launchers, one classic mistake each, for testing the checkers.

Each kernel differs from the finished one in exactly the way its name says.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


@triton.jit
def add_no_masks_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))  # no masks


def add_without_any_mask(x, y):
    return _launch(add_no_masks_kernel, x, y)


# --- lesson 03: 2-D add -------------------------------------------------------------------

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


# --- lesson 05: matmul --------------------------------------------------------------------


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MASK_K: tl.constexpr, ADVANCE: tl.constexpr, FP16_ACC: tl.constexpr, MASK_STORE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
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
            out_dtype=None, swap_a=False):  # fmt: skip
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=out_dtype or a.dtype, device=a.device)
    sa = a.stride()[::-1] if swap_a else a.stride()
    grid = (triton.cdiv(M, 32) * triton.cdiv(N, 32),)
    matmul_kernel[grid](a, b, c, M, N, K, *sa, *b.stride(), *c.stride(), BLOCK_M=32,
                        BLOCK_N=32, BLOCK_K=32, MASK_K=mask_k, ADVANCE=advance,
                        FP16_ACC=fp16_acc, MASK_STORE=mask_store)  # fmt: skip
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


# --- mistakes whose hints must not point at the wrong fix ---------------------------------


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


def add_2d_swapped_axes_notebook_tiles(x, y):
    return _add_2d(x, y, swap=True, tiles=(32, 128))  # lesson 03's tiles


def add_2d_swapped_x_strides(x, y, tiles=(BLOCK_M, BLOCK_N)):
    return _add_2d(x, y, strides=(*x.stride()[::-1], *y.stride()), tiles=tiles)


def add_2d_swapped_x_strides_notebook_tiles(x, y):
    return add_2d_swapped_x_strides(x, y, tiles=(32, 128))


def add_2d_output_like_x(x, y):
    return _add_2d(x, y, out=torch.empty_like(x))  # keeps a transposed x's strides


def relu_nan_keeping_launcher(x, BLOCK_SIZE=1024):  # noqa: N803  (right: the grid follows it)
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), BLOCK_SIZE),)
    relu_nan_keeping_kernel[grid](x, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
    return out


# --- lesson 04: softmax in float16, a whole-tensor mask, the online and persistent kernels --


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
