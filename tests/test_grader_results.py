"""The grader's results on disk: CSV rows that survive a crash and open safely, feedback
files that stay inside the results directory, a summary that tells the instructor all."""

import csv

import pytest

from course_lib.grader import results as results_module
from course_lib.grader.results import (
    CSV_HEADER,
    TRUNCATION_MARKER,
    ExerciseGrade,
    ResultsWriter,
    safe_text,
)


def _grade(student="alice", assignment="01_vector_add", grade_id="check-vector-add", **kw):
    fields = dict(score=2, max_score=2, status="passed", reason="all cases passed")
    fields.update(kw)
    return ExerciseGrade(student, assignment, grade_id, **fields)


def _rows(out_dir):
    with (out_dir / "grades.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _feedback_files(out_dir):
    return sorted(p.name for p in (out_dir / "feedback").iterdir())


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "results"


# -- the results directory -------------------------------------------------------------------


def test_refuses_a_directory_that_holds_files(tmp_path):
    (tmp_path / "old.csv").write_text("keep me")
    with pytest.raises(FileExistsError, match="never overwritten.*new directory"):
        ResultsWriter(tmp_path)
    assert (tmp_path / "old.csv").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"]


def test_refuses_a_file_and_accepts_an_empty_directory(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        ResultsWriter(tmp_path / "a_file")
    empty = tmp_path / "empty"
    empty.mkdir()
    with ResultsWriter(empty):
        pass
    assert (empty / "grades.csv").read_text().splitlines() == [",".join(CSV_HEADER)]


def test_creates_missing_parents(tmp_path):
    with ResultsWriter(tmp_path / "a" / "b") as results:
        results.finish()
    assert (tmp_path / "a" / "b" / "summary.md").is_file()


# -- grades.csv --------------------------------------------------------------------------


def test_header_and_one_row_per_grade(out_dir):
    grades = [
        _grade(flags=("edited a check cell", "ran 800 s")),
        _grade(grade_id="check-relu", score=0, max_score=3, status="failed", reason="bad"),
    ]
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", grades)
    header = (out_dir / "grades.csv").read_text(encoding="utf-8").splitlines()[0]
    assert header == "student_id,assignment,grade_id,score,max_score,status,reason,flags"
    assert _rows(out_dir) == [
        {
            "student_id": "alice",
            "assignment": "01_vector_add",
            "grade_id": "check-vector-add",
            "score": "2",
            "max_score": "2",
            "status": "passed",
            "reason": "all cases passed",
            "flags": "edited a check cell; ran 800 s",
        },
        {
            "student_id": "alice",
            "assignment": "01_vector_add",
            "grade_id": "check-relu",
            "score": "0",
            "max_score": "3",
            "status": "failed",
            "reason": "bad",
            "flags": "",
        },
    ]


def test_rows_are_on_disk_when_add_returns(out_dir):
    results = ResultsWriter(out_dir)
    results.add("alice", "01_vector_add", [_grade()])
    # read through a separate handle, before finish() or close(): as after a crash
    assert [r["student_id"] for r in _rows(out_dir)] == ["alice"]
    results.add("bob", "01_vector_add", [_grade("bob", score=1)])
    assert [(r["student_id"], r["score"]) for r in _rows(out_dir)] == [("alice", "2"), ("bob", "1")]
    results.close()


def test_add_syncs_the_csv_to_disk(out_dir, monkeypatch):
    synced = []
    monkeypatch.setattr(results_module.os, "fsync", synced.append)
    results = ResultsWriter(out_dir)
    synced.clear()  # the header's sync
    results.add("alice", "01_vector_add", [_grade()])
    assert synced == [results._csv_file.fileno()]
    results.close()


def test_csv_injection_is_neutralised(out_dir):
    grades = [
        _grade(
            "+cmd",
            grade_id="@SUM(1)",
            status="failed",
            score=0,
            reason='=HYPERLINK("http://x")',
            flags=("-2+3",),
        )
    ]
    with ResultsWriter(out_dir) as results:
        results.add("+cmd", "01_vector_add", grades)
    (row,) = _rows(out_dir)
    assert row["reason"] == '\'=HYPERLINK("http://x")'
    assert row["student_id"] == "'+cmd"
    assert row["grade_id"] == "'@SUM(1)"
    assert row["flags"] == "'-2+3"
    assert row["assignment"] == "01_vector_add"  # harmless text is left as it is


def test_leading_tab_or_carriage_return_cannot_start_a_formula(out_dir):
    grades = [_grade(reason="\t=1+1"), _grade(grade_id="x", reason="\r=1+1")]
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", grades)
    assert [r["reason"] for r in _rows(out_dir)] == ["'=1+1", "'=1+1"]


def test_scores_stay_plain_numbers(out_dir):
    grades = [
        _grade(score=0.5, max_score=1),
        _grade(grade_id="penalty", score=-1.5, max_score=2),
        _grade(grade_id="big", score=1e-20, max_score=3.0),
    ]
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", grades)
    rows = _rows(out_dir)
    assert [(r["score"], r["max_score"]) for r in rows] == [
        ("0.5", "1"),
        ("-1.5", "2"),  # a negative number is not a formula: no quote
        ("1e-20", "3"),
    ]
    assert [float(r["score"]) for r in rows] == [0.5, -1.5, 1e-20]


def test_reason_is_one_line_of_at_most_300_characters(out_dir):
    long_reason = "case 1 failed\ncase 2 failed\r\n" + "x" * 1000
    grades = [_grade(reason=long_reason), _grade(grade_id="q", reason="=" + "y" * 1000)]
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", grades)
    first, second = (r["reason"] for r in _rows(out_dir))
    assert first.startswith("case 1 failed case 2 failed xxx")
    assert first.endswith(TRUNCATION_MARKER) and len(first) == 300
    assert second.startswith("'=yyy") and len(second) == 300  # the quote fits in the 300


# -- safe_text ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("bell\x07", "bell"),
        ("\x1b]0;title\x07after", "after"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1b[2J\x1b[Hclear", "clear"),
        ("nul\x00 del\x7f c1\x9b", "nul del c1"),
        ("keep\nnew\tlines", "keep\nnew\tlines"),
        ("bar 10%\rbar 100%", "bar 10%\nbar 100%"),
        ("naïve ✓ 李", "naïve ✓ 李"),
    ],
    ids=[
        "colour",
        "bell",
        "window-title",
        "hyperlink",
        "clear-screen",
        "c0-c1",
        "keep",
        "cr",
        "unicode",
    ],
)
def test_safe_text_removes_escapes_and_control_characters(raw, clean):
    assert safe_text(raw) == clean


def test_safe_text_truncates_within_the_limit():
    assert safe_text("a" * 50, limit=50) == "a" * 50
    cut = safe_text("a" * 51, limit=50)
    assert cut == "a" * (50 - len(TRUNCATION_MARKER)) + TRUNCATION_MARKER
    assert len(cut) == 50
    # the escapes go first, so they do not use up the limit
    assert safe_text("\x1b[31m" * 100 + "ok", limit=20) == "ok"


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: safe_text(None), TypeError),
        (lambda: safe_text(b"bytes"), TypeError),
        (lambda: safe_text("x", limit=5), ValueError),
        (lambda: safe_text("x", limit="9"), ValueError),
    ],
    ids=["none", "bytes", "limit-too-small", "limit-str"],
)
def test_safe_text_rejects_bad_input(call, error):
    with pytest.raises(error, match="safe_text"):
        call()


