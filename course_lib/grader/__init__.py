"""Grade learners' exercise notebooks without trusting anything they contain.

    python -m course_lib.grader SUBMISSIONS... --out RESULTS [--lesson NAME]
                                [--workers N] [--cell-timeout S] [--notebook-timeout S]
                                [--seed N] [--no-namespaces]

SUBMISSIONS are notebooks, or folders: a folder holding notebooks is one learner's, and a
folder of folders holds one folder per learner. Each notebook is graded against the
course's own lesson of the same file name (or --lesson), never against what the notebook
says of itself. RESULTS must not exist yet; it receives grades.csv, one feedback file per
learner, summary.md and scores.png.

How a notebook is graded:

1. Only its answer cells are taken (nbgrader ``solution: true``, matched by grade_id);
   every other cell, the checks included, is the lesson's own. The answers are read as
   text first: one that uses the course's finished kernels or its checker scores nothing,
   and what looks like torch computing the result is flagged (lesson.py).
2. The lesson runs with those answers in a sandboxed process, which records what the
   learner's functions returned on each check's cases (sandbox.py, child.py).
3. This process replays each check on those records, against its own inputs and
   references, and decides (checks/replay.py). A crash, a hang or a stop costs only the
   exercises not yet checked.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import inspect
import io
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from course_lib.builder import NOTEBOOKS
from course_lib.grader import sandbox
from course_lib.grader.lesson import (
    Answers,
    Exercise,
    Lesson,
    LessonError,
    Review,
    SubmissionError,
    load_lesson,
    read_answers,
    review,
)
from course_lib.grader.results import ExerciseGrade, ResultsWriter, safe_text

__all__ = ["Submission", "find_submissions", "grade_submission", "main"]

_REPLAY_LOCK = threading.Lock()  # replay and the checks' hooks are process-wide


@dataclass(frozen=True)
class Submission:
    student_id: str
    path: Path


def _notebooks(folder: Path, recursive: bool = True) -> list[Path]:
    found = folder.rglob("*.ipynb") if recursive else folder.glob("*.ipynb")
    return sorted(p for p in found if ".ipynb_checkpoints" not in p.parts and p.is_file())


def find_submissions(paths: list[Path], lesson_names: set[str]) -> list[Submission]:
    """Learners and their notebooks: a file is one notebook (its learner is its folder's
    name when the file is named after a lesson, else its own name); a folder with
    notebooks in it is one learner; a folder of folders, one learner per folder."""
    found = []
    for path in paths:
        if path.is_file():
            student = path.parent.name if path.stem in lesson_names else path.stem
            found.append(Submission(student or path.stem, path))
        elif path.is_dir() and any(p.suffix == ".ipynb" for p in path.iterdir()):
            found += [Submission(path.name, nb) for nb in _notebooks(path, recursive=False)]
        elif path.is_dir():
            for learner in sorted(p for p in path.iterdir() if p.is_dir()):
                found += [Submission(learner.name, nb) for nb in _notebooks(learner)]
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return found


def lesson_path(submission: Path, lessons: Path, lesson: str | None) -> Path:
    """The course's lesson a notebook is graded against: --lesson, or its file name."""
    names = sorted(p.stem for p in lessons.glob("*.ipynb"))
    if lesson is not None:
        if lesson not in names:
            raise LessonError(f"no lesson {lesson!r} in {lessons}; choose one of {names}")
        return lessons / f"{lesson}.ipynb"
    matches = [n for n in names if submission.stem == n] or [
        n for n in names if n in submission.stem
    ]
    if len(matches) != 1:
        raise LessonError(
            f"cannot tell which lesson {submission.name} is from its name; keep the lesson's "
            "file name or pass --lesson"
        )
    return lessons / f"{matches[0]}.ipynb"


_KINDS = {kind.name: kind for kind in type(inspect.Parameter.POSITIONAL_ONLY)}


def _stub(signature) -> object:
    """A function that stands for the learner's in a replay: its parameters, no body."""

    def learners_function(*args, **kwargs):
        raise RuntimeError("a replayed check calls nothing of the learner's")

    try:
        learners_function.__signature__ = inspect.Signature(
            [
                inspect.Parameter(
                    str(name),
                    _KINDS[str(kind)],
                    default=None if has_default else inspect.Parameter.empty,
                )
                for name, kind, has_default in signature
            ]
        )
    except (TypeError, ValueError, KeyError):
        pass  # no or malformed parameters: the stub takes anything
    return learners_function


