"""The interpreter's out-of-bounds protection for direct kernel calls."""

import pytest
import torch
import triton
import triton.language as tl

from course_lib import interpreter_guard, runtime

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="interpreter only")


@triton.jit
def copy_kernel(
    x_ptr,
    out_ptr,
    n_elements,
    BLOCK_SIZE: tl.constexpr,
    MASK_LOAD: tl.constexpr,
    MASK_STORE: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask if MASK_LOAD else None)
    tl.store(out_ptr + offsets, x, mask=mask if MASK_STORE else None)


def _copy(x, *, mask_load=True, mask_store=True, block=64):
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), block),)
    copy_kernel[grid](
        x, out, x.numel(), BLOCK_SIZE=block, MASK_LOAD=mask_load, MASK_STORE=mask_store
    )
    return out


def test_masked_kernel_runs_untouched():
    x = torch.randn(1000)
    assert torch.equal(_copy(x), x)


def test_unmasked_store_is_stopped_before_it_writes():
    x = torch.randn(1000)
    out = torch.full((1000,), 7.0)
    with pytest.raises(interpreter_guard.OutOfBoundsAccess) as info:
        copy_kernel[(16,)](x, out, 1000, BLOCK_SIZE=64, MASK_LOAD=True, MASK_STORE=False)
    # programs 0-14 stored their blocks; program 15 was stopped before its store, so
    # even its 40 lanes inside the tensor were not written, nor anything beyond
    assert torch.equal(out[:960], x[:960]) and bool((out[960:] == 7.0).all())
    message = str(info.value)
    assert "tl.store" in message and "past the end of `out_ptr`" in message
    assert "1–24 elements" in message  # 1000 = 15 * 64 + 40: 24 lanes too many
    assert "mask" in message


def test_unmasked_load_is_stopped_too():
    x = torch.randn(1000)
    with pytest.raises(interpreter_guard.OutOfBoundsAccess, match="tl.load"):
        _copy(x, mask_load=False)


def test_views_inside_a_larger_storage_are_allowed():
    # the slice's storage extends beyond it, so the unmasked store stays in owned memory
    base = torch.randn(2048)
    x = base[:1000]
    out = torch.empty(2048)[:1000]
    copy_kernel[(16,)](x, out, 1000, BLOCK_SIZE=64, MASK_LOAD=True, MASK_STORE=False)
    assert torch.equal(out, x)


def test_watching_counts_accesses_in_ranges():
    x = torch.randn(100)
    start = x.data_ptr()
    with interpreter_guard.watching([(start, start + 40, "first ten")]) as hits:
        _copy(x)
    assert hits["load", "first ten"] == 10