def test_escapes_reach_no_output(out_dir):
    hostile = "\x1b[31mred\x1b[0m\x07\x1b]0;title\x07"
    grades = [_grade(hostile, reason=hostile, report=hostile, flags=(hostile,))]
    with ResultsWriter(out_dir) as results:
        results.add(hostile, "01_vector_add", grades)
        summary = results.finish(not_graded=[hostile])
    texts = {
        "csv": (out_dir / "grades.csv").read_text(encoding="utf-8"),
        "summary": summary,
        "summary.md": (out_dir / "summary.md").read_text(encoding="utf-8"),
    }
    assert _feedback_files(out_dir) == ["red.md"]
    texts["feedback"] = (out_dir / "feedback" / "red.md").read_text(encoding="utf-8")
    for name, text in texts.items():
        assert "\x1b" not in text and "\x07" not in text and "title" not in text, name
        assert "red" in text, name
    assert _rows(out_dir)[0]["reason"] == "red"


# -- feedback files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "student_id, expected",
    [
        ("alice", "alice.md"),
        ("../x", "_x.md"),
        ("/etc/passwd", "_etc_passwd.md"),
        ("a/b", "a_b.md"),
        ("..", "learner.md"),
        ("", "learner.md"),
        ("José Núñez", "Jose_Nunez.md"),
        ("a\\b:c", "a_b_c.md"),
        ("x" * 300, "x" * 100 + ".md"),
    ],
    ids=["plain", "parent", "absolute", "slash", "dotdot", "empty", "accents", "windows", "long"],
)
def test_learner_names_become_safe_file_names(tmp_path, student_id, expected):
    out_dir = tmp_path / "results"
    with ResultsWriter(out_dir) as results:
        results.add(student_id, "01_vector_add", [_grade(student_id)])
    assert _feedback_files(out_dir) == [expected]
    # nothing was written anywhere but the results directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["feedback", "grades.csv", "summary.md"]


