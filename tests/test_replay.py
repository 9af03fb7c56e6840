"""A check split across processes judges recorded outputs as the check itself would."""

import inspect

import broken_kernels as broken
import pytest
import torch
from test_checks import FINISHED  # every finished kernel with its check

import course_lib
from course_lib.checks import CheckFailed, replay
from course_lib.checks.engine import NOT_RECORDED, grading_seed
from course_lib.kernels import add_2d, matmul, relu, softmax, vector_add


def _result(check, fn):
    try:
        return check(fn)
    except CheckFailed as failure:
        return failure.result


def _stand_in(fn):
    def learners_function(*args, **kwargs):
        raise AssertionError("a replay must call nothing of the learner's")

    learners_function.__signature__ = inspect.signature(fn)
    return learners_function


def _record_then_replay(check, fn):
    with replay.recording() as recorder:
        original = _result(check, fn)
    with replay.replaying(recorder.records):
        replayed = _result(check, _stand_in(fn))
    return original, replayed, recorder.records


PAIRS = [
    (course_lib.check_vector_add, vector_add.add),
    (course_lib.check_vector_add, broken.add_grid_floor),
    (course_lib.check_vector_add, broken.add_without_load_mask),
    (course_lib.check_relu, relu.relu),
    (course_lib.check_add_2d, add_2d.add_2d),
    (course_lib.check_add_2d, broken.add_2d_grid_floor),
    (course_lib.check_softmax, softmax.softmax),
    (course_lib.check_softmax, broken.softmax_zero_padding),
    (course_lib.check_matmul, matmul.matmul),
    (course_lib.check_axpy, broken.axpy_alpha_on_y),
    (course_lib.check_transpose, broken.transpose_grid_floor),
    (course_lib.check_softmax_persistent, broken.softmax_persistent_no_loop),
    # the order is judged from the first programs' launches, which only the learner's
    # process sees: its findings carry over
    (course_lib.check_matmul_grouped, broken.matmul_grouped_row_major),
    (course_lib.check_leaky_relu, broken.leaky_relu_nan_to_zero),
]


@pytest.mark.parametrize(
    ("check", "fn"), PAIRS, ids=[f"{c.__name__}-{f.__name__}" for c, f in PAIRS]
)
def test_a_replayed_check_passes_and_fails_the_same_cases(check, fn):
    original, replayed, _ = _record_then_replay(check, fn)
    assert [c.passed for c in replayed.cases] == [c.passed for c in original.cases]
    assert replayed.passed == original.passed


def test_a_replay_recognises_the_mistake_from_the_data_alone():
    _, replayed, _ = _record_then_replay(course_lib.check_vector_add, broken.add_grid_floor)
    assert "the grid has no programs" in replayed.report()


def test_records_are_plain_data_that_torch_loads_without_running_code(tmp_path):
    _, _, records = _record_then_replay(course_lib.check_vector_add, broken.add_grid_floor)
    torch.save(records, tmp_path / "records.pt")
    loaded = torch.load(tmp_path / "records.pt", weights_only=True)
    assert [r["label"] for r in loaded] == [r["label"] for r in records]


def test_tampered_records_cannot_pass_a_wrong_result():
    _, _, records = _record_then_replay(course_lib.check_vector_add, broken.add_wrong_op)
    for record in records:  # claim every case was fine
        record.update(problems=[], hint=None)
    with replay.replaying(records):
        assert not _result(course_lib.check_vector_add, _stand_in(vector_add.add)).passed
    with replay.replaying(records[:2]):  # drop the failing cases
        result = _result(course_lib.check_vector_add, _stand_in(vector_add.add))
    assert NOT_RECORDED in result.report()


def test_a_record_too_large_or_of_the_wrong_type_is_refused():
    _, _, records = _record_then_replay(course_lib.check_vector_add, vector_add.add)
    records[0]["output"] = torch.zeros(10**6)
    records[1]["output"] = "not a tensor"
    with replay.replaying(records):
        result = _result(course_lib.check_vector_add, _stand_in(vector_add.add))
    assert "unusable" in result.cases[0].problems[0]
    assert "unusable" in result.cases[1].problems[0]
    assert all(c.passed for c in result.cases[2:])


def test_the_learners_own_findings_fail_a_case_the_replay_passed():
    _, _, records = _record_then_replay(course_lib.check_vector_add, vector_add.add)
    records[0].update(problems=["3 elements past the end were written"], hint="mask it")
    with replay.replaying(records):
        result = _result(course_lib.check_vector_add, _stand_in(vector_add.add))
    assert result.cases[0].problems == ["3 elements past the end were written"]
    assert all(c.passed for c in result.cases[1:])


@pytest.mark.parametrize(("check", "fn"), FINISHED, ids=[f.__name__ for _, f in FINISHED])
def test_a_grading_seed_draws_other_values_that_a_right_kernel_passes(check, fn):
    with replay.recording() as plain:
        check(fn)
    with replay.recording() as graded, grading_seed(12345):
        check(fn)
    assert [r["label"] for r in plain.records] == [r["label"] for r in graded.records]
    assert not torch.equal(plain.records[-1]["output"], graded.records[-1]["output"])
    with replay.recording() as again, grading_seed(12345):
        check(fn)
    for a, b in zip(graded.records, again.records):  # the same seed, the same values
        assert torch.isclose(a["output"], b["output"], rtol=0, atol=0, equal_nan=True).all()
