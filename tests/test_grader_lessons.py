"""The grader grades lessons 06-08's exercises, through its command line only: the solved
lessons score every point, and a mistake costs its own exercise alone."""

import csv
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_lib import builder

LESSONS = ("06_conv2d", "07_linear", "08_torch_compile")
NEW_EXERCISES = {  # grade_id: points
    "check-conv2d-bias-relu": 2.0,
    "check-product": 2.0,
    "check-softmax-backward": 3.0,
    "check-add-into": 2.0,
}


def _with_answer(lesson: str, grade_id: str, old: str, new: str):
    """The solved lesson with one answer cell changed, as a learner might get it wrong."""
    nb = nbformat.read(builder.SOLUTIONS / f"{lesson}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    assert old in cell.source
    cell.source = cell.source.replace(old, new)
    return nb


@pytest.fixture(scope="module")
def grades(tmp_path_factory) -> dict[tuple[str, str], dict]:
    root = tmp_path_factory.mktemp("lessons")
    subs = root / "submitted"
    (subs / "solved").mkdir(parents=True)
    for lesson in LESSONS:
        shutil.copy(builder.SOLUTIONS / f"{lesson}.ipynb", subs / "solved")
    (subs / "mistaken").mkdir()
    undeclared = _with_answer(
        "08_torch_compile", "ex-add-into", 'mutates_args=("out",)', "mutates_args=()"
    )
    nbformat.write(undeclared, subs / "mistaken" / "08_torch_compile.ipynb")
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.grader", str(subs), "--out", str(root / "results")],
        cwd=root, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (root / "results" / "grades.csv").open(newline="") as f:
        rows = {(r["student_id"], r["grade_id"]): r for r in csv.DictReader(f)}
    rows["feedback"] = (root / "results" / "feedback" / "mistaken.md").read_text()
    return rows


@pytest.mark.notebooks
def test_the_solved_lessons_score_every_point_of_the_new_exercises(grades):
    for grade_id, points in NEW_EXERCISES.items():
        row = grades[("solved", grade_id)]
        assert float(row["score"]) == float(row["max_score"]) == points, row


@pytest.mark.notebooks
def test_every_exercise_of_the_solved_lessons_scores_full_marks(grades):
    rows = [r for key, r in grades.items() if key[0] == "solved"]
    assert len(rows) >= 9  # three exercises in each of 06, 07 and 08
    assert all(float(r["score"]) == float(r["max_score"]) for r in rows), rows


@pytest.mark.notebooks
def test_an_undeclared_write_costs_its_exercise_and_names_the_fix(grades):
    row = grades[("mistaken", "check-add-into")]
    assert float(row["score"]) == 0, row
    others = [r for key, r in grades.items() if key[0] == "mistaken" and key[1] != "check-add-into"]
    assert others and all(float(r["score"]) == float(r["max_score"]) for r in others), others


@pytest.mark.notebooks
def test_the_feedback_names_the_undeclared_write(grades):
    assert 'declare it with mutates_args=("out",)' in grades["feedback"]
