"""The grader, against submissions of lesson 01 that are right, wrong, broken or hostile.

One grading run covers most fixtures (the grader runs them in parallel, as an instructor
would); each test then reads its learner's rows. Each fixture is the solved lesson with
some answer cells replaced, or the file itself damaged.
"""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.builder import NOTEBOOKS, SOLUTIONS
from course_lib.grader import lesson as lesson_module
from course_lib.grader import sandbox

LESSON = "01_vector_add"
ANSWERS = {
    cell.metadata["nbgrader"]["grade_id"]: cell.source
    for cell in nbformat.read(SOLUTIONS / f"{LESSON}.ipynb", as_version=4).cells
    if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
}
ADD, AXPY = ANSWERS["ex-vector-add"], ANSWERS["ex-axpy"]
STUBS = {  # the exercise notebook as shipped, every answer still to write
    cell.metadata["nbgrader"]["grade_id"]: cell.source
    for cell in nbformat.read(NOTEBOOKS / f"{LESSON}.ipynb", as_version=4).cells
    if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
}
FLOOR_GRID = ADD.replace(
    "grid = (triton.cdiv(n_elements, BLOCK_SIZE),)", "grid = (n_elements // BLOCK_SIZE,)"
)
ALPHA_ON_Y = AXPY.replace("alpha * x + y", "x + alpha * y")
TORCH_RESULT = ADD.replace("    return out\n    ### END", "    return x + y\n    ### END")
FINISHED_KERNEL = "from course_lib.kernels.vector_add import add\n" + ADD
PATCHED_CHECK = ADD.replace("    return out\n    ### END", "    return out + 1\n    ### END") + (
    "\nimport sys\nfor name in ('run_check', '_replay_case'):\n"
    "    setattr(sys.modules['course_lib.checks.engine'], name, lambda *a, **k: None)\n"
    "sys.modules['course_lib'].check_vector_add = lambda fn: None\n"
)
HANG = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"
DIE = "import os\nos.kill(os.getpid(), 9)\n"
LOUD = "print('x' * 50_000_000)\n" + AXPY
COURSE = Path(sandbox.__file__).resolve().parents[2]
# an empty kernel launched on the output, then PyTorch's result copied into it, spelled
# several ways a reading of the text misses
EMPTY_KERNEL = (
    "@triton.jit\ndef nothing_kernel(out_ptr):\n    pass\n\n"
    "def add(x, y):\n    out = torch.empty_like(x)\n    nothing_kernel[(1,)](out)\n"
)
TORCH_SPELLINGS = {
    "copy_after_launch": EMPTY_KERNEL + "    out[:] = x + y\n    return out\n",
    "getattr_alias": EMPTY_KERNEL
    + "    f = getattr(torch, 'ad' + 'd')\n    out.copy_(f(x, y))\n    return out\n",
    "encoded_exec": EMPTY_KERNEL
    + "    import base64\n    ns = {'x': x, 'y': y}\n"
    + "    exec(base64.b64decode('cj0geCt5').decode(), ns)\n"  # r= x+y
    + "    out.copy_(ns['r'])\n    return out\n",
    "numpy_round_trip": EMPTY_KERNEL
    + "    import numpy\n    out.copy_(torch.from_numpy(numpy.add(x.numpy(), y.numpy())))\n"
    + "    return out\n",
    "numpy_returned": EMPTY_KERNEL
    + "    import numpy\n    return torch.from_numpy(numpy.add(x.numpy(), y.numpy()))\n",
}
# learner code that tries to change what it must not: the course (a lesson notebook, a
# bytecode file beside the grader), the environment, Python's library, the home folder
ESCAPE_TARGETS = [
    COURSE / "notebooks" / "02_relu.ipynb",
    COURSE / "course_lib" / "grader" / "__pycache__" / "planted.pyc",
    Path(sys.prefix) / "planted.txt",
    Path(os.path.dirname(os.__file__)) / "planted.py",
    Path.home() / "planted.txt",
]
ESCAPE = (
    "import os\n"
    f"for target in {[str(t) for t in ESCAPE_TARGETS]!r}:\n"
    "    try:\n"
    "        with open(target, 'a') as f:\n"
    "            f.write('planted')\n"
    "    except OSError:\n"
    "        pass\n"
)
# reads what it must not see: the course's solutions, other jobs' folders
PEEK = (
    "import glob, os\n"
    f"seen = glob.glob({str(COURSE / 'solutions' / '*')!r})\n"
    "mine = os.getcwd()  # its own job folder\n"
    "seen += [p for p in glob.glob('/tmp/course-grade-*/*/*') if not p.startswith(mine)]\n"
    "for path in glob.glob('/tmp/course-grade-*/*/progress.jsonl'):\n"
    "    if path.startswith(mine):\n"
    "        continue\n"
    '    open(path, \'a\').write(\'{"cell": 0, "event": "start", "time": 0}\\n\')\n'
    "if seen:\n"
    "    axpy = None\n"
)
FIFO_PROGRESS = "import os\nos.remove('progress.jsonl')\nos.mkfifo('progress.jsonl')\n"
HOG = "hoard = bytearray(64 * 2**30)\n" + AXPY

