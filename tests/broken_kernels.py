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
