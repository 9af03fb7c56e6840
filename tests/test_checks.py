"""Checkers pass the finished kernels and name the mistake of each broken one."""

import functools
import re

import broken_kernels as broken
import pytest
import torch

import course_lib
from course_lib import runtime
from course_lib.checks.engine import CheckFailed, CheckResult
from course_lib.checks.guard import GuardedArena, guarded_copy, is_poison, poison_
from course_lib.checks.tolerances import TOLERANCES
from course_lib.kernels import add_2d, matmul, relu, softmax, vector_add


def _failure(check, fn) -> str:
    with pytest.raises(CheckFailed) as info:
        check(fn)
    assert isinstance(info.value, AssertionError)  # nbval and graders see a failed cell
    return info.value.result.report()


FINISHED = [
    (course_lib.check_vector_add, vector_add.add),
    (course_lib.check_relu, relu.relu),
    (course_lib.check_add_2d, add_2d.add_2d),
    (course_lib.check_softmax, softmax.softmax),
    (course_lib.check_matmul, matmul.matmul),
]


@pytest.mark.parametrize(("check", "fn"), FINISHED, ids=[f.__name__ for _, f in FINISHED])
def test_finished_kernels_pass_with_one_deterministic_line(check, fn, capsys):
    result = check(fn)
    out = capsys.readouterr().out
    name = result.name
    assert out == f"✓ {name}: every case passed\n"
    assert repr(result) == f"✓ {name}: every case passed"
    # Jupyter shows the printed headline, then the cases folded away: the headline once
    assert "<details>" in result._repr_html_() and result.headline not in result._repr_html_()
    labels = [c.label for c in result.cases]
    assert len(labels) >= 7
    assert any("float16" in label for label in labels)
    assert any("bfloat16" in label for label in labels) == (runtime.MODE == "gpu")


@pytest.mark.skipif(not runtime.INTERPRETED, reason="the interpreter watches loads")
def test_vector_add_check_catches_unmasked_loads():
    report = _failure(course_lib.check_vector_add, broken.add_without_load_mask)
    assert "loads read outside the inputs" in report and "mask= to tl.load" in report


def test_failure_report_lists_every_case_and_renders_without_traceback():
    with pytest.raises(CheckFailed) as info:
        course_lib.check_vector_add(broken.add_grid_too_small)
    result = info.value.result
    lines = result.report().splitlines()
    assert lines[0].startswith("✗ vector_add: ") and "cases passed" in lines[0]
    assert sum(line.startswith("  ✓") or line.startswith("  ✗") for line in lines) == len(
        result.cases
    )
    rendered = info.value._render_traceback_()
    assert "vector_add" in rendered[0] and not any("Traceback" in line for line in rendered)


def test_not_implemented_propagates_untouched():
    def stub(x, y):
        raise NotImplementedError("Exercise 'ex': replace this line")

    with pytest.raises(NotImplementedError, match="replace this line"):
        course_lib.check_vector_add(stub)


def test_checker_rejects_a_non_callable():
    with pytest.raises(TypeError, match="expects your launcher function"):
        course_lib.check_vector_add("add")


def test_poison_marks_unwritten_elements_exactly():
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        t = poison_(torch.empty(8, dtype=dtype))
        assert bool(is_poison(t).all()) and bool(torch.isnan(t.float()).all())
        t[3] = float("nan")  # a NaN a kernel computed is not the poison
        t[5] = 1.0
        assert is_poison(t).tolist() == [True] * 3 + [False, True, False, True, True]


def test_arena_serves_guarded_poisoned_tensors_with_the_requested_layout():
    x = torch.randn(6, 4).t()  # non-contiguous
    with GuardedArena() as arena:
        empty = torch.empty_like(x)
        zeros = torch.zeros(5)
        small = x.new_empty(0)
    assert empty.stride() == x.stride() and empty.shape == x.shape
    assert bool(is_poison(empty).all())
    assert torch.equal(zeros, torch.zeros(5))
    assert small.numel() == 0 and len(arena.buffers) == 2
    buf = arena.owner(zeros)
    assert buf is not None and buf.stray_writes() == (0, 0)
    buf.buffer[buf.offset + buf.span] = 1.0  # one element past the end
    buf.buffer[0] = 1.0  # one far before the start
    assert buf.stray_writes() == (1, 1)


