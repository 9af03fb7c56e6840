"""The grader runs submissions and scores their check cells, without writing to them."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib import grader

EXERCISE = {
    "nbgrader": {
        "grade": False,
        "grade_id": "ex-f",
        "locked": False,
        "schema_version": 3,
        "solution": True,
        "task": False,
    }
}
CHECK = {
    "nbgrader": {
        "grade": True,
        "grade_id": "check-f",
        "locked": True,
        "points": 2,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
}


def _notebook(answer: str, check: str = "assert f() == 1, 'f() should return 1'"):
    return new_notebook(
        cells=[new_code_cell(answer, metadata=EXERCISE), new_code_cell(check, metadata=CHECK)],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )


@pytest.fixture
def shipped(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nbformat.write(
        _notebook("def f():\n    raise NotImplementedError('ex-f')"), folder / "01_f.ipynb"
    )
    return folder


@pytest.mark.parametrize(
    ("answer", "check", "earned", "reason"),
    [
        ("def f():\n    return 1", None, 2, "passed"),
        ("def f():\n    raise NotImplementedError('ex-f')", None, 0, "NotImplementedError: ex-f"),
        ("def f():\n    return 2", None, 0, "AssertionError: f() should return 1"),
        ("def f():\n    return 2", "pass", 0, "check cell was edited"),
    ],
    ids=["solved", "unsolved", "wrong", "edited-check"],
)
def test_grade(tmp_path, shipped, answer, check, earned, reason):
    path = tmp_path / "01_f.ipynb"
    nb = _notebook(answer) if check is None else _notebook(answer, check)
    nbformat.write(nb, path)
    before = path.read_bytes()
    [cell] = grader.grade(path, timeout=60, shipped_dir=shipped)
    assert (cell.grade_id, cell.earned, cell.points, cell.reason) == ("check-f", earned, 2, reason)
    assert path.read_bytes() == before


def test_unknown_lesson_is_reported(tmp_path, shipped):
    path = tmp_path / "99_other.ipynb"
    nbformat.write(_notebook("x = 1"), path)
    with pytest.raises(FileNotFoundError, match="keep the lesson's file name"):
        grader.grade(path, shipped_dir=shipped)


def test_csv_is_never_overwritten(tmp_path, capsys):
    existing = tmp_path / "grades.csv"
    existing.write_text("mine")
    assert grader.main([str(tmp_path / "a.ipynb"), "--csv", str(existing)]) == 2
    assert existing.read_text() == "mine"
    assert "exists" in capsys.readouterr().err


def test_a_broken_submission_does_not_stop_the_batch(tmp_path, capsys, monkeypatch):
    good = tmp_path / "01_f.ipynb"
    nbformat.write(_notebook("def f():\n    return 1"), good)
    bad = tmp_path / "02_missing.ipynb"
    nbformat.write(_notebook("x = 1"), bad)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    nbformat.write(_notebook("def f():\n    raise NotImplementedError"), shipped / "01_f.ipynb")
    monkeypatch.setattr(grader, "NOTEBOOKS", shipped)
    monkeypatch.setattr(grader.grade, "__defaults__", (60, shipped))
    out_csv = tmp_path / "grades.csv"
    assert grader.main([str(bad), str(good), "--csv", str(out_csv)]) == 0
    rows = out_csv.read_text().splitlines()
    assert rows[1].startswith(f"{bad},,0,,not graded: FileNotFoundError")
    assert rows[2] == f"{good},check-f,2.0,2.0,passed"
