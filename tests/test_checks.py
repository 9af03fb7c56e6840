"""Checkers pass the finished kernels and name the mistake of each broken one."""

import functools
import re

import broken_kernels as broken
import pytest
import torch
from reports import assert_hint_under, assert_no_other_family

import course_lib
from course_lib import runtime
from course_lib.checks import transpose as transpose_check
from course_lib.checks.engine import CheckFailed, CheckResult
from course_lib.checks.guard import GuardedArena, guarded_copy, is_poison, poison_
from course_lib.checks.tolerances import TOLERANCES
from course_lib.kernels import add_2d, conv2d, linear, matmul, relu, softmax, vector_add


def _failure(check, fn) -> str:
    with pytest.raises(CheckFailed) as info:
        check(fn)
    assert isinstance(info.value, AssertionError)  # nbval and graders see a failed cell
    return info.value.result.report()


def linear_with_z(x, weight, bias=None, activation=None, save_z=False):
    """The finished linear with the exercise's save_z: z by a second call, no activation."""
    y = linear.linear(x, weight, bias, activation)
    return (y, linear.linear(x, weight, bias)) if save_z else y


FINISHED = [
    (course_lib.check_vector_add, vector_add.add),
    (course_lib.check_relu, relu.relu),
    (course_lib.check_add_2d, add_2d.add_2d),
    (course_lib.check_softmax, softmax.softmax),
    (course_lib.check_matmul, matmul.matmul),
    (course_lib.check_conv2d, conv2d.conv2d),
    (course_lib.check_linear_forward, linear_with_z),
    (course_lib.check_linear, linear.linear),
]


@pytest.mark.parametrize(
    ("check", "fn"), FINISHED, ids=[f"{c.__name__}-{f.__name__}" for c, f in FINISHED]
)
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
        raise course_lib.ExerciseNotDone("Exercise 'ex': replace this line")

    with pytest.raises(course_lib.ExerciseNotDone, match="replace this line"):
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


def test_arena_starts_tensors_as_aligned_as_torch_does_and_leaves_meta_ones_alone():
    # launchers may keep kernels specialised for aligned outputs (KeptLaunch): a guard of
    # any length would start the tensor anywhere
    with GuardedArena() as arena:
        odd = torch.empty(70_001, dtype=torch.float16)  # guard as long as the tensor
        layout = torch.empty(3, 5, device="meta")
    (guarded,) = arena.buffers
    assert (odd.data_ptr() - guarded.buffer.data_ptr()) % 256 == 0
    assert layout.is_meta and arena.owner(odd) is guarded


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
    *[
        pytest.param(
            course_lib.check_matmul,
            fn,
            "(B square, one K step), float32: ",
            "B's strides are swapped",
            marks=ON_GPU_IT_CRASHES,
        )
        for fn in (
            broken.matmul_b_strides_swapped_in_formula,
            broken.matmul_b_strides_swapped_in_formula_notebook_tiles,
        )
    ],
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
@pytest.mark.parametrize(
    "fn",
    [
        broken.matmul_swapped_a_strides,
        broken.matmul_b_strides_swapped_in_formula,
        broken.matmul_b_strides_swapped_in_formula_notebook_tiles,
    ],
    ids=lambda fn: fn.__name__,
)
def test_swapped_matmul_strides_are_not_blamed_on_a_mask(fn):
    report = _failure(course_lib.check_matmul, fn)
    assert "mask the K dimension" not in report.lower()
    assert "mask the store" not in report


def test_a_load_stopped_out_of_bounds_gets_the_load_hint_where_a_check_has_one():
    from course_lib.checks import engine
    from course_lib.checks import matmul as matmul_check
    from course_lib.interpreter_guard import OutOfBoundsAccess

    for kind, hints, expected in [
        ("load", matmul_check.HINTS, matmul_check.HINTS.load_out_of_bounds),
        ("store", matmul_check.HINTS, matmul_check.HINTS.out_of_bounds),
        ("load", engine.Hints(), engine.Hints().out_of_bounds),  # no load hint of its own
    ]:
        result = engine.CaseResult("case")
        error = OutOfBoundsAccess(f"tl.{kind} in program (0, 0, 0) reached 1 address(es) ...")
        engine._explain_error(engine._describe_exception(error), result, hints)
        assert result.hint == expected, (kind, result.hint)
    assert "mask the K dimension in both loads" in matmul_check.HINTS.load_out_of_bounds


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


# --- lessons 01 and 02: axpy and the autotuned leaky ReLU ---------------------------------

from course_lib.checks import elementwise  # noqa: E402
from course_lib.checks.autotuning import redefined_meta_parameter  # noqa: E402


@pytest.mark.parametrize(
    ("check", "fn"),
    [(course_lib.check_axpy, broken.axpy), (course_lib.check_leaky_relu, broken.leaky_relu)],
    ids=["axpy", "leaky_relu"],
)
def test_right_practice_launchers_pass_with_one_line(check, fn, capsys):
    result = check(fn)
    assert capsys.readouterr().out == f"✓ {result.name}: every case passed\n"
    labels = [c.label for c in result.cases]
    assert any("float16" in label for label in labels)
    for why in ("a single element", "smaller than one block", "a prime size", "many blocks"):
        assert any(why in label for label in labels), why