def test_guarded_copy_keeps_values():
    x = torch.randn(33)
    view, buf = guarded_copy(x, "x")
    assert torch.equal(view, x) and buf.owns(view) and buf.stray_writes() == (0, 0)


def test_every_tolerance_gives_a_reason():
    for dtype, tol in TOLERANCES.items():
        assert tol.rtol > 0 and tol.why, dtype


def test_result_headline_counts_cases():
    from course_lib.checks.engine import CaseResult

    result = CheckResult("demo", [CaseResult("a"), CaseResult("b", ["wrong"], "fix it")])
    assert result.headline == "✗ demo: 1 of 2 cases passed"
    assert "hint: fix it" in result.report()


def test_guarded_copy_replicates_the_memory_between_strided_elements():
    base = torch.randn(10, 12)
    x = base[::2, :5]  # rows 24 elements apart, 7 unused elements after each row
    view, buf = guarded_copy(x, "x")
    assert view.stride() == x.stride() and torch.equal(view, x)
    spanned = buf.buffer[buf.offset : buf.offset + buf.span]
    assert torch.equal(spanned, base.reshape(-1)[: buf.span])


# A kernel that reads far past its guard bands kills the CUDA context for the whole
# process; on a GPU such a mistake can only be shown in a process of its own.
ON_GPU_IT_CRASHES = pytest.mark.skipif(runtime.MODE == "gpu", reason="crashes the CUDA context")