FIXTURES = {
    "correct": {},
    "partly": {"ex-axpy": ALPHA_ON_Y},
    "floor_grid": {"ex-vector-add": FLOOR_GRID},
    "torch_result": {"ex-vector-add": TORCH_RESULT},
    "finished_kernel": {"ex-vector-add": FINISHED_KERNEL},
    "patched_check": {"ex-vector-add": PATCHED_CHECK},
    "hangs_in_axpy": {"ex-axpy": AXPY + "\n" + HANG},
    "dies_in_axpy": {"ex-axpy": DIE},
    "syntax_error": {"ex-vector-add": "def add(x, y)\n    return x"},
    "loud": {"ex-axpy": LOUD},
    "unsolved": STUBS,
    "undefined": {"ex-vector-add": "BLOCK_SIZE = 1024\n", "ex-axpy": AXPY},
    "raises": {"ex-vector-add": "raise RuntimeError('stopped early')\n" + ADD},
    **{name: {"ex-vector-add": source} for name, source in TORCH_SPELLINGS.items()},
    "escape": {"ex-axpy": AXPY + "\n" + ESCAPE},
    "peek": {"ex-axpy": AXPY + "\n" + PEEK},
    "fifo_progress": {"ex-axpy": AXPY + "\n" + FIFO_PROGRESS},
    "hog": {"ex-axpy": HOG},
}