def test_names_that_clash_get_numbered_files(out_dir):
    ids = ["../x", "_x", "/x", "_X", "..", "", "x" * 300, "x" * 301]
    with ResultsWriter(out_dir) as results:
        for student in ids:
            results.add(student, "01_vector_add", [_grade(student, reason=f"for {student!r}")])
        summary = results.finish()
    assert _feedback_files(out_dir) == sorted(
        ["_x.md", "_x-2.md", "_x-3.md", "_X-4.md", "learner.md", "learner-2.md"]
        + ["x" * 100 + ".md", "x" * 98 + "-2.md"]
    )
    # each learner's file holds that learner's own grade
    assert "for '/x'" in (out_dir / "feedback" / "_x-3.md").read_text(encoding="utf-8")
    assert "for ''" in (out_dir / "feedback" / "learner-2.md").read_text(encoding="utf-8")
    assert "8 learners graded." in summary
    assert "feedback/\\_x-3.md" not in summary and "feedback/_x-3.md" in summary


def test_feedback_shows_scores_reasons_and_report_but_not_flags(out_dir):
    grades = [
        _grade(report="✓ vector_add: 6 of 6 cases passed", flags=("SECRET-FLAG",)),
        _grade(
            grade_id="check-relu",
            score=0,
            max_score=3,
            status="failed",
            reason="2 of 5 cases failed",
            report="✗ relu: 3 of 5\n  n=7: 7 elements wrong\n    hint: keep NaN",
        ),
    ]
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", grades)
    text = (out_dir / "feedback" / "alice.md").read_text(encoding="utf-8")
    assert text.startswith("# 01\\_vector\\_add: feedback for alice\n")
    assert "**Total: 2 / 5**" in text
    assert "## check-vector-add: 2 / 2 (passed)" in text
    assert "## check-relu: 0 / 3 (failed)\n\n2 of 5 cases failed\n" in text
    assert "```\n✗ relu: 3 of 5\n  n=7: 7 elements wrong\n    hint: keep NaN\n```" in text
    assert "SECRET-FLAG" not in text


def test_a_report_cannot_break_out_of_its_fence(out_dir):
    report = "before\n```\n# Heading from the learner\n``````\n<script>x</script>"
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", [_grade(report=report)])
    text = (out_dir / "feedback" / "alice.md").read_text(encoding="utf-8")
    fence = "`" * 7  # longer than the longest run (6) in the report
    assert f"{fence}\n{report}\n{fence}\n" in text
    # a closing fence is at least as long as the opening one: only the last line closes it
    lines = text.splitlines()
    opening = lines.index(fence)
    closing = [i for i, line in enumerate(lines) if line.startswith(fence)]
    assert closing == [opening, opening + len(report.splitlines()) + 1]


def test_markdown_from_a_learner_is_shown_literally(out_dir):
    reason = "[click](http://evil) <img src=x> | **bold**"
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", [_grade(reason=reason, flags=(reason,))])
        summary = results.finish()
    feedback = (out_dir / "feedback" / "alice.md").read_text(encoding="utf-8")
    escaped = r"\[click\](http://evil) \<img src=x\> \| \*\*bold\*\*"
    assert escaped in feedback
    assert f"| alice | check-vector-add | {escaped} |" in summary


def test_two_notebooks_of_one_learner_share_a_feedback_file(out_dir):
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", [_grade(reason="first notebook")])
        results.add(
            "alice", "02_relu", [_grade(assignment="02_relu", grade_id="check-relu", score=1)]
        )
        summary = results.finish()
    assert _feedback_files(out_dir) == ["alice.md"]
    text = (out_dir / "feedback" / "alice.md").read_text(encoding="utf-8")
    first = text.index("# 01\\_vector\\_add: feedback for alice")
    second = text.index("# 02\\_relu: feedback for alice")
    assert first < text.index("first notebook") < second
    assert "## check-relu: 1 / 2 (passed)" in text[second:]
    assert "1 learner graded." in summary


# -- the summary -------------------------------------------------------------------------


