"""The interpreter's warning about kernels a GPU compile would refuse."""

import contextlib
import types
import warnings

import pytest
import torch
import triton
import triton.language as tl
import triton.language.core as tl_core

from course_lib import gpu_rules, runtime
from course_lib.gpu_rules import GPUCompileWarning

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="interpreter only")


@triton.jit
def doubled(x):
    return x * 2


@triton.jit
def softmax_row_fp32(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Right on a GPU: float16 in, float32 math through library calls and a helper."""
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + offsets, doubled(e / tl.sum(e, axis=0)) / 2, mask=offsets < n)


# a module of helpers, as a kernel reaches another module's helper: `helpers.doubled(x)`,
# and a package holding it: `package.helpers.doubled(x)`
helpers = types.ModuleType("helpers")
helpers.doubled = doubled
package = types.ModuleType("package")
package.helpers = helpers


@triton.jit
def softmax_row_through_a_module(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + offsets, helpers.doubled(e / tl.sum(e, axis=0)) / 2, mask=offsets < n)


@triton.jit
def doubled_through_a_package(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, package.helpers.doubled(x), mask=offsets < n)


@triton.jit
def exp_in_fp16(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, tl.exp(x), mask=offsets < n)


@triton.jit
def if_on_a_block(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    if x > 0:
        x = x * 2
    tl.store(out_ptr + offsets, x, mask=offsets < n)


@triton.jit
def unsolved(x_ptr, BLOCK: tl.constexpr):
    tl.static_assert(False, "Exercise 'ex-k': replace this line with your code")


def _launch(kernel, dtype=torch.float16, n=100):
    x = torch.randn(n).to(dtype)
    out = torch.empty_like(x)
    kernel[(1,)](x, out, n, BLOCK=128)
    return x, out


def test_a_kernel_that_compiles_for_a_gpu_runs_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        x, out = _launch(softmax_row_fp32)
    torch.testing.assert_close(out, torch.softmax(x.float(), 0).half())


def test_a_helper_reached_through_its_module_compiles_and_later_checks_stay_sound():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        x, out = _launch(softmax_row_through_a_module, n=61)
        torch.testing.assert_close(out, torch.softmax(x.float(), 0).half())
        x, out = _launch(doubled_through_a_package, torch.float32, n=23)
        torch.testing.assert_close(out, 2 * x)
        _launch(softmax_row_fp32, torch.float32, n=29)  # the next check in this process
    assert helpers.doubled is doubled and package.helpers is helpers  # left as they were


@triton.jit
def doubled_through_a_module(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, helpers.doubled(x), mask=offsets < n)


@triton.jit
def bits_of(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, (x.to(tl.uint32, bitcast=True) >> 1).to(tl.int32), mask=offsets < n)


WATCHED = [(tl_core, "load"), (tl, "exp"), (tl_core.tensor, "__repr__"), (tl_core.dtype, "to_ir"),
           (tl_core.condition, "__bool__")]  # fmt: skip


def test_an_interpreted_call_inside_a_compile_is_undone_after_it():
    from course_lib import triton_internals

    before = [vars(owner).get(name) for owner, name in WATCHED]
    with triton_internals._language_restored():
        assert doubled(3) == 6  # a helper called outside a launch: the interpreter patches
        assert [vars(owner).get(name) for owner, name in WATCHED] != before
    assert [vars(owner).get(name) for owner, name in WATCHED] == before


def test_a_compile_that_ran_interpreted_code_leaves_later_checks_sound(monkeypatch):
    from course_lib import triton_internals

    # a helper the swap for compiled forms misses: the compile calls the interpreter's
    monkeypatch.setattr(triton_internals, "_jit_view", lambda value, names, seen=(): value)
    before = [vars(owner).get(name) for owner, name in WATCHED]
    with pytest.warns(GPUCompileWarning, match="helpers.doubled"):
        _launch(doubled_through_a_module, torch.float32, n=19)
    assert [vars(owner).get(name) for owner, name in WATCHED] == before
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        x = torch.randn(40)
        out = torch.empty(40, dtype=torch.int32)
        bits_of[(1,)](x, out, 40, BLOCK=64)
        _launch(softmax_row_fp32, torch.float32, n=43)
    torch.testing.assert_close(out, (x.view(torch.int32) >> 1) & 0x7FFFFFFF)


def test_float16_exp_is_reported_with_the_float32_fix():
    with pytest.warns(GPUCompileWarning, match=r"exp_in_fp16.*tl\.exp\(x\).*x\.to\(tl\.float32\)"):
        with contextlib.suppress(Exception):  # newer interpreters refuse it themselves
            _launch(exp_in_fp16)


def test_an_if_on_a_block_is_reported_once_with_tl_where_and_still_runs():
    with pytest.warns(GPUCompileWarning, match=r"at `if x > 0:`.*tl\.where") as record:
        _launch(if_on_a_block, torch.float32)
    assert record[0].filename == __file__  # shown at the launch, not inside Triton
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        _launch(if_on_a_block, torch.float32)  # same kernel and types: said already
        _launch(if_on_a_block, torch.float16)  # other types, same reason: nothing new


def test_an_unsolved_exercise_fails_with_its_own_message_only():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        with pytest.raises(Exception, match="replace this line"):
            unsolved[(1,)](torch.ones(4), BLOCK=4)


def test_the_check_leaves_the_interpreter_as_it_found_it():
    _launch(softmax_row_fp32, n=37)  # whatever a launch leaves patched, the check keeps
    watched = [(tl_core, "program_id"), (tl_core, "load"), (tl, "max"), (tl, "sum")]
    before = [getattr(owner, name) for owner, name in watched]
    x = torch.randn(8)
    gpu_rules.check_launch(softmax_row_fp32.fn, (x, x, 8), {"BLOCK": 8})
    assert [getattr(owner, name) for owner, name in watched] == before


@triton.jit
def dot_tile(a_ptr, c_ptr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    rows, ks = tl.arange(0, BLOCK), tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + rows[:, None] * BLOCK_K + ks[None, :])  # [BLOCK, BLOCK_K]
    b = tl.load(a_ptr + ks[:, None] * BLOCK + rows[None, :])  # [BLOCK_K, BLOCK]
    tl.store(c_ptr + rows[:, None] * BLOCK + rows[None, :], tl.dot(a, b))


def test_a_dot_with_k_under_16_is_refused_as_the_gpus_triton_refuses_it_in_float32_too():
    a, c = torch.randn(256), torch.empty(256)
    with pytest.warns(GPUCompileWarning, match="K >= 16"):
        dot_tile[(1,)](a, c, BLOCK=16, BLOCK_K=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUCompileWarning)
        dot_tile[(1,)](a, c, BLOCK=8, BLOCK_K=16)  # M and N under 16 compile, padded


def test_refusals_are_collected_for_every_launch_though_warned_once():
    a, c = torch.randn(256), torch.empty(256)
    for _ in range(2):
        with gpu_rules.refusals() as found, warnings.catch_warnings():
            warnings.simplefilter("ignore", GPUCompileWarning)
            dot_tile[(1,)](a, c, BLOCK=16, BLOCK_K=8)
        assert len(found) == 1 and "K >= 16" in found[0]
    with pytest.raises(gpu_rules.GPURefused, match="K >= 16"):
        gpu_rules.refusing(lambda: dot_tile[(1,)](a, c, BLOCK=16, BLOCK_K=8))()
