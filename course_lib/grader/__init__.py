"""Grade learners' exercise notebooks without trusting anything they contain.

    python -m course_lib.grader SUBMISSIONS... --out RESULTS [--lesson NAME]
                                [--workers N] [--cell-timeout S] [--notebook-timeout S]
                                [--seed N] [--memory-limit GIB] [--unsandboxed]

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
2. The lesson runs with those answers in a bubblewrap sandbox, which records what the
   learner's functions returned on each check's cases, and what PyTorch computed while
   they ran (sandbox.py, child.py, watch.py). Without bwrap the grader refuses, unless
   given --unsandboxed.
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
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from course_lib.builder import NOTEBOOKS, SOLUTIONS
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
from course_lib.grader.results import DiskFull, ExerciseGrade, ResultsWriter, safe_text

__all__ = ["Submission", "find_submissions", "grade_submission", "main"]

_REPLAY_LOCK = threading.Lock()  # replay and the checks' hooks are process-wide


@dataclass(frozen=True)
class Submission:
    student_id: str
    path: Path
    refused: str = ""  # why it is not graded (a link, the course's own file), else ""
    others: tuple[str, ...] = ()  # this learner's other notebooks of the same lesson


class SubmissionsError(ValueError):
    """The submissions given cannot be graded as given (inside the course, say)."""


def _walk(folder: Path, recursive: bool) -> tuple[list[Path], list[Path]]:
    """Notebooks under `folder` and the links met there, never following a link."""
    notebooks, links = [], []
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(dirs):
            if (here / name).is_symlink():
                links.append(here / name)
        for name in sorted(files):
            path = here / name
            if path.is_symlink():
                links.append(path)
            elif name.endswith(".ipynb"):
                notebooks.append(path)
        if not recursive:
            dirs[:] = []
    return notebooks, [p for p in links if p.suffix == ".ipynb" or p.is_dir()]


def _course_files() -> dict[tuple[int, int], Path]:
    """The course's own notebooks, by inode: a submission that is one of them (a hard
    link) is refused."""
    found = {}
    for folder in (SOLUTIONS, NOTEBOOKS):
        for path in folder.glob("*.ipynb"):
            info = path.stat()
            found[(info.st_dev, info.st_ino)] = path
    return found


def _check_outside_the_course(path: Path) -> None:
    root, where = sandbox.course_root(), path.resolve()
    if where == root or root in where.parents:
        raise SubmissionsError(
            f"{path} lies inside the course's folder ({root}): copy the submissions to a "
            "folder outside it and grade them there"
        )
    if where in root.parents:
        raise SubmissionsError(
            f"{path} holds the course itself ({root}): give the folder of submissions only"
        )


def find_submissions(
    paths: list[Path], lesson_names: set[str], lesson_of=None
) -> tuple[list[Submission], list[str]]:
    """Learners and their notebooks: a file is one notebook (its learner is its folder's
    name when the file is named after a lesson, else its own name); a folder with
    notebooks in it is one learner; a folder of folders, one learner per folder.

    Links are refused (a refused Submission each), and so is a notebook that is a course
    file or another submission under a second name. Each learner gets one notebook per
    lesson (`lesson_of(path)` names it): the one named after the lesson, nearest the top;
    the others are returned as text for the summary and named on the graded one's rows.
    """
    if lesson_of is None:

        def lesson_of(path: Path) -> str:
            named = [n for n in lesson_names if n == path.stem] or [
                n for n in lesson_names if n in path.stem
            ]
            return named[0] if len(named) == 1 else path.stem

    found: list[Submission] = []
    for path in paths:
        _check_outside_the_course(path)
        if path.is_symlink():
            found.append(Submission(path.name, path, "it is a symbolic link"))
        elif path.is_file():
            student = path.parent.name if path.stem in lesson_names else path.stem
            found.append(Submission(student or path.stem, path))
        elif path.is_dir() and any(p.suffix == ".ipynb" for p in path.iterdir()):
            notebooks, links = _walk(path, recursive=False)
            found += [Submission(path.name, nb) for nb in notebooks]
            found += [Submission(path.name, link, "it is a symbolic link") for link in links]
        elif path.is_dir():
            for learner in sorted(path.iterdir()):
                if learner.is_symlink():
                    found.append(Submission(learner.name, learner, "it is a symbolic link"))
                elif learner.is_dir():
                    notebooks, links = _walk(learner, recursive=True)
                    found += [Submission(learner.name, nb) for nb in notebooks]
                    found += [
                        Submission(learner.name, link, "it is a symbolic link") for link in links
                    ]
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return _one_each(found, lesson_of)


def _one_each(found: list[Submission], lesson_of) -> tuple[list[Submission], list[str]]:
    course, seen = _course_files(), {}
    kept: list[Submission] = []
    for sub in found:
        if sub.refused:
            kept.append(sub)
            continue
        info = sub.path.stat()
        key = (info.st_dev, info.st_ino)
        if key in course:
            kept.append(replace(sub, refused=f"it is the course's own {course[key].name}"))
        elif key in seen:
            kept.append(replace(sub, refused=f"it is the same file as {seen[key]}"))
        else:
            seen[key] = f"{sub.student_id}/{sub.path.name}"
            kept.append(sub)
    groups: dict[tuple[str, str], list[Submission]] = {}
    for sub in kept:
        if not sub.refused:
            groups.setdefault((sub.student_id, lesson_of(sub.path)), []).append(sub)
    chosen, duplicates = {}, []
    for (student, lesson), subs in groups.items():
        subs.sort(key=lambda s: (s.path.stem != lesson, len(s.path.parts), str(s.path)))
        first, rest = subs[0], subs[1:]
        names = tuple(str(s.path) for s in rest)
        chosen[id(first)] = replace(first, others=names)
        duplicates += [
            f"{student}/{s.path.name} ({s.path}): another notebook of {lesson}; "
            f"{first.path} was graded" for s in rest
        ]  # fmt: skip
        for s in rest:
            chosen[id(s)] = None
    result = [chosen.get(id(s), s) for s in kept]
    return [s for s in result if s is not None], duplicates


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
    watch = outcome.get("watch")
    if isinstance(watch, dict):
        computed = watch.get("computed")
        if isinstance(computed, list) and computed:
            return grade(
                0.0, "failed",
                f"{exercise.function} computes with PyTorch: {computed[0]}; write the "
                "result with your kernel",
                "\n".join(map(str, computed[:5])),
            )  # fmt: skip
        if isinstance(watch.get("unlaunched"), int) and watch["unlaunched"] > 0:
            return grade(
                0.0, "failed",
                f"{exercise.function} returned a tensor that none of your kernels received "
                f"({watch['unlaunched']} of {watch.get('calls')} calls): launch your kernel "
                "on the output and return it",
            )  # fmt: skip
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


def _zero_rows(sub: Submission, lesson: Lesson, reason: str, flags=()) -> list[ExerciseGrade]:
    return [
        ExerciseGrade(
            sub.student_id,
            lesson.name,
            e.grade_id,
            0.0,
            e.points,
            "failed",
            safe_text(f"{sub.path.name}: {reason}"),
            flags=tuple(flags),
        )  # fmt: skip
        for e in lesson.exercises
    ]


NO_LESSON = "(no lesson)"


def _refused_row(sub: Submission) -> ExerciseGrade:
    """The one row of a refused submission whose lesson cannot be told."""
    return ExerciseGrade(
        sub.student_id, NO_LESSON, "(submission)", 0.0, 0.0, "not graded",
        safe_text(f"{sub.path.name}: not graded: {sub.refused}; hand in the notebook itself"),
        flags=(f"refused: {sub.refused}",),
    )  # fmt: skip


def grade_submission(
    submission: Submission,
    lesson: Lesson,
    limits: sandbox.Limits,
    roots: list[Path],
    stop: threading.Event | None = None,
) -> list[ExerciseGrade]:
    """Grade one notebook against `lesson`: one ExerciseGrade per exercise."""
    if submission.refused:
        return _zero_rows(
            submission, lesson, f"not graded: {submission.refused}; hand in the notebook itself",
            (f"refused: {submission.refused}",),
        )  # fmt: skip
    try:
        answers = read_answers(lesson, submission.path)
    except SubmissionError as error:
        return _zero_rows(submission, lesson, str(error))
    if submission.others:
        answers.notes.append(
            "also handed in, not graded: " + ", ".join(Path(p).name for p in submission.others)
        )
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
        "--memory-limit", type=float, default=None,
        help="GiB of address space for the learner's process (default: 8 in the interpreter, "
        "none on a GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--unsandboxed", action="store_true",
        help="grade without bubblewrap: the learner's code runs as you, unprotected",
    )  # fmt: skip
    parser.add_argument("--no-namespaces", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.no_namespaces:
        print(
            "error: --no-namespaces is gone: the grader's sandbox is bubblewrap now. Pass "
            "--unsandboxed to grade without it (the learner's code then runs as you)",
            file=sys.stderr,
        )
        return 2
    lessons_dir = args.lessons.resolve()
    lesson_names = {p.stem for p in lessons_dir.glob("*.ipynb")}

    def lesson_of(path: Path) -> str:
        try:
            return lesson_path(path, lessons_dir, args.lesson).stem
        except LessonError:
            return path.stem

    try:
        submissions, duplicates = find_submissions(args.submissions, lesson_names, lesson_of)
        out = args.out.resolve()
        sandbox.check_free_space([out, Path(tempfile.gettempdir())])
    except (FileNotFoundError, SubmissionsError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    memory = sandbox.default_memory_limit()
    if args.memory_limit is not None:
        memory = int(args.memory_limit * 2**30) if args.memory_limit > 0 else None
    hidden = (*args.submissions, out, lessons_dir, SOLUTIONS)
    limits = sandbox.Limits(
        args.cell_timeout, args.notebook_timeout, args.seed, not args.unsandboxed,
        tuple(Path(p) for p in hidden), memory,
    )  # fmt: skip
    if limits.sandboxed:
        try:
            sandbox.check_sandbox(limits.hidden, args.submissions)
        except sandbox.SandboxUnavailable as error:
            print(
                f"error: {error}\nThe grader runs learners' code only in its sandbox. To grade "
                "work you trust without it, pass --unsandboxed.",
                file=sys.stderr,
            )
            return 2
    try:
        writer = ResultsWriter(args.out)
    except (FileExistsError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in [*sandbox.isolation_lines(limits), sandbox.limit_lines(limits)]:
        print(line, file=sys.stderr)
    # every lesson is read before any learner code runs, from the course's own files
    lessons: dict[Path, Lesson] = {}
    not_graded: list[str] = []
    tasks: list[tuple[Submission, Path]] = []
    for sub in submissions:
        try:
            path = lesson_path(sub.path, lessons_dir, args.lesson)
            if path not in lessons:
                lessons[path] = load_lesson(path)
            tasks.append((sub, path))
        except LessonError as error:
            if sub.refused:  # a linked folder, say: refused whatever its lesson
                writer.add(sub.student_id, NO_LESSON, [_refused_row(sub)])
            else:
                not_graded.append(safe_text(f"{sub.student_id}/{sub.path.name}: {error}", 300))
    stop = threading.Event()
    disk_full = []

    def task(sub: Submission, path: Path) -> list[ExerciseGrade]:
        return grade_submission(sub, lessons[path], limits, args.submissions, stop)

    with writer, concurrent.futures.ThreadPoolExecutor(max(1, args.workers)) as pool:
        futures = {pool.submit(task, sub, path): sub for sub, path in tasks}
        progress = tqdm(total=len(futures), desc="grading", unit="notebook")
        recorded = set()

        def give_up_on_the_rest(why: str) -> None:
            stop.set()  # running sandboxes kill their processes and raise Stopped
            for future, sub in futures.items():
                if future not in recorded:
                    future.cancel()
                    not_graded.append(safe_text(f"{sub.student_id}/{sub.path.name}: {why}"))

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
                try:
                    writer.add(sub.student_id, grades[0].assignment, grades)
                except DiskFull as error:
                    disk_full.append(str(error))
                    recorded.discard(future)
                    give_up_on_the_rest("not graded: the disk holding the results is full")
                    progress.write(f"stopped: {error}")
                    break
                score, total = sum(g.score for g in grades), sum(g.max_score for g in grades)
                progress.write(f"{name}: {score:g} / {total:g}")
        except KeyboardInterrupt:
            give_up_on_the_rest("stopped")
            progress.write("stopped: the notebooks listed in summary.md were not graded")
        finally:
            progress.close()
        print(writer.finish(not_graded, duplicates))
    if disk_full:
        return 3
    return 130 if stop.is_set() else 0