MISTAKES = [
    (course_lib.check_vector_add, broken.add_offsets_shifted_back, "before the start", "negative"),
    (course_lib.check_vector_add, broken.add_blocks_spread_apart, "never written", "its own block"),
    (
        course_lib.check_vector_add,
        broken.add_writes_into_x,
        "input `x` was modified",
        "never to an",
    ),
    (
        course_lib.check_vector_add,
        broken.add_without_mask,
        "past the end were written",
        "mask = offsets < n_elements",
    ),
    (
        course_lib.check_vector_add,
        broken.add_without_any_mask,
        "past the end were written",
        "mask = offsets < n_elements",
    ),
    (
        course_lib.check_vector_add,
        broken.add_without_store,
        "0 of 37 elements written",
        "did the kernel store its result",
    ),
    (
        course_lib.check_vector_add,
        broken.add_grid_too_small,
        "only the first",
        "the grid is too small",
    ),
    (course_lib.check_vector_add, broken.add_wrong_op, "elements wrong; worst at", "you subtract"),
    (
        course_lib.check_vector_add,
        broken.add_grid_too_small_notebook_block,
        "only the first",
        "the grid is too small",
    ),
    (course_lib.check_vector_add, broken.add_unscaled_offsets, "only the first", "blocks overlap"),
    (
        course_lib.check_vector_add,
        broken.add_unscaled_offsets_notebook_block,
        "only the first",
        "blocks overlap",
    ),
    (course_lib.check_relu, broken.relu_nan_to_zero, "with NaN", "NaN became 0"),
    (
        course_lib.check_relu,
        broken.relu_grid_for_one_block_size,
        "BLOCK_SIZE=256: only the first",
        "wrong at BLOCK_SIZE=256",
    ),
    (
        course_lib.check_vector_add,
        broken.add_wrong_dtype,
        "output dtype torch.float32, expected torch.float16",
        "dtype",
    ),
    (
        course_lib.check_vector_add,
        broken.add_returns_input,
        "the result is the input `x` itself",
        "allocate a new output",
    ),
    (
        course_lib.check_vector_add,
        broken.add_forgets_return,
        "your function returned None",
        "return the output tensor",
    ),
    (
        course_lib.check_vector_add,
        broken.add_raises,
        "raised RuntimeError: launcher exploded",
        "read the error",
    ),
    (course_lib.check_vector_add, broken.add_zero_output, "elements wrong", "all 0"),
    (course_lib.check_relu, broken.relu_identity, "elements wrong", "the output equals the input"),
    (course_lib.check_relu, broken.relu_minimum, "elements wrong", "tl.minimum"),
    (
        course_lib.check_relu,
        broken.relu_without_mask,
        "past the end were written",
        "mask = offsets < n_elements",
    ),
    (
        course_lib.check_add_2d,
        broken.add_2d_assumes_contiguous,
        "x transposed, float32: ",
        "assumes contiguous memory",
    ),
    (course_lib.check_add_2d, broken.add_2d_swapped_axes, "rows written", "axes disagree"),
    (
        course_lib.check_add_2d,
        broken.add_2d_swapped_axes_notebook_tiles,
        "written",
        "axes disagree",
    ),
    pytest.param(
        course_lib.check_add_2d,
        broken.add_2d_swapped_x_strides,
        "64x64 (square), float32: ",
        "x's row and column strides are swapped",
        marks=ON_GPU_IT_CRASHES,
    ),
    pytest.param(
        course_lib.check_add_2d,
        broken.add_2d_swapped_x_strides_notebook_tiles,
        "64x64 (square), float32: ",
        "x's row and column strides are swapped",
        marks=ON_GPU_IT_CRASHES,
    ),
    (
        course_lib.check_add_2d,
        broken.add_2d_output_like_x,
        "x transposed, float32: the output is not contiguous",
        "torch.empty_like(x) copies x's strides",
    ),
    (
        course_lib.check_add_2d,
        broken.add_2d_row_mask_only,
        "past the end were written",
        "mask both dimensions",
    ),
    (course_lib.check_add_2d, broken.add_2d_grid_floor, "never written", "misses the edge tiles"),
    (
        course_lib.check_softmax,
        broken.softmax_fixed_block_256,
        "16x1024 (rows wider than 256), float32: only the first 256 of 1024 columns written",
        "BLOCK_SIZE = triton.next_power_of_2(n_cols)",
    ),
    (course_lib.check_softmax, broken.softmax_zero_padding, "37x781", "other=-float('inf')"),
    (
        course_lib.check_softmax,
        broken.softmax_no_max_subtraction,
        "(values up to ±1e4), float32: ",
        "subtract the row max",
    ),
    (
        course_lib.check_softmax,
        broken.softmax_ignores_row_stride,
        "(row stride 900), float32: ",
        "x.stride(0)",
    ),
    (course_lib.check_softmax, broken.softmax_over_columns, "elements wrong", "over each row"),
    (course_lib.check_matmul, broken.matmul_without_k_mask, "got nan", "Mask the K dimension"),
    (
        course_lib.check_matmul,
        broken.matmul_pointers_not_advanced,
        "elements wrong",
        "advance the pointers",
    ),
    (
        course_lib.check_matmul,
        broken.matmul_fp16_accumulator,
        "(long K), float16: ",
        "accumulate in float32",
    ),
    (
        course_lib.check_matmul,
        broken.matmul_fp32_output,
        "output dtype torch.float32",
        "acc.to(c_ptr.dtype.element_ty)",
    ),
    (
        course_lib.check_matmul,
        broken.matmul_without_store_mask,
        "past the end were written",
        "mask the store",
    ),
    pytest.param(
        course_lib.check_matmul,
        broken.matmul_swapped_a_strides,
        "(square), float32: ",
        "A's strides are swapped",
        marks=ON_GPU_IT_CRASHES,
    ),
]