def _submission(path: Path, answers: dict[str, str], tamper=None) -> None:
    nb = nbformat.read(SOLUTIONS / f"{LESSON}.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    if tamper:
        tamper(nb)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _ruin_check_cells(nb) -> None:
    """What the old grader fell for: a check cell turned into markdown, a second check
    cell with the same grade_id, and metadata that names another lesson."""
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            cell.cell_type = "markdown"
    nb.metadata["course"] = {"generated_from": "solutions/02_relu.ipynb"}


def _rename_axpy_cell(nb) -> None:
    """The axpy answer cell lost its grade_id (copied into a new cell, say)."""
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ex-axpy":
            cell.metadata["nbgrader"]["grade_id"] = "my-axpy"


def _needs_sandbox() -> None:
    """Skip where bwrap cannot run (a developer's machine without it); CI, which installs
    it (.ci/run sets COURSE_REQUIRE_SANDBOX), fails instead."""
    try:
        sandbox.check_sandbox((), [])
    except sandbox.SandboxUnavailable as error:
        if os.environ.get("COURSE_REQUIRE_SANDBOX"):
            raise
        pytest.skip(f"the grader's sandbox cannot run here: {error}")


def _grade(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "course_lib.grader", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _rows(results: Path) -> dict[tuple[str, str], dict]:
    with (results / "grades.csv").open(newline="") as f:
        return {(r["student_id"], r["grade_id"]): r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    _needs_sandbox()
    root = tmp_path_factory.mktemp("grading")
    subs = root / "subs"
    for learner, answers in FIXTURES.items():
        _submission(subs / learner / f"{LESSON}.ipynb", answers)
    _submission(subs / "ruined_checks" / f"{LESSON}.ipynb", {}, _ruin_check_cells)
    _submission(subs / "renamed_cell" / f"{LESSON}.ipynb", {}, _rename_axpy_cell)
    # reads another learner's notebook (a successful read breaks its own axpy), plants a
    # file in the results, and leaves a process behind in a session of its own
    other, planted = subs / "correct" / f"{LESSON}.ipynb", root / "results" / "planted.txt"
    spy = (
        "import pathlib, subprocess\n"
        "subprocess.Popen(['sleep', '987654'], start_new_session=True)\n"
        "try:\n"
        f"    pathlib.Path({str(planted)!r}).write_text('x')\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        f"    pathlib.Path({str(other)!r}).read_text()\n"
        "    axpy = None\n"
        "except OSError:\n"
        "    pass\n"
    )
    _submission(subs / "snoop" / f"{LESSON}.ipynb", {"ex-axpy": AXPY + "\n" + spy})
    broken = subs / "truncated" / f"{LESSON}.ipynb"
    broken.parent.mkdir()
    broken.write_text((SOLUTIONS / f"{LESSON}.ipynb").read_text()[:5000])
    # a planted course_lib that passes everything, beside a wrong answer
    _submission(subs / "planted" / f"{LESSON}.ipynb", {"ex-axpy": ALPHA_ON_Y})
    planted = subs / "planted" / "course_lib"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('the planted course_lib ran')\n")
    # links: to the course's solution, to another learner's notebook; and one learner's
    # second copy of the lesson, in old/ and as "(copy)"
    (subs / "link_to_solution").mkdir()
    (subs / "link_to_solution" / f"{LESSON}.ipynb").symlink_to(SOLUTIONS / f"{LESSON}.ipynb")
    (subs / "link_to_other").symlink_to(subs / "correct")
    _submission(subs / "copies" / f"{LESSON}.ipynb", {"ex-axpy": ALPHA_ON_Y})
    _submission(subs / "copies" / "old" / f"{LESSON}.ipynb", {})
    _submission(subs / "copies" / f"{LESSON} (copy).ipynb", {})
    before = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file() and not p.is_symlink()}
    started = time.perf_counter()
    # run from inside the submissions, where a planted package would be found first. The
    # cell limit leaves room: lesson 01's check of its unmasked kernel takes about 12 s in
    # the interpreter on two cores, and CI machines can be busier than that
    done = _grade(
        str(subs), "--out", str(root / "results"), "--cell-timeout", "45",
        "--workers", "2", cwd=root,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-3000:]
    after = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file() and not p.is_symlink()}
    print(f"graded {len(FIXTURES) + 8} submissions in {elapsed:.0f} s")
    return {"rows": _rows(root / "results"), "results": root / "results", "run": done,
            "unchanged": before == after, "subs": subs}  # fmt: skip


def _row(graded, learner, grade_id):
    return graded["rows"][(learner, grade_id)]


def test_a_correct_submission_earns_every_point(graded):
    assert _row(graded, "correct", "check-vector-add")["score"] == "2"
    assert _row(graded, "correct", "check-axpy")["score"] == "1"
    assert _row(graded, "correct", "check-axpy")["status"] == "passed"
    assert _row(graded, "correct", "check-axpy")["flags"] == ""


def test_a_partly_correct_submission_keeps_what_it_earned(graded):
    assert _row(graded, "partly", "check-vector-add")["score"] == "2"
    row = _row(graded, "partly", "check-axpy")
    assert row["score"] == "0" and row["status"] == "failed"
    feedback = (graded["results"] / "feedback" / "partly.md").read_text()
    assert "alpha" in feedback and "elements wrong" in feedback  # the check's own report


def test_a_wrong_kernel_scores_nothing_and_its_report_names_the_mistake(graded):
    row = _row(graded, "floor_grid", "check-vector-add")
    assert row["score"] == "0"
    feedback = (graded["results"] / "feedback" / "floor_grid.md").read_text()
    assert "the grid has no programs" in feedback


def test_torch_cannot_pass_for_a_kernel(graded):
    row = _row(graded, "torch_result", "check-vector-add")
    assert row["score"] == "0" and "computes with PyTorch" in row["reason"], row
    assert "aten.add" in row["reason"] and "seems to return x + y" in row["flags"]


@pytest.mark.parametrize("learner", sorted(TORCH_SPELLINGS))
def test_torch_reached_any_way_scores_nothing_and_names_the_op(graded, learner):
    row = _row(graded, learner, "check-vector-add")
    assert row["score"] == "0", row
    if learner == "numpy_returned":  # no ATen op at all: no kernel received the result
        assert "none of your kernels received" in row["reason"], row
    elif learner == "numpy_round_trip":
        assert "PyTorch did not make here" in row["reason"], row
    else:
        assert "computes with PyTorch" in row["reason"] and "aten.add" in row["reason"], row
    assert _row(graded, learner, "check-axpy")["score"] == "1"  # the rest is graded


def test_the_finished_kernels_are_off_limits(graded):
    row = _row(graded, "finished_kernel", "check-vector-add")
    assert row["score"] == "0" and "course_lib.kernels" in row["reason"]


def test_patching_the_checker_earns_nothing(graded):
    # the checker is patched in the learner's process; the verdict is made in another
    row = _row(graded, "patched_check", "check-vector-add")
    assert row["score"] == "0", row
    assert "imports sys" in row["flags"]


@pytest.mark.parametrize(
    ("learner", "lost", "reason", "kept"),
    [
        # a loop that ignores Ctrl-C: the process group is killed at the cell's limit
        ("hangs_in_axpy", "check-axpy", "ran past its 45 s limit", "check-vector-add"),
        ("dies_in_axpy", "check-axpy", "signal 9", "check-vector-add"),
        ("syntax_error", "check-vector-add", "does not parse", "check-axpy"),
        ("undefined", "check-vector-add", "add is not defined", "check-axpy"),
        (
            "raises",
            "check-vector-add",
            "add is not defined: its cell raised RuntimeError: stopped early",
            "check-axpy",
        ),
        (
            "renamed_cell",
            "check-axpy",
            "answer cell ex-axpy is not in the notebook",
            "check-vector-add",
        ),
    ],
)
def test_a_broken_answer_costs_only_its_own_exercise(graded, learner, lost, reason, kept):
    row = _row(graded, learner, lost)
    assert row["score"] == "0" and reason in row["reason"], row
    assert _row(graded, learner, kept)["status"] == "passed"


def test_a_compiled_kernel_defined_in_a_cell_finds_its_source():
    """@triton.jit reads its source through inspect, which code run from a string lacks."""
    import triton

    from course_lib.grader.child import run_cell

    namespace = {}
    run_cell("import triton\ndef double(x_ptr):\n    pass\n", 7, namespace)
    compiled = triton.runtime.jit.JITFunction(namespace["double"])  # as on a GPU
    assert "def double(x_ptr)" in compiled.src


def test_gigantic_output_is_capped_and_grading_goes_on(graded):
    assert _row(graded, "loud", "check-axpy")["score"] == "1"


def test_an_unsolved_notebook_says_not_done(graded):
    for grade_id in ("check-vector-add", "check-axpy"):
        row = _row(graded, "unsolved", grade_id)
        assert row["score"] == "0" and "not done" in row["reason"]
        assert row["flags"] == ""  # a stub is no reason to review anything


def test_check_cells_and_lesson_come_from_the_course_not_the_submission(graded):
    # its check cells are markdown and its metadata names lesson 02: graded as lesson 01
    assert _row(graded, "ruined_checks", "check-vector-add")["score"] == "2"
    assert _row(graded, "ruined_checks", "check-vector-add")["assignment"] == LESSON


def test_a_truncated_file_scores_nothing_and_the_rest_is_graded(graded):
    row = _row(graded, "truncated", "check-vector-add")
    assert row["score"] == "0" and "not a readable notebook" in row["reason"]


def test_a_planted_course_lib_is_never_imported(graded):
    assert _row(graded, "planted", "check-axpy")["score"] == "0"
    assert _row(graded, "planted", "check-vector-add")["score"] == "2"


def test_submissions_are_never_written(graded):
    assert graded["unchanged"]


def test_a_submission_cannot_see_the_others_or_the_results_or_outlive_its_run(graded):
    assert _row(graded, "snoop", "check-axpy")["score"] == "1"  # its read failed
    assert not (graded["results"] / "planted.txt").exists()
    leftovers = subprocess.run(["pgrep", "-f", "sleep 987654"], capture_output=True)
    assert leftovers.stdout == b"", "a process the submission started outlived its run"


def test_nothing_outside_its_job_folder_changes(graded):
    assert _row(graded, "escape", "check-axpy")["score"] == "1"  # it ran, and failed quietly
    for target in ESCAPE_TARGETS:
        assert not target.exists() or b"planted" not in target.read_bytes()[-100:], target


def test_solutions_and_other_jobs_are_invisible_and_no_one_elses_rows_move(graded):
    # its axpy survives only if it saw nothing; the correct learners lost nothing
    assert _row(graded, "peek", "check-axpy")["score"] == "1"
    assert _row(graded, "correct", "check-axpy")["score"] == "1"


def test_a_progress_file_turned_into_a_pipe_costs_only_its_own_run(graded):
    row = _row(graded, "fifo_progress", "check-axpy")
    assert row["score"] == "0" and "tampered" in row["reason"], row
    assert _row(graded, "fifo_progress", "check-vector-add")["score"] == "2"


def test_memory_is_limited(graded):
    from course_lib import runtime

    if not runtime.INTERPRETED:
        pytest.skip("on a GPU the grader sets no address-space limit (CUDA maps its memory)")
    row = _row(graded, "hog", "check-axpy")
    assert row["score"] == "0" and "MemoryError" in row["reason"], row


def test_links_are_refused_and_flagged(graded):
    # a linked notebook is refused on its lesson's rows; a linked folder, on one row
    for learner, grade_id in (("link_to_solution", "check-vector-add"),
                              ("link_to_other", "(submission)")):  # fmt: skip
        row = _row(graded, learner, grade_id)
        assert row["score"] == "0" and "symbolic link" in row["reason"], row
        assert "refused" in row["flags"]


def test_one_notebook_per_lesson_per_learner_never_summed(graded):
    rows = [r for (learner, _), r in graded["rows"].items() if learner == "copies"]
    assert len(rows) == 2  # one notebook's rows: its own, with its wrong axpy
    assert _row(graded, "copies", "check-axpy")["score"] == "0"
    assert "also handed in" in _row(graded, "copies", "check-axpy")["flags"]
    summary = (graded["results"] / "summary.md").read_text()
    assert "(copy)" in summary and "old" in summary


def test_summary_and_feedback_are_written(graded):
    results = graded["results"]
    assert (results / "scores.png").read_bytes().startswith(b"\x89PNG")
    summary = (results / "summary.md").read_text()
    assert f"{len(FIXTURES) + 8} learners graded" in summary
    assert {p.stem for p in (results / "feedback").glob("*.md")} >= set(FIXTURES)


def test_regrading_gives_the_same_grades(graded, tmp_path):
    subs = graded["subs"]
    again = _grade(
        str(subs / "correct"), str(subs / "partly"), "--out", str(tmp_path / "again"),
        cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    rows = _rows(tmp_path / "again")
    for key, row in rows.items():
        assert row == graded["rows"][key]


def test_results_are_never_overwritten(graded, tmp_path):
    done = _grade(str(graded["subs"] / "correct"), "--out", str(graded["results"]), cwd=tmp_path)
    assert done.returncode == 2 and "results" in done.stderr


def test_ctrl_c_stops_cleanly_and_keeps_finished_rows(tmp_path):
    _needs_sandbox()
    subs = tmp_path / "subs"
    _submission(subs / "a_correct" / f"{LESSON}.ipynb", {})
    _submission(subs / "b_hangs" / f"{LESSON}.ipynb", {"ex-vector-add": HANG})
    # Ctrl-C as a terminal sends it: a program started with SIGINT ignored keeps ignoring
    # it (Python installs no KeyboardInterrupt then), and a test run before this one in the
    # same worker may have left it ignored, so the grader starts with the default
    proc = subprocess.Popen(
        [sys.executable, "-m", "course_lib.grader", str(subs), "--out", str(tmp_path / "r"),
         "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    grades = tmp_path / "r" / "grades.csv"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "a_correct" not in (
        grades.read_text() if grades.exists() else ""
    ):
        time.sleep(0.5)
    time.sleep(3)  # b_hangs is running now
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()  # its sandboxes die with it, rather than spin through the other tests
        raise
    assert proc.returncode == 130, err[-2000:]
    assert _rows(tmp_path / "r")[("a_correct", "check-vector-add")]["score"] == "2"
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "b\\_hangs" in summary or "b_hangs" in summary
    leftovers = subprocess.run(["pgrep", "-f", "course_lib.grader.child"], capture_output=True)
    assert leftovers.stdout == b"", "a sandboxed process outlived the run"


def test_the_lesson_is_chosen_by_the_instructor_not_the_file(tmp_path):
    _needs_sandbox()
    _submission(tmp_path / "alice.ipynb", {})
    done = _grade(str(tmp_path / "alice.ipynb"), "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert done.returncode == 0
    assert "pass --lesson" in (tmp_path / "r" / "summary.md").read_text()
    done = _grade(
        str(tmp_path / "alice.ipynb"), "--out", str(tmp_path / "r2"), "--lesson", LESSON,
        cwd=tmp_path,
    )  # fmt: skip
    assert _rows(tmp_path / "r2")[("alice", "check-axpy")]["score"] == "1"


def test_every_lesson_parses_and_its_solutions_pass_review():
    """The review flags nothing in any lesson's solutions (test_grader_watch.py runs them)."""
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):  # appendices have no exercise
        lesson = lesson_module.load_lesson(path)
        answers = lesson_module.read_answers(lesson, SOLUTIONS / path.name)
        assert not answers.missing and lesson.exercises
        for exercise in lesson.exercises:
            found = lesson_module.review(exercise, answers.sources)
            assert (found.forbidden, found.flags) == ([], []), (path.name, exercise.grade_id)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("import course_lib.checks.engine as e\ndef add(x, y):\n    pass", "course_lib.checks"),
        ("def add(x, y):\n    return course_lib.kernels.vector_add.add(x, y)", "kernels"),
    ],
)
def test_review_refuses_answers_that_are_not_the_learners_kernel(source, fragment):
    exercise = lesson_module.Exercise("check-x", 1, "check_vector_add", "add", ("ex",))
    found = lesson_module.review(exercise, {"ex": source})
    assert any(fragment in reason for reason in found.forbidden), found


@pytest.mark.parametrize(
    "source",
    ["def add(x, y):\n    return torch.add(x, y)", "def add(x, y):\n    z = x + y\n    return z"],
)
def test_review_flags_what_looks_like_a_torch_result_and_leaves_the_verdict_to_the_run(source):
    exercise = lesson_module.Exercise("check-x", 1, "check_vector_add", "add", ("ex",))
    found = lesson_module.review(exercise, {"ex": source})
    assert found.forbidden == [] and any("seems to return" in f for f in found.flags), found


def test_review_leaves_size_arithmetic_alone():
    source = (
        "@triton.jit\ndef k(x_ptr):\n    pass\n"
        "def add(x, y):\n    n = x.numel() * 2\n    out = torch.empty(n, device=x.device)\n"
        "    k[(triton.cdiv(n, 128),)](out)\n    return out\n"
    )
    exercise = lesson_module.Exercise("check-x", 1, "check_vector_add", "add", ("ex",))
    assert lesson_module.review(exercise, {"ex": source}).forbidden == []


def test_review_reads_a_launchers_body_not_its_decorators():
    """Lesson 08 registers the launcher as an operator: the decorator computes nothing."""
    source = (
        "@triton.jit\ndef k(x_ptr):\n    pass\n"
        '@torch.library.custom_op("l::add", mutates_args=())\n'
        "def add(x: torch.Tensor) -> torch.Tensor:\n    out = torch.empty_like(x)\n"
        "    k[(1,)](out)\n    return out\n"
    )
    exercise = lesson_module.Exercise("check-x", 1, "check_vector_add", "add", ("ex",))
    found = lesson_module.review(exercise, {"ex": source})
    assert (found.forbidden, found.flags) == ([], [])
    torch_in_body = source.replace("    k[(1,)](out)", "    out = torch.softmax(x, -1)")
    assert lesson_module.review(exercise, {"ex": torch_in_body}).flags


@pytest.mark.parametrize(
    ("source", "forbidden", "flag"),
    [
        ("softmax_op = torch.ops.course.softmax", "torch.ops.course", "defines no function"),
        ("from course_lib import ops\nsoftmax_op = ops.softmax", "course_lib.ops", ""),
        ("torch.library.opcheck = lambda *a, **k: None\ndef softmax_op(x):\n    pass",
         "replaces torch.library.opcheck", ""),
        ("torch._dynamo.explain, y = None, 1\ndef softmax_op(x):\n    pass",
         "replaces torch._dynamo.explain", ""),
        ("triton.cdiv = max\ndef softmax_op(x):\n    pass", "", "assigns to triton.cdiv"),
        ("@(lambda f: lambda x: torch.softmax(x, -1))\ndef softmax_op(x):\n    pass", "",
         "calls torch.softmax"),
    ],
)  # fmt: skip
def test_review_refuses_the_courses_operator_and_replaced_checks(source, forbidden, flag):
    exercise = lesson_module.Exercise("check-x", 3, "check_softmax_op", "softmax_op", ("ex",))
    found = lesson_module.review(exercise, {"ex": source})
    if forbidden:
        assert any(forbidden in reason for reason in found.forbidden), found
    else:
        assert found.forbidden == [], found
    if flag:
        assert any(flag in f for f in found.flags), found


def test_review_flags_a_numpy_view_written_by_the_launcher():
    """Values written through out.numpy() pass no PyTorch operator: the review flags it."""
    lesson = lesson_module.load_lesson(NOTEBOOKS / "01_vector_add.ipynb")
    exercise = lesson.exercises[0]
    source = (
        "def add(x, y):\n    out = torch.empty_like(x)\n"
        "    out.numpy()[:] = x.numpy() + y.numpy()\n    return out\n"
    )
    found = lesson_module.review(exercise, {exercise.answer_ids[0]: source})
    assert any("out.numpy()" in flag for flag in found.flags), found.flags


def test_review_reads_names_the_setup_cells_bound_to_modules():
    """Lesson 08's setup imports the course's operators as `ops`: an answer that calls
    ops.softmax uses the finished kernel without importing anything."""
    lesson = lesson_module.load_lesson(NOTEBOOKS / "08_torch_compile.ipynb")
    (exercise,) = [e for e in lesson.exercises if e.grade_id == "check-softmax-op"]
    assert ("ops", "course_lib.ops") in exercise.module_names
    calls_ops = (
        '@custom_op("lesson08::softmax", mutates_args=())\n'
        "def softmax_op(x: torch.Tensor) -> torch.Tensor:\n    return ops.softmax(x)\n"
    )
    found = lesson_module.review(exercise, {exercise.answer_ids[0]: calls_ops})
    assert any("course_lib.ops.softmax" in reason for reason in found.forbidden), found
    rebinds = "ops = [1]\n" + calls_ops.replace("ops.softmax(x)", "softmax(x)")
    assert lesson_module.review(exercise, {exercise.answer_ids[0]: rebinds}).forbidden == []


def test_a_lesson_whose_check_cell_is_not_a_plain_check_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook()
    meta = {"nbgrader": {"grade": True, "grade_id": "check-x", "points": 1}}
    nb.cells = [nbformat.v4.new_code_cell("import os; course_lib.check_x(f)", metadata=meta)]
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    with pytest.raises(lesson_module.LessonError, match="course_lib.check_<topic>"):
        lesson_module.load_lesson(tmp_path / "01_x.ipynb")


def test_the_sandbox_gets_a_minimal_environment(monkeypatch, tmp_path):
    from course_lib.grader import sandbox

    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    env = sandbox._environment(tmp_path)
    assert "SECRET_TOKEN" not in env and env["HOME"] == "/tmp"  # the sandbox's own tmpfs
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert os.environ.get("PATH") == env.get("PATH")


def test_the_sandbox_path_keeps_the_course_and_drops_submissions_and_the_current_folder(
    monkeypatch, tmp_path
):
    from course_lib.grader import sandbox

    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), str(subs / "alice"), *sys.path])
    kept = sandbox._trusted_sys_path([subs])
    assert kept[0] == str(Path(sandbox.__file__).resolve().parents[2])
    assert not {"", str(tmp_path), str(subs / "alice")} & set(kept)
    assert any("site-packages" in entry for entry in kept)  # torch and triton stay reachable