def _graded_class(out_dir, not_graded=()):
    with ResultsWriter(out_dir) as results:
        results.add(
            "alice",
            "01_vector_add",
            [_grade(), _grade(grade_id="check-b", score=1, max_score=1)],
        )
        results.add(
            "bob",
            "01_vector_add",
            [
                _grade("bob", score=0, status="failed", flags=("check cell was edited",)),
                _grade("bob", grade_id="check-b", score=0, max_score=1, status="not graded"),
            ],
        )
        results.add(
            "bob",
            "02_relu",
            [_grade("bob", "02_relu", "check-relu", score=1, max_score=4, status="failed")],
        )
        return results.finish(not_graded=not_graded)


def test_summary_counts_scores_and_statuses(out_dir):
    summary = _graded_class(out_dir)
    assert (out_dir / "summary.md").read_text(encoding="utf-8") == summary
    assert "2 learners graded." in summary
    # 01: alice 3, bob 0 -> mean 1.5, highest 3 of 3; 02: bob 1 of 4
    assert "| 01\\_vector\\_add | 2 | 1.5 | 3 | 3 | 2 | 1 | 1 |" in summary
    assert "| 02\\_relu | 1 | 1 | 1 | 4 | 0 | 1 | 0 |" in summary
    assert "- passed: 2\n- failed: 2\n- not graded: 1\n" in summary


def test_summary_lists_flags_and_submissions_not_graded(out_dir):
    summary = _graded_class(out_dir, not_graded=["carol/01_vector_add.ipynb", "dave.ipynb"])
    assert "| bob | check-vector-add | check cell was edited |" in summary
    assert "2 submissions were not graded: " in summary
    assert "so they have no rows in grades.csv" in summary
    assert "- carol/01\\_vector\\_add.ipynb\n- dave.ipynb\n" in summary


def test_summary_says_when_nothing_was_flagged_or_left_out(out_dir):
    with ResultsWriter(out_dir) as results:
        results.add("alice", "01_vector_add", [_grade()])
        summary = results.finish()
    assert "Nothing was flagged." in summary
    assert "Every submission given was graded." in summary
    assert "were not graded" not in summary and "was not graded" not in summary


def test_scores_png_is_a_histogram_image(out_dir):
    summary = _graded_class(out_dir)
    png = (out_dir / "scores.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert "![Histogram of learners' total scores](scores.png)" in summary


def test_zero_learners(out_dir):
    with ResultsWriter(out_dir) as results:
        summary = results.finish(not_graded=["alice.ipynb"])
    assert "0 learners graded." in summary
    assert "no histogram" in summary
    assert "1 submission was not graded: " in summary
    assert "so it has no rows in grades.csv" in summary
    assert not (out_dir / "scores.png").exists()
    assert _rows(out_dir) == []
    assert _feedback_files(out_dir) == []


# -- misuse gets a clear error -----------------------------------------------------------


def test_bad_grades_are_refused_before_anything_is_written(out_dir):
    with ResultsWriter(out_dir) as results:
        with pytest.raises(ValueError, match="add each notebook's grades"):
            results.add("alice", "01_vector_add", [_grade(), _grade("bob")])
        with pytest.raises(TypeError, match="list of ExerciseGrade"):
            results.add("alice", "01_vector_add", _grade())
    assert _rows(out_dir) == []
    assert _feedback_files(out_dir) == []


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(status="pass"), ValueError, "use one of passed, failed, not graded"),
        (dict(score=float("nan")), ValueError, "finite"),
        (dict(score="2"), TypeError, "must be a number"),
        (dict(score=True), TypeError, "must be a number"),
        (dict(max_score=-1), ValueError, ">= 0"),
        (dict(flags="one flag"), TypeError, r"flags=\(flag,\)"),
        (dict(reason=None), TypeError, "reason must be a str"),
    ],
    ids=["status", "nan", "str-score", "bool-score", "negative-max", "flags-str", "reason-none"],
)
def test_exercise_grade_rejects_bad_fields(fields, error, message):
    with pytest.raises(error, match=message):
        _grade(**fields)


def test_finish_once_and_no_add_after_it(out_dir):
    results = ResultsWriter(out_dir)
    with pytest.raises(TypeError, match="not a single string"):
        results.finish(not_graded="alice.ipynb")
    results.finish()
    with pytest.raises(RuntimeError, match="already called"):
        results.finish()
    with pytest.raises(RuntimeError, match="start a new one"):
        results.add("alice", "01_vector_add", [_grade()])