@pytest.mark.parametrize(
    ("check", "fn", "problem", "hint"),
    MISTAKES,
    ids=[getattr(m, "values", m)[1].__name__ for m in MISTAKES],
)
def test_check_names_the_mistake(check, fn, problem, hint):
    report = _failure(check, fn)
    assert problem in report, report
    assert re.search(r"hint: .*" + re.escape(hint), report), report


@pytest.mark.parametrize(
    ("check", "fn", "misleading"),
    [
        (course_lib.check_vector_add, broken.add_unscaled_offsets, "the grid is too small"),
        (
            course_lib.check_vector_add,
            broken.add_unscaled_offsets_notebook_block,
            "the grid is too small",
        ),
        (course_lib.check_add_2d, broken.add_2d_swapped_axes_notebook_tiles, "the grid misses"),
        pytest.param(
            course_lib.check_add_2d,
            broken.add_2d_swapped_x_strides_notebook_tiles,
            "mask both dimensions",
            marks=ON_GPU_IT_CRASHES,
        ),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_hints_never_point_at_the_wrong_fix(check, fn, misleading):
    assert misleading not in _failure(check, fn)


def test_a_relu_with_a_block_size_argument_is_checked_at_another_block_size():
    labels = [c.label for c in course_lib.check_relu(broken.relu_nan_keeping_launcher).cases]
    assert any(label.endswith("BLOCK_SIZE=256") for label in labels)
    assert not any("BLOCK_SIZE" in c.label for c in course_lib.check_relu(relu.relu).cases)


def test_vector_add_sizes_cover_the_awkward_cases():
    labels = [c.label for c in course_lib.check_vector_add(vector_add.add).cases]
    for why in ("smaller than one block", "a prime size", "not a multiple of the block",
                "many blocks"):  # fmt: skip
        assert any(why in label for label in labels), why


@ON_GPU_IT_CRASHES
def test_swapped_matmul_strides_are_not_blamed_on_the_k_mask():
    report = _failure(course_lib.check_matmul, broken.matmul_swapped_a_strides)
    assert "Mask the K dimension" not in report


def test_pytorch_without_a_kernel_does_not_pass():
    report = _failure(course_lib.check_vector_add, lambda x, y: x + y)
    assert "your function launched no Triton kernel" in report and "not from a kernel" in report


def test_a_foreign_not_implemented_error_is_a_finding_not_a_stub():
    def launcher(x, y):
        raise NotImplementedError("Could not run 'aten::foo'")

    report = _failure(course_lib.check_vector_add, launcher)
    assert "raised NotImplementedError: Could not run 'aten::foo'" in report


def test_integer_tensors_can_be_poisoned():
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        assert bool(is_poison(poison_(torch.empty(4, dtype=dtype))).all())


# --- lesson 04: softmax in float16, whole-tensor masks, the online and persistent kernels ---

# (check, broken launcher, what the report says, what its hint must name)
SOFTMAX_MISTAKES = [
    (
        course_lib.check_softmax,
        broken.softmax_sums_in_half_precision,
        "1x70001 (row sum past float16's 65504), float16: ",
        "your kernel computes in float16",
    ),
    (
        course_lib.check_softmax,
        broken.softmax_whole_tensor_mask,
        "37x781 (row not a power of two), float32: ",
        "ran on into the next row",
    ),
    (
        course_lib.check_softmax_looped,
        broken.softmax_looped_no_rescale,
        "(values rising along the row: the max grows in every block), float32, BLOCK_SIZE=256: ",
        "running sum is not rescaled",
    ),
    (
        course_lib.check_softmax_looped,
        broken.softmax_looped_no_inf_guard,
        "(the first 2500 columns -inf in every other row), float32, BLOCK_SIZE=256: ",
        "first block is all -inf",
    ),
    (
        course_lib.check_softmax_looped,
        broken.softmax_looped_one_pass,
        "16x1024 (rows wider than 256), float32, BLOCK_SIZE=256: ",
        "normalise and store in a second loop",
    ),
    (
        course_lib.check_softmax_looped,
        broken.softmax_looped_second_pass_no_offsets,
        "only the first 256 of 1024 columns written in every row",
        "In the second loop, offset each block's columns",
    ),
    (
        course_lib.check_softmax_persistent,
        broken.softmax_persistent_no_loop,
        "37x781 (3 programs, rows not a multiple of them), float32: only the first 3 of 37 rows",
        "programs stopped after their first row",
    ),
    (
        course_lib.check_softmax_persistent,
        broken.softmax_persistent_loop_from_zero,
        "37x781 (3 programs, rows not a multiple of them), float32: ",
        "every program started at row 0",
    ),
]
_SOFTMAX_IDS = [fn.__name__ for _, fn, _, _ in SOFTMAX_MISTAKES]


@functools.cache
def _softmax_report(check, fn) -> str:
    """Each broken softmax runs once, however many tests read its report."""
    return _failure(check, fn)


@pytest.mark.parametrize(("check", "fn", "problem", "hint"), SOFTMAX_MISTAKES, ids=_SOFTMAX_IDS)
def test_softmax_check_names_the_mistake(check, fn, problem, hint):
    report = _softmax_report(check, fn)
    assert problem in report, report
    assert re.search(r"hint: .*" + re.escape(hint), report), report


@pytest.mark.parametrize(("check", "fn", "problem", "hint"), SOFTMAX_MISTAKES, ids=_SOFTMAX_IDS)
def test_softmax_hint_appears_for_its_mistake_only(check, fn, problem, hint):
    others = [f for c, f, _, _ in SOFTMAX_MISTAKES if c is check and f is not fn]
    if check is course_lib.check_softmax:  # the first exercise's mistakes, from above
        others += [v[1] for v in (getattr(m, "values", m) for m in MISTAKES) if v[0] is check]
    assert others
    for other in others:
        assert hint not in _softmax_report(check, other), other.__name__


@pytest.mark.parametrize(
    ("check", "fn"),
    [
        (course_lib.check_softmax_looped, broken.softmax_looped_correct),
        (course_lib.check_softmax_persistent, broken.softmax_persistent_correct),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_correct_softmax_variants_pass_without_hints(check, fn):
    result = check(fn)
    assert result.passed and not any(c.hint for c in result.cases)


def test_softmax_variant_checks_cover_their_cases():
    looped = [c.label for c in course_lib.check_softmax_looped(broken.softmax_looped_correct).cases]
    assert all(label.endswith("BLOCK_SIZE=256") for label in looped)
    assert any("-inf in every other row" in label for label in looped)
    persistent = course_lib.check_softmax_persistent(broken.softmax_persistent_correct).cases
    assert any("1 program for every row" in c.label for c in persistent)
    assert any("float16" in c.label and "65504" in c.label for c in persistent)


def test_persistent_hints_never_ask_for_one_program_per_row():
    for fn in (broken.softmax_persistent_no_loop, broken.softmax_persistent_loop_from_zero):
        assert "grid = (n_rows,)" not in _softmax_report(course_lib.check_softmax_persistent, fn)


def test_half_precision_hint_needs_the_float32_cases_to_pass():
    def zeros_everywhere(x):  # wrong on float32 too: not a float16 problem
        out = torch.zeros_like(x)
        broken.add_kernel[(1,)](x, x, out, 0, BLOCK_SIZE=128)  # a launch that stores nothing
        return out

    assert "computes in float16" not in _failure(course_lib.check_softmax, zeros_everywhere)


@pytest.mark.parametrize(
    ("check", "parameter"),
    [
        (course_lib.check_softmax_looped, "BLOCK_SIZE"),
        (course_lib.check_softmax_persistent, "n_programs"),
    ],
)
def test_softmax_variant_checks_say_which_parameter_is_missing(check, parameter):
    with pytest.raises(TypeError, match=f"give it a {parameter} parameter"):
        check(softmax.softmax)