def test_a_folder_with_notebooks_is_one_learner_and_a_folder_of_folders_many(tmp_path):
    from course_lib.grader import find_submissions

    _submission(tmp_path / "one" / f"{LESSON}.ipynb", {})
    _submission(tmp_path / "one" / "old" / f"{LESSON}.ipynb", {})  # not this learner's answer
    _submission(tmp_path / "class" / "ada" / "week1" / f"{LESSON}.ipynb", {})
    _submission(tmp_path / "class" / "ben" / f"{LESSON}.ipynb", {})
    found, others = find_submissions([tmp_path / "one", tmp_path / "class"], {LESSON})
    assert others == []
    assert [(s.student_id, s.path.relative_to(tmp_path).as_posix()) for s in found] == [
        ("one", f"one/{LESSON}.ipynb"),
        ("ada", f"class/ada/week1/{LESSON}.ipynb"),
        ("ben", f"class/ben/{LESSON}.ipynb"),
    ]


def test_unsandboxed_grading_warns_what_is_not_protected(graded, tmp_path):
    done = _grade(
        str(graded["subs"] / "correct"), "--out", str(tmp_path / "r"), "--unsandboxed",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "UNSANDBOXED" in done.stderr and "other submissions" in done.stderr
    assert _rows(tmp_path / "r")[("correct", "check-vector-add")]["score"] == "2"
    gone = _grade(str(graded["subs"] / "correct"), "--out", str(tmp_path / "r2"),
                  "--no-namespaces", cwd=tmp_path)  # fmt: skip
    assert gone.returncode == 2 and "--unsandboxed" in gone.stderr


def test_without_bwrap_the_grader_refuses_and_says_how_to_install_it(graded, tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with Python and nothing else
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.grader", str(graded["subs"] / "correct"),
         "--out", str(tmp_path / "r")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": str(bin_dir)},
    )  # fmt: skip
    assert done.returncode == 2
    assert "apt-get install bubblewrap" in done.stderr and "--unsandboxed" in done.stderr
    assert not (tmp_path / "r").exists()


def test_the_sandbox_masks_the_course_the_homes_and_what_it_is_told_to_hide():
    masked = sandbox.masked_folders((Path("/"), Path("/usr"), COURSE / "notebooks"))
    assert Path("/") not in masked and Path("/usr") not in masked  # the system stays
    assert COURSE in masked  # its solutions, notebooks and history
    assert Path("/root") in masked or not Path("/root").is_dir()