def _verdict(
    student: str, lesson: Lesson, index: int, answers: Answers, found: Review, run, seed: int
) -> ExerciseGrade:
    import course_lib
    from course_lib.checks import CheckFailed, replay
    from course_lib.checks.engine import grading_seed

    exercise: Exercise = lesson.exercises[index]

    def grade(score, status, reason, report="", flags=tuple(found.flags + answers.notes)):
        return ExerciseGrade(
            student, lesson.name, exercise.grade_id, score, exercise.points, status,
            safe_text(reason), safe_text(report, limit=20_000), flags,
        )  # fmt: skip

    missing = [g for g in exercise.answer_ids if g in answers.missing]
    if missing:
        return grade(0.0, "failed", f"answer cell {missing[0]} is not in the notebook")
    if found.forbidden:
        return grade(0.0, "failed", found.forbidden[0])
    if index in run.unreadable:
        return grade(0.0, "failed", f"what the run left is unusable: {run.unreadable[index]}")
    outcome = run.outcomes.get(index)
    if outcome is None:
        where = f" at cell {run.stopped_at}" if run.stopped_at is not None else ""
        why = run.ended or "the check never ran"
        return grade(0.0, "failed", f"not checked: {why}{where}", run.output[-2000:])
    if outcome.get("status") == "not done":  # a stub is no reason to review anything
        return grade(0.0, "failed", "not done: the answer still raises ExerciseNotDone", flags=())
    if outcome.get("status") == "error" and not run.records.get(index):
        return grade(0.0, "failed", str(outcome.get("message", "the check could not run")))
    checker = getattr(course_lib, exercise.checker)
    with _REPLAY_LOCK, replay.replaying(run.records.get(index, [])), grading_seed(seed):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = checker(_stub(outcome.get("signature") or []))
        except CheckFailed as failure:
            result = failure.result
        except Exception as error:  # noqa: BLE001  (a check that refuses the answer outright)
            message = outcome.get("message") or f"{type(error).__name__}: {error}"
            return grade(0.0, "failed", str(message))
    if result.passed:
        return grade(exercise.points, "passed", result.headline, result.report())
    first = next(c for c in result.cases if not c.passed)
    return grade(0.0, "failed", f"{first.label}: {first.problems[0]}", result.report())


def grade_submission(
    submission: Submission,
    lesson: Lesson,
    limits: sandbox.Limits,
    roots: list[Path],
    stop: threading.Event | None = None,
) -> list[ExerciseGrade]:
    """Grade one notebook against `lesson`: one ExerciseGrade per exercise."""
    try:
        answers = read_answers(lesson, submission.path)
    except SubmissionError as error:
        return [
            ExerciseGrade(
                submission.student_id,
                lesson.name,
                e.grade_id,
                0.0,
                e.points,
                "failed",
                safe_text(f"{submission.path.name}: {error}"),
            )  # fmt: skip
            for e in lesson.exercises
        ]
    reviews = [review(e, answers.sources) for e in lesson.exercises]
    run = sandbox.run(lesson, answers, roots, limits, stop)
    return [
        _verdict(submission.student_id, lesson, i, answers, reviews[i], run, limits.seed)
        for i in range(len(lesson.exercises))
    ]


def main(argv: list[str] | None = None) -> int:
    from tqdm.auto import tqdm

    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grader",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("submissions", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the results")
    parser.add_argument("--lesson", help="grade every notebook against this lesson")
    parser.add_argument("--lessons", type=Path, default=NOTEBOOKS, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cell-timeout", type=float, default=300, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=1200, help="seconds each")
    parser.add_argument(
        "--seed", type=int, default=1, help="draws the checks' values (keep yours to yourself)"
    )
    parser.add_argument(
        "--no-namespaces", action="store_true",
        help="isolate the learner's process only, without namespaces (no hidden folders)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    lesson_names = {p.stem for p in args.lessons.glob("*.ipynb")}
    try:
        submissions = find_submissions(args.submissions, lesson_names)
        writer = ResultsWriter(args.out)
    except (FileNotFoundError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    namespaces = not args.no_namespaces and sandbox.namespaces_work()
    limits = sandbox.Limits(
        args.cell_timeout, args.notebook_timeout, args.seed, namespaces, (args.out,)
    )
    if not namespaces:
        print(
            "note: the learner's code runs as your user and can read the other submissions "
            "and the results"
            + ("" if args.no_namespaces else " (this machine allows no user namespaces)"),
            file=sys.stderr,
        )
    lessons: dict[Path, Lesson] = {}
    stop = threading.Event()
    not_graded: list[str] = []

    def task(sub: Submission) -> list[ExerciseGrade]:
        path = lesson_path(sub.path, args.lessons, args.lesson)
        if path not in lessons:
            lessons[path] = load_lesson(path)
        return grade_submission(sub, lessons[path], limits, args.submissions, stop)

    with writer, concurrent.futures.ThreadPoolExecutor(max(1, args.workers)) as pool:
        futures = {pool.submit(task, sub): sub for sub in submissions}
        progress = tqdm(total=len(futures), desc="grading", unit="notebook")
        recorded = set()
        try:
            for future in concurrent.futures.as_completed(futures):
                sub = futures[future]
                name = safe_text(f"{sub.student_id}/{sub.path.name}")
                progress.update()
                recorded.add(future)
                try:
                    grades = future.result()
                except Exception as error:  # noqa: BLE001  (one submission must not stop the run)
                    reason = safe_text(f"{type(error).__name__}: {error}", limit=300)
                    not_graded.append(f"{name}: {reason}")
                    progress.write(f"{name}: not graded: {reason}")
                    continue
                writer.add(sub.student_id, grades[0].assignment, grades)
                score, total = sum(g.score for g in grades), sum(g.max_score for g in grades)
                progress.write(f"{name}: {score:g} / {total:g}")
        except KeyboardInterrupt:
            stop.set()  # running sandboxes kill their processes and raise Stopped
            for future, sub in futures.items():
                if future not in recorded:
                    future.cancel()
                    not_graded.append(safe_text(f"{sub.student_id}/{sub.path.name}: stopped"))
            progress.write("stopped: the notebooks listed in summary.md were not graded")
        finally:
            progress.close()
        print(writer.finish(not_graded))
    return 130 if stop.is_set() else 0