PRACTICE_MISTAKES = [
    (course_lib.check_axpy, broken.axpy_alpha_truncated, "alpha=2.5: ", "int(alpha) * x + y"),
    (course_lib.check_axpy, broken.axpy_alpha_on_y, "elements wrong", "alpha scales y here"),
    (course_lib.check_axpy, broken.axpy_alpha_on_both, "elements wrong", "the whole sum"),
    (course_lib.check_axpy, broken.axpy_without_alpha, "elements wrong", "multiply x by alpha"),
    (course_lib.check_axpy, broken.axpy_without_y, "elements wrong", "add y to it"),
    (
        course_lib.check_axpy,
        broken.axpy_without_store_mask,
        "past the end were written",
        "mask = offsets < n_elements",
    ),
    (course_lib.check_axpy, broken.axpy_grid_floor, "only the first", "the grid is too small"),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_nan_to_zero,
        "with NaN, ±inf and -0.0, float32, your configs: ",
        "NaN became 0",
    ),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_slope_on_positives,
        "elements wrong",
        "you scaled the positive values",
    ),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_fixed_slope,
        "elements wrong",
        "scaled by 0.01, not by the negative_slope",
    ),
    (course_lib.check_leaky_relu, broken.leaky_relu_as_relu, "got 0, expected", "as in a ReLU"),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_passes_block_size,
        "multiple values for keyword argument 'BLOCK_SIZE'",
        "your launch passes BLOCK_SIZE, which the autotuner's configs set",
    ),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_tuple_grid,
        "BLOCK_SIZE=128: only the first",
        "A tuple grid is fixed",
    ),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_grid_ignores_meta,
        "BLOCK_SIZE=128: only the first",
        "does not follow meta['BLOCK_SIZE']",
    ),
    (
        course_lib.check_leaky_relu,
        broken.leaky_relu_not_autotuned,
        "launched no @triton.autotune kernel",
        "decorate your kernel with @triton.autotune",
    ),
    pytest.param(
        (
            course_lib.check_leaky_relu,
            broken.leaky_relu_many_configs_everywhere,
            "your configs: your function raised RuntimeError",
            "no GPU to time them on",
        ),
        marks=pytest.mark.skipif(not runtime.INTERPRETED, reason="a GPU times the configs"),
    ),
]


def _practice_id(mistake) -> str:
    return getattr(mistake, "values", [mistake])[0][1].__name__


@pytest.mark.parametrize("mistake", PRACTICE_MISTAKES, ids=_practice_id)
def test_practice_check_gives_every_failing_case_the_mistakes_hint(mistake):
    """The hint names the mistake, and no other hint shows: every case that fails says it."""
    check, fn, problem, hint = mistake
    report = _failure(check, fn)
    assert problem in report, report
    shown = re.findall(r"hint: (.*)", report)
    assert shown and all(hint in line for line in shown), report


def test_the_grid_hint_counts_the_programs_launched_and_needed():
    report = _failure(course_lib.check_leaky_relu, broken.leaky_relu_tuple_grid)
    n = elementwise.SIZES[2][0]  # the prime size: the grid was worked out for blocks of 512
    launched, needed = -(-n // 512), -(-n // 128)
    assert f"float32, BLOCK_SIZE=128: only the first {launched * 128} of {n} elements" in report
    assert (
        f"with BLOCK_SIZE=128 from the autotuner, your grid launched {launched} programs "
        f"where n_elements={n} needs {needed}" in report
    )


def test_a_fixed_slope_is_not_blamed_where_the_slope_is_the_default():
    report = _failure(course_lib.check_leaky_relu, broken.leaky_relu_fixed_slope)
    assert "  ✓ n=37 (smaller than one block), float32, negative_slope left at 0.01" in report


def test_the_leaky_relu_check_leaves_the_autotuner_as_it_was():
    from triton.runtime.autotuner import Autotuner

    run, configs = Autotuner.run, broken.leaky_relu_autotuned.configs
    course_lib.check_leaky_relu(broken.leaky_relu)
    _failure(course_lib.check_leaky_relu, broken.leaky_relu_passes_block_size)
    assert Autotuner.run is run and broken.leaky_relu_autotuned.configs is configs


def test_redefined_meta_parameters_are_read_from_both_of_tritons_messages():
    import triton

    configs = [triton.Config({"BLOCK_SIZE": 128}, num_warps=4)]
    conflict = ValueError(
        "Conflicting meta-parameters: BLOCK_SIZE. Make sure that you don't re-define "
        "auto-tuned symbols."
    )
    twice = TypeError("run() got multiple values for keyword argument 'num_warps'")
    assert redefined_meta_parameter(conflict, configs) == "BLOCK_SIZE"
    assert redefined_meta_parameter(twice, configs) == "num_warps"
    unrelated = TypeError("f() got multiple values for keyword argument 'x_ptr'")
    assert redefined_meta_parameter(unrelated, configs) is None
    assert redefined_meta_parameter(RuntimeError("boom"), configs) is None


@pytest.mark.parametrize("check", [course_lib.check_axpy, course_lib.check_leaky_relu])
def test_practice_checks_reject_a_non_callable(check):
    with pytest.raises(TypeError, match="expects your launcher function"):
        check("launcher")


# --- lesson 03: transpose -----------------------------------------------------------------

# every hint the transpose check may give for a mistake of its own, by a short name; the
# strides hint by the part it shows both with its premise and without
TRANSPOSE_HINT_TEXTS = {
    "returned input": transpose_check.HINTS.returned_input,
    "not contiguous": transpose_check.HINTS.not_contiguous,
    "strides": transpose_check.STRIDES_HINT.split(": ", 1)[1],
    "not transposed": transpose_check.NOT_TRANSPOSED_HINT,
    "x's order": transpose_check.IN_X_ORDER_HINT,
    "mask": transpose_check.HINTS.out_of_bounds,
    "crossed": transpose_check.CROSSED_HINT,
    "edges": transpose_check.HINTS.missing_edges,
    "rows": transpose_check.HINTS.missing_rows,
    "columns": transpose_check.HINTS.missing_columns,
}


def _at_both_tile_sizes(small, notebook, *expected, marks=()):
    """One mistake made at the tests' small tiles and at the notebook's: the same report."""
    return [pytest.param(fn, *expected, marks=marks) for fn in (small, notebook)]


# (broken launcher, a problem its report names, its hint in words, the hint's name,
#  hints that other cases of the same mistake may show as well)
TRANSPOSE_MISTAKES = [
    (
        broken.transpose_returns_input,
        "the result is the input `x` itself",
        "share x's memory",
        "returned input",
        set(),
    ),
    (
        broken.transpose_returns_view,
        "the result is a view of the input `x`",
        "x.t() and x.T are views",
        "returned input",
        set(),
    ),
    (
        broken.transpose_into_transposed_view,
        "(wide), float32: the output is not contiguous",
        "torch.empty((M, N)).t() has the right shape but not the layout",
        "not contiguous",
        set(),
    ),
    (
        broken.transpose_assumes_contiguous,
        "130x257, x transposed, float32: ",
        "contiguous inputs pass but this one does not: your kernel assumes x is contiguous",
        "strides",
        set(),
    ),
    *_at_both_tile_sizes(
        broken.transpose_in_x_order,
        broken.transpose_in_x_order_notebook_tiles,
        "(wide), float32: ",
        "your output is x.reshape(N, M)",
        "x's order",
        {"not transposed"},
    ),
    pytest.param(
        broken.transpose_swapped_x_strides,
        "64x64 (square), float32: ",
        "your output equals x itself: nothing was transposed",
        "not transposed",
        set(),
        marks=ON_GPU_IT_CRASHES,
    ),
    *_at_both_tile_sizes(
        broken.transpose_row_mask_only,
        broken.transpose_row_mask_only_notebook_tiles,
        "past the end were written",
        "mask both dimensions",
        "mask",
        set(),
        marks=ON_GPU_IT_CRASHES,
    ),
    pytest.param(
        broken.transpose_column_mask_only,
        "past the end were written",
        "mask both dimensions",
        "mask",
        set(),
        marks=ON_GPU_IT_CRASHES,
    ),
    *_at_both_tile_sizes(
        broken.transpose_swapped_axes,
        broken.transpose_swapped_axes_notebook_tiles,
        "rows written",
        "its axes and tl.program_id's disagree",
        "crossed",
        set(),
    ),
    (
        broken.transpose_grid_over_output_notebook_tiles,
        "rows written",
        "the grid follows the output's shape [N, M]",
        "crossed",
        set(),
    ),
    *_at_both_tile_sizes(
        broken.transpose_grid_floor,
        broken.transpose_grid_floor_notebook_tiles,
        "never written",
        "the grid misses the edge tiles",
        "edges",
        {"rows", "columns"},
    ),
    (
        broken.transpose_grid_floor_rows,
        "columns written in every row",
        "the output's last columns, which are x's last rows",
        "columns",
        set(),
    ),
    (
        broken.transpose_grid_floor_columns,
        "rows written",
        "the output's last rows, which are x's last columns",
        "rows",
        set(),
    ),
]


@pytest.mark.parametrize(
    ("fn", "problem", "hint", "name", "also"),
    TRANSPOSE_MISTAKES,
    ids=[getattr(m, "values", m)[0].__name__ for m in TRANSPOSE_MISTAKES],
)
def test_transpose_check_names_the_mistake_and_no_other(fn, problem, hint, name, also):
    report = _failure(course_lib.check_transpose, fn)
    assert problem in report, report
    assert re.search(r"hint: .*" + re.escape(hint), report), report
    assert TRANSPOSE_HINT_TEXTS[name] in report
    for other, text in TRANSPOSE_HINT_TEXTS.items():
        if other != name and other not in also:
            assert text not in report, f"the {other!r} hint for {fn.__name__}:\n{report}"


def test_every_transpose_hint_has_a_broken_kernel():
    named = {getattr(m, "values", m)[3] for m in TRANSPOSE_MISTAKES}
    assert named == set(TRANSPOSE_HINT_TEXTS)


@pytest.mark.parametrize(
    "fn", [broken.transpose_tiled, broken.transpose_tiled_notebook_tiles], ids=lambda f: f.__name__
)
def test_a_right_transpose_passes_every_awkward_case(fn, capsys):
    result = course_lib.check_transpose(fn)
    assert capsys.readouterr().out == "✓ transpose: every case passed\n"
    labels = [c.label for c in result.cases]
    for why in ("one row", "one column", "smaller than a tile", "not a multiple of the tile",
                "square", "many tiles", "x transposed", "x strided", "float16"):  # fmt: skip
        assert any(why in label for label in labels), why
    assert any("bfloat16" in label for label in labels) == (runtime.MODE == "gpu")


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


def test_a_grid_of_no_programs_is_named_as_such():
    result = _failure(course_lib.check_vector_add, broken.add_grid_floor)
    empty = [c for c in result.splitlines() if "0 of " in c and "elements written" in c]
    assert empty and "the grid has no programs" in result and "triton.cdiv" in result
    assert "did the kernel store" not in result
    assert "the grid is too small" in result  # the sizes above a block lose only the tail


def test_the_costly_float16_overflow_case_waits_for_the_rest():
    # a wrong mask at its 131,072-wide block takes a GPU compile minutes: not run while
    # other cases fail, and run (and named) once they pass
    report = _failure(course_lib.check_softmax, broken.softmax_whole_tensor_mask)
    assert "(row sum past float16's 65504), float16: not run until every case above" in report
    report = _failure(course_lib.check_softmax, broken.softmax_sums_in_half_precision)
    assert "float16's 65504), float16: not run" not in report
    assert "your kernel computes in float16" in report


def test_a_learners_own_not_implemented_error_is_a_finding():
    def launcher(x, y):
        raise NotImplementedError("Exercise 'ex': looks like a stub, but is the learner's")

    report = _failure(course_lib.check_vector_add, launcher)
    assert "your function raised NotImplementedError" in report


@pytest.mark.parametrize(
    ("check", "fn", "kinds"),
    [
        (course_lib.check_vector_add, broken.add_grid_floor, {"unwritten"}),
        (course_lib.check_vector_add, broken.add_wrong_op, {"values"}),
        (course_lib.check_vector_add, broken.add_returns_input, {"returned"}),
        (course_lib.check_vector_add, broken.add_wrong_dtype, {"layout"}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_problems_carry_a_kind_that_programs_can_read(check, fn, kinds):
    with pytest.raises(CheckFailed) as info:
        check(fn)
    result = info.value.result
    assert result.kinds == kinds
    for case in result.cases:
        assert all(isinstance(p, str) for p in case.problems)  # still text for people
        assert case.kinds == [p.kind for p in case.problems]


# --- lesson 05: grouped program order and the fused epilogue ------------------------------


from course_lib import references  # noqa: E402
from course_lib.checks import matmul as matmul_checks  # noqa: E402
from course_lib.checks.launches import recording_grids  # noqa: E402


@functools.cache
def _lesson_05_failure(check, fn) -> str:
    """The report of a failing check, run once for all the tests that read it."""
    return _failure(check, fn)


LESSON_05_MISTAKES = [
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_full_last_group,
        "(the last group shorter), float32: ",
        "tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_rest_swapped,
        "(the last group shorter), float32: ",  # the sizes differ by mode, and so the symptom
        "a mapping with % and // exchanged",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_exchanged,
        "(the last group shorter), float32: ",
        "your pid_m and pid_n are exchanged",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_exchanged,
        "(the order), float32: run with only its first 10 programs",
        "go along a row of tiles before moving down",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_row_major,
        "run with only its first 10 programs, your kernel wrote tiles (0, 0), (0, 1), (0, 2)",
        "in row-major order",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_ignores_group_m,
        "run with only its first",
        "not for the GROUP_M = 4 your launcher was given",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_first_row_not_scaled,
        "never written",
        "tiles of C were never written, (pid_m, pid_n) = ",
    ),
    (
        course_lib.check_matmul_grouped,
        broken.matmul_grouped_grid_floor,
        "never written",
        "your grid ran only those",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_no_bias,
        "elements wrong",
        "the bias is missing: load it",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_bias_per_row,
        "(M > N), activation='leaky_relu', float32: ",
        "the bias went along the wrong axis",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_bias_per_row,
        "(square), activation='relu', float32: ",
        "the bias went along the wrong axis",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_bias_down_the_tile,
        "(M < N), activation=None, float32: ",
        "the bias went along the wrong axis",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_bias_in_full_tiles,
        "(many tiles), activation='leaky_relu', float32: ",
        "missing in the last column of tiles",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_activation_first,
        "(square), activation='relu', float32: ",
        "the activation came before the bias",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_rounded_first,
        "(primes), activation=None, float16: ",
        "rounded twice",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_no_activation,
        "(square), activation='relu', float32: ",
        "you applied no activation where activation='relu' was asked",
    ),
    (
        course_lib.check_matmul_bias_act,
        broken.matmul_bias_act_always_relu,
        "activation=None, float32: ",
        "you applied relu where activation=None was asked",
    ),
]


@pytest.mark.parametrize(
    ("check", "fn", "problem", "hint"),
    LESSON_05_MISTAKES,
    ids=[f"{m[1].__name__}-{i}" for i, m in enumerate(LESSON_05_MISTAKES)],
)
def test_lesson_05_checks_name_the_mistake(check, fn, problem, hint):
    report = _lesson_05_failure(check, fn)
    assert problem in report, report
    assert_hint_under(report, problem, hint)


@pytest.mark.parametrize(
    ("check", "fn"),
    [
        (course_lib.check_matmul_grouped, broken.matmul_grouped),
        (course_lib.check_matmul_bias_act, broken.matmul_bias_act),
    ],
    ids=["grouped", "bias_act"],
)
def test_lesson_05_checks_pass_a_right_kernel(check, fn, capsys):
    result = check(fn)
    assert capsys.readouterr().out == f"✓ {result.name}: every case passed\n"
    labels = [c.label for c in result.cases]
    assert any("float16" in label for label in labels)


GROUPED_HINTS = [*matmul_checks.MAPPING_HINTS.values(), matmul_checks.ACROSS_FIRST_HINT]


def _hint_families(report: str, hints: list[str]) -> set[int]:
    """Which of `hints` (by their text before the first {field}) the report shows."""
    return {i for i, h in enumerate(hints) if h.split("{")[0] in report}


@pytest.mark.parametrize(
    ("fn", "allowed"),
    [
        (broken.matmul_grouped_full_last_group, {0}),
        (broken.matmul_grouped_rest_swapped, {1}),
        (broken.matmul_grouped_exchanged, {2, 4}),
        (broken.matmul_grouped_row_major, {3}),
        (broken.matmul_grouped_ignores_group_m, set()),
        (broken.matmul_grouped_first_row_not_scaled, set()),
        (broken.matmul_grouped_grid_floor, set()),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_grouped_hints_name_only_the_mapping_made(fn, allowed):
    report = _lesson_05_failure(course_lib.check_matmul_grouped, fn)
    assert _hint_families(report, GROUPED_HINTS) == allowed, report


BIAS_ACT_HINTS = [
    matmul_checks.BIAS_MISSING_HINT,
    matmul_checks.BIAS_PER_ROW_HINT,
    matmul_checks.BIAS_TAIL_HINT,
    matmul_checks.ACTIVATION_FIRST_HINT,
    matmul_checks.ROUNDED_FIRST_HINT,
    matmul_checks.WRONG_ACTIVATION_HINT,
]


@pytest.mark.parametrize(
    ("fn", "allowed"),
    [
        (broken.matmul_bias_act_no_bias, {0}),
        (broken.matmul_bias_act_bias_per_row, {1}),
        (broken.matmul_bias_act_bias_down_the_tile, {1}),
        (broken.matmul_bias_act_bias_in_full_tiles, {2}),
        (broken.matmul_bias_act_activation_first, {3}),
        (broken.matmul_bias_act_rounded_first, {4}),
        (broken.matmul_bias_act_no_activation, {5}),
        (broken.matmul_bias_act_always_relu, {5}),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_bias_act_hints_name_only_the_mistake_made(fn, allowed):
    report = _lesson_05_failure(course_lib.check_matmul_bias_act, fn)
    assert _hint_families(report, BIAS_ACT_HINTS) == allowed, report


def test_grouped_check_says_when_the_launcher_takes_no_group_m():
    report = _failure(course_lib.check_matmul_grouped, broken.matmul_swapped_a_strides)
    assert "unexpected keyword argument 'GROUP_M'" in report


def test_lesson_05_checks_reject_a_non_callable():
    for check in (course_lib.check_matmul_grouped, course_lib.check_matmul_bias_act):
        with pytest.raises(TypeError, match="expects your launcher function"):
            check("matmul")


def test_recording_grids_runs_only_the_first_programs():
    x = torch.zeros(4 * broken.BLOCK_SIZE, device=runtime.DEVICE)
    with recording_grids(first_programs=2) as grids:
        out = broken._launch(broken.add_kernel, x, x + 1, out=torch.zeros_like(x))
    assert grids == [(4,)]
    assert out[: 2 * broken.BLOCK_SIZE].eq(1).all() and out[2 * broken.BLOCK_SIZE :].eq(0).all()


def test_the_epilogue_reference_refuses_an_unknown_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        references.activation(torch.ones(2), "gelu")


# --- lesson 06 ----------------------------------------------------------------------------

from course_lib.checks import conv2d as conv2d_checks  # noqa: E402

# the hints that name a mistake, by family: a report may show its own family's, no other
CONV2D_FAMILIES = {
    "padding": ["taps in the padding read", "NaN where the reference is finite",
                "a load of x or the weight reached outside it"],
    "flip": ["flips the filter"],
    "channels": ["channels past the last full channel tile", "no channel was summed",
                 "the last, partial step of the reduction"],
    "size": ["its size leaves out", "its size counts", "the output is [B, O, OH, OW]"],
    "stride": ["ignores the stride"],
    "dilation": ["ignores the dilation"],
    "strides": ["reads x as if it were NCHW-contiguous"],
    "out": ["stores into it as if it were NCHW-contiguous"],
    "hw": ["H and W are swapped", "rows and columns are mixed up in the window"],
    "oc": ["read as [C, O, kh, kw]"],
    "rs": ["rows and columns are swapped"],
    "x_channels": ["the x tile reads channels past C"],
    "matrix": ["stores the output as an [M, N] matrix"],
    "accumulator": ["accumulate in float32"],
    "dot": ["refuses a tl.dot whose inner side K is under 16"],
}  # fmt: skip
CONV2D_MISTAKES = [
    # broken launcher, a case it fails, the hint under that case, the families it may show
    (broken.conv2d_padding_not_masked, "odd image, padding 1", "mask the taps that fall into "
     "the padding: (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)", {"padding"}),
    (broken.conv2d_flipped_filter, "odd image, padding 1", "flips the filter", {"flip"}),
    (broken.conv2d_drops_last_channel_tile, "C and O past a tile",
     "with C = 37 and BLOCK_K = 16 or 32, your loop stops at channel 32", {"channels"}),
    (broken.conv2d_drops_last_channel_tile, "a single output pixel",
     "no channel was summed: C = 3", {"channels"}),
    (broken.conv2d_size_without_stride, "stride 2, padding (2, 1)",
     "its size leaves out the stride", {"size"}),
    (broken.conv2d_size_without_padding, "odd image, padding 1",
     "its size leaves out the padding", {"size"}),
    (broken.conv2d_size_without_dilation, "dilation 2", "its size leaves out the dilation",
     {"size"}),
    (broken.conv2d_window_without_stride, "stride 2, padding (2, 1)",
     "your kernel ignores the stride", {"stride"}),
    (broken.conv2d_window_without_dilation, "dilation 2", "your kernel ignores the dilation",
     {"dilation"}),
    (broken.conv2d_strides_ignored, "channels-last", "as if it were NCHW-contiguous",
     {"strides"}),
    (broken.conv2d_output_stored_as_nchw, "channels-last", "stores into it as if it were "
     "NCHW-contiguous", {"out"}),
    (broken.conv2d_x_hw_strides_swapped, "square image, C = O", "H and W are swapped",
     {"hw"}),
    (broken.conv2d_output_hw_swapped, "odd image, padding 1", "H and W are swapped", {"hw"}),
    (broken.conv2d_weight_oc_swapped, "square image, C = O", "read as [C, O, kh, kw]",
     {"oc"}),
    (broken.conv2d_weight_rs_swapped, "square image, C = O", "rows and columns are swapped",
     {"rs"}),
    (broken.conv2d_x_channels_not_masked, "C and O past a tile",
     "the x tile reads channels past C", {"x_channels"}),
    (broken.conv2d_x_channels_not_masked, "a single output pixel",
     "the x tile reads channels past C", {"x_channels"}),
    (broken.conv2d_output_stored_as_matrix, "odd image, padding 1",
     "stores the output as an [M, N] matrix", {"matrix"}),
    (broken.conv2d_output_stored_as_matrix, "C and O past a tile",
     "stores the output as an [M, N] matrix", {"matrix", "out"}),
]  # fmt: skip
if runtime.INTERPRETED:  # on a GPU the compile itself refuses the kernel
    CONV2D_MISTAKES.append((broken.conv2d_dot_tile_of_8, "odd image, padding 1",
                            "whose inner side K is under 16", {"dot"}))  # fmt: skip
CONV2D_BIAS_RELU_FAMILIES = {
    "missing": ["the bias is missing"],
    "pixel": ["the bias went along the pixels"],
    "first": ["the ReLU came before the bias"],
    "relu": ["the ReLU is missing"],
}
CONV2D_BIAS_RELU_MISTAKES = [
    (broken.conv2d_bias_relu_no_bias, "odd image, padding 1", "the bias is missing", "missing"),
    (broken.conv2d_bias_relu_bias_per_pixel, "C and O past a tile",
     "the bias went along the pixels", "pixel"),
    (broken.conv2d_bias_relu_bias_per_pixel, "odd image, padding 1",
     "the bias went along the pixels", "pixel"),
    (broken.conv2d_bias_relu_relu_first, "dilation 2", "the ReLU came before the bias", "first"),
    (broken.conv2d_bias_relu_no_relu, "channels-last", "the ReLU is missing", "relu"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "case", "hint", "family"),
    CONV2D_BIAS_RELU_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(CONV2D_BIAS_RELU_MISTAKES)],
)
def test_conv2d_bias_relu_check_names_the_mistake_and_no_other(fn, case, hint, family):
    report = _failure(course_lib.check_conv2d_bias_relu, fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, {family}, CONV2D_BIAS_RELU_FAMILIES | CONV2D_FAMILIES)


def test_conv2d_bias_relu_check_passes_a_right_kernel_at_the_notebooks_tiles(capsys):
    course_lib.check_conv2d_bias_relu(broken.conv2d_bias_relu)
    assert capsys.readouterr().out == "✓ conv2d_bias_relu: every case passed\n"


CONV2D_DIRECT_MISTAKES = [
    # the direct kernel, at the notebook's BLOCK_SIZE of 128
    (broken.conv2d_direct_columns_padded_as_rows, "stride 2, padding (2, 1)",
     "used padding[0] for the columns too", {"hw"}),
    (broken.conv2d_direct_columns_padded_as_rows, "1x3 kernel, stride (2, 1)",
     "used padding[0] for the columns too", {"hw"}),
    (broken.conv2d_direct_fp16_accumulator, "float16",
     "acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)", {"accumulator"}),
]  # fmt: skip


@functools.cache
def _conv2d_failure(fn) -> str:
    """The report of a failing conv2d check, run once for all the tests that read it."""
    return _failure(course_lib.check_conv2d, fn)


@pytest.mark.parametrize(
    ("fn", "case", "hint", "families"),
    CONV2D_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(CONV2D_MISTAKES)],
)
def test_conv2d_check_names_the_mistake_and_no_other(fn, case, hint, families):
    report = _conv2d_failure(fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, families, CONV2D_FAMILIES)


@pytest.mark.parametrize(
    ("fn", "case", "hint", "families"),
    CONV2D_DIRECT_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(CONV2D_DIRECT_MISTAKES)],
)
def test_conv2d_direct_check_names_the_mistake_and_no_other(fn, case, hint, families):
    report = _conv2d_direct_failure(fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, families, CONV2D_FAMILIES)


@functools.cache
def _conv2d_direct_failure(fn) -> str:
    return _failure(course_lib.check_conv2d_direct, fn)


def test_conv2d_direct_check_passes_a_right_kernel_at_the_notebooks_block(capsys):
    course_lib.check_conv2d_direct(broken.conv2d_direct)
    assert capsys.readouterr().out == "✓ conv2d_direct: every case passed\n"


def test_conv2d_check_passes_a_right_kernel_and_covers_the_awkward_cases(capsys):
    result = course_lib.check_conv2d(broken.conv2d)
    assert capsys.readouterr().out == "✓ conv2d: every case passed\n"
    labels = " | ".join(c.label for c in result.cases)
    for needed in ("1x1 kernel", "3, 3]", "5, 5]", "7, 7]", "stride=2", "padding=(2, 1)",
                   "dilation=2", "C and O past a tile", "a single output pixel",
                   "channels-last", "float16"):  # fmt: skip
        assert needed in labels, needed


def test_the_guides_one_output_kernel_is_exact_on_nchw_and_named_on_channels_last(monkeypatch):
    """One program per output, flat NCHW addresses: right until the memory is channels-last.
    In the interpreter a program per output is slow, so two cases stand for the rest."""
    if runtime.INTERPRETED:
        cases = conv2d_checks._cases
        monkeypatch.setattr(
            conv2d_checks, "_cases",
            lambda seed, direct: [c for c in cases(seed, direct)
                                  if c.label.startswith(("odd image", "channels-last"))],
        )  # fmt: skip
    with pytest.raises(CheckFailed) as info:
        course_lib.check_conv2d_direct(broken.conv2d_one_program_per_output)
    result = info.value.result
    failed = [c for c in result.cases if not c.passed]
    assert [c.label.split(":")[0] for c in failed] == ["channels-last"], result.report()
    assert "as if it were NCHW-contiguous" in failed[0].hint


def test_a_conv2d_shape_hint_names_the_formula():
    case = conv2d_checks._cases(62, direct=False)[4]  # stride 2, padding (2, 1), 5x5
    assert case.kwargs == {"stride": 2, "padding": (2, 1)}
    assert "leaves out" not in conv2d_checks._wrong_shape(case, [1, 2, 99, 99])
    assert course_lib.references.conv2d_output_size(12, 5, 2, 2, 1) == 6


# --- lesson 07 ----------------------------------------------------------------------------

from course_lib.checks import linear as linear_checks  # noqa: E402

# the hints that name a mistake, by family: a report may show its own family's, no other
LINEAR_FAMILIES = {
    "transpose": ["as if it were [in_features, out_features]"],
    "bias": ["the bias is missing", "the bias went along the wrong axis"],
    "order": ["the activation came before the bias"],
    "activation": ["where activation="],
    "leading": ["x has leading dimensions"],
    "float64": ["not to float64's precision"],
    "slope": ["the activation's derivative is missing"],
    "saved": ["derivative was taken at the output", "multiplies by the layer's input x"],
    "grad_x": ["grad_x = gz @ weight"],
    "grad_weight": ["grad_weight came out transposed"],
    "grad_bias": ["grad_bias was summed along the wrong axis"],
    "shape": ["has the wrong shape"],
    "function": ["the result carries no gradient"],
    "count": ["one value per argument of forward"],
    "missing": ["backward must return a gradient"],
    "view": ["has no view of the shape"],
    "z": ["the z you returned"],
    "no_z": ["returns a pair (y, z)"],
    "z_shape": ["z must have y's shape"],
    "save_order": ["saved the tensors in another order"],
    "needs": ["ctx.needs_input_grad asks", "forward saved x, which only", "rightly did not save"],
    "torch_product": ["computed a product with PyTorch"],
    "dot": ["whose inner side K is under 16"],
}
SQUARE = "weight [48, 48]"
LINEAR_MISTAKES = [
    # broken layer, a case it fails, the hint under that case, the families it may show
    (broken.linear_forward_weight_not_transposed, "(square weight)",
     "as if it were [in_features, out_features]", {"transpose"}),
    (broken.linear_forward_weight_not_transposed, "(in > out)",
     "as if it were [in_features, out_features]", {"transpose"}),
    (broken.linear_forward_bias_per_row, "(in > out)", "the bias went along the wrong axis",
     {"bias"}),
    (broken.linear_forward_without_bias, "(out > in)", "the bias is missing", {"bias"}),
    (broken.linear_forward_activation_first, "(out > in)", "the activation came before",
     {"order"}),
    (broken.linear_forward_relu_for_gelu, "(square weight)",
     "you applied relu where activation='gelu'", {"activation"}),
    (broken.linear_forward_rows_of_first_dim, "(leading dimensions [2, 5])",
     "x has leading dimensions", {"leading"}),
    (broken.linear_forward_not_reshaped, "(leading dimensions [2, 5])",
     "x has leading dimensions", {"leading"}),
    (broken.linear_autograd_without_slope, f"{SQUARE} (square: M = in = out), "
     "activation='gelu', float32: grad_bias", "the activation's derivative is missing",
     {"slope"}),
    (broken.linear_autograd_slope_at_output, "activation='gelu', float32: grad_x",
     "derivative was taken at the output", {"saved"}),
    (broken.linear_autograd_grad_x_transposed, f"{SQUARE} (square: M = in = out), "
     "activation='gelu', float32: grad_x", "grad_x = gz @ weight", {"grad_x"}),
    (broken.linear_autograd_grad_x_transposed, "column-major), activation=None, float32: grad_x",
     "grad_x = gz @ weight", {"grad_x"}),
    (broken.linear_autograd_grad_weight_transposed, f"{SQUARE} (square: M = in = out), "
     "activation='gelu', float32: grad_weight", "grad_weight came out transposed",
     {"grad_weight"}),
    (broken.linear_autograd_grad_weight_transposed, "column-major), activation=None, float32: "
     "grad_weight", "grad_weight came out transposed", {"grad_weight"}),
    (broken.linear_autograd_grad_weight_from_y, f"{SQUARE} (square: M = in = out), "
     "activation='gelu', float32: grad_weight", "multiplies by the layer's input x",
     {"saved"}),
    (broken.linear_autograd_rows_of_first_dim, "grad_output transposed), "
     "activation='relu', float32: grad_bias", "x has leading dimensions", {"leading"}),
    (broken.linear_autograd_bias_wrong_axis, "column-major), activation=None, float32: grad_bias",
     "grad_bias was summed along the wrong axis", {"grad_bias"}),
    (broken.linear_autograd_no_bias_gradient, "float32: grad_bias",
     "backward must return a gradient", {"missing"}),
    (broken.linear_forward_views_x, "(leading dimensions of a transposed x)",
     "has no view of the shape", {"view"}),
    (broken.linear_autograd_views_grad, "grad_output transposed), activation='relu', float32: "
     "grad_x", "has no view of the shape", {"view"}),
    (broken.linear_autograd_three_gradients, "float32: grad_x",
     "one value per argument of forward", {"count"}),
    (broken.linear_autograd_without_function, "float32: grad_weight",
     "the result carries no gradient", {"function"}),
]  # fmt: skip
Z = "the z of save_z=True"
LINEAR_MISTAKES += [
    (broken.linear_forward_z_after_activation, f"activation='gelu', float32: {Z}",
     "the z you returned holds the activation's output", {"z"}),
    (broken.linear_forward_z_after_activation, f"activation='relu', float32: {Z}",
     "the z you returned holds the activation's output", {"z"}),
    (broken.linear_forward_ignores_save_z, f"activation='relu', float32: {Z}",
     "returns a pair (y, z)", {"no_z"}),
    (broken.linear_forward_z_flat, f"(leading dimensions [2, 5]), activation='gelu', float32: {Z}",
     "z must have y's shape", {"z_shape"}),
    (broken.linear_autograd_ignores_needs_input_grad, "float32: grad_x, weight and bias frozen",
     "forward saved x, which only", {"needs"}),
    (broken.linear_autograd_computes_every_gradient, "float32: grad_x, weight and bias frozen",
     "rightly did not save", {"needs"}),
    (broken.linear_autograd_saved_out_of_order, "float32: grad_weight",
     "saved the tensors in another order", {"save_order"}),
    (broken.linear_autograd_torch_grad_weight, "float32: grad_x",
     "computed a product with PyTorch (mm)", {"torch_product"}),
]  # fmt: skip
if runtime.INTERPRETED:  # on a GPU the compile itself refuses the kernel
    LINEAR_MISTAKES.append((broken.linear_forward_dot_tile_of_8, "(in > out)",
                            "whose inner side K is under 16", {"dot"}))  # fmt: skip
if runtime.INTERPRETED:  # a GPU compile refuses a float32 accumulator for float64 tiles,
    # and so does the check in the interpreter, with the compiler's reason
    LINEAR_MISTAKES.append((broken.linear_forward_fp32_accumulator, "float64",
                            "a GPU compile refuses your kernel", set()))  # fmt: skip


PRODUCT_FAMILIES = {
    "a": ["A's strides are swapped"],
    "b": ["B's strides are swapped"],
    "grid": ["the grid misses"],
    "k": ["Mask the K dimension", "advance the pointers"],
}
PRODUCT_MISTAKES = [
    # lesson 07's product(a, b), checked by lesson 05's check_matmul at the notebook's tiles
    (broken.product_b_strides_swapped, "(B square, one K step)", "B's strides are swapped", "b"),
    (broken.product_a_strides_swapped, "(square)", "A's strides are swapped", "a"),
    (broken.product_grid_floor, "(primes)", "the grid misses", "grid"),
]


@pytest.mark.parametrize(
    ("fn", "case", "hint", "family"),
    PRODUCT_MISTAKES,
    ids=[m[0].__name__ for m in PRODUCT_MISTAKES],
)
def test_the_product_exercise_is_checked_by_the_matmul_check(fn, case, hint, family):
    report = _failure(course_lib.check_matmul, fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, {family}, PRODUCT_FAMILIES)


def test_a_right_product_at_the_notebooks_tiles_passes_the_matmul_check(capsys):
    course_lib.check_matmul(broken.product)
    assert capsys.readouterr().out == "✓ matmul: every case passed\n"


@functools.cache
def _linear_failure(fn) -> str:
    """The report of a failing Linear check, run once for all the tests that read it."""
    check = (
        course_lib.check_linear if "autograd" in fn.__name__ else course_lib.check_linear_forward
    )
    return _failure(check, fn)


@pytest.mark.parametrize(
    ("fn", "case", "hint", "families"),
    LINEAR_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(LINEAR_MISTAKES)],
)
def test_linear_checks_name_the_mistake_and_no_other(fn, case, hint, families):
    report = _linear_failure(fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, families, LINEAR_FAMILIES)


def test_linear_checks_cover_the_awkward_cases():
    forward = [c.label for c in linear_checks._forward_cases(17)]
    autograd = [c.label for _, c in linear_checks._autograd_cases(19)]
    for labels in (forward, autograd):
        joined = " | ".join(labels)
        for needed in ("leading dimensions", "bias=None", "'relu'", "'gelu'", "None",
                       "float16", "float64"):  # fmt: skip
            assert needed in joined, needed
    assert any("x a transposed view" in label for label in forward)
    parts = {label.rsplit(": ", 1)[1] for label in autograd}
    assert parts == {"y", "grad_x", "grad_weight", "grad_bias", "grad_x, weight and bias frozen"}
    assert any("grad_output column-major" in label for label in autograd)
    assert any("weight a transposed view" in label for label in forward)


def test_the_linear_check_sends_a_random_output_gradient():
    """A test by y.sum().backward() sends ones: a forward that adds a constant to
    every output would still get right gradients. The check's are random."""
    for _, case in linear_checks._autograd_cases(19):
        grad_output = case.inputs[-1]
        assert grad_output.std() > 0.5 and not torch.all(grad_output == grad_output.flatten()[0])


def test_the_right_learner_layers_pass_both_linear_checks():
    course_lib.check_linear_forward(broken.linear_forward)
    course_lib.check_linear(broken.linear_autograd)
