"""Record the grader's results on disk: a CSV for the instructor, feedback for each learner.

    with ResultsWriter(Path("results")) as results:
        results.add("alice", "01_vector_add", grades)   # rows are on disk when this returns
        summary = results.finish(not_graded=["bob/02_relu.ipynb"])

writes ``results/grades.csv``, ``results/feedback/<learner>.md``, ``results/summary.md``
and ``results/scores.png``.

Everything a submission decides (the learner's name comes from its file or folder name, the
reasons and reports from its code and outputs) is untrusted text. So every text field goes
through :func:`safe_text` (no terminal escapes, no control characters, a bounded length),
CSV fields cannot start a spreadsheet formula, learners' names cannot choose where a file is
written, a report cannot close its code fence, and Markdown from a learner cannot become
links or HTML in the instructor's summary.
"""

from __future__ import annotations

import csv
import errno
import io
import math
import numbers
import os
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STATUSES = ("passed", "failed", "not graded")

CSV_HEADER = (
    "student_id",
    "assignment",
    "grade_id",
    "score",
    "max_score",
    "status",
    "reason",
    "flags",
)

TRUNCATION_MARKER = "… [truncated]"
REASON_LIMIT = 300  # one line in a spreadsheet cell or a terminal
REPORT_LIMIT = 20_000  # a checker's report lists every case; room for all of them
FILE_STEM_LIMIT = 100

# OSC/DCS/SOS/PM/APC strings (window titles, hyperlinks), CSI sequences (colours, cursor
# moves), then any other escape: together they cover what a terminal would act on
_TERMINAL_ESCAPE = re.compile(
    r"\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\|$)"
    r"|\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
)
# a spreadsheet reads a cell starting with one of these as a formula (OWASP: CSV injection)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Markdown punctuation that could make a learner's text into a link, HTML, a table cell
# break or emphasis; a backslash before ASCII punctuation always renders it literally
_MARKDOWN_ACTIVE = re.compile(r"([\\`*_\[\]<>|#!~&])")
_UNSAFE_FILE_CHAR = re.compile(r"[^A-Za-z0-9._-]")


SUMMARY_RESERVE = 1024 * 1024  # bytes set aside for summary.md, so a full disk still gets one


class DiskFull(OSError):
    """The disk holding the results filled up: what was written before is intact."""


@dataclass(frozen=True)
class ExerciseGrade:
    """One exercise of one learner's notebook, as graded."""

    student_id: str  # the learner: a submission's folder name, or its file stem
    assignment: str  # the lesson, e.g. "01_vector_add"
    grade_id: str  # e.g. "check-vector-add"
    score: float
    max_score: float
    status: str  # one of STATUSES
    reason: str  # one line for the CSV and the terminal
    report: str = ""  # the checker's full report (multi-line), for the learner's feedback
    flags: tuple[str, ...] = ()  # things the instructor should review by hand

    def __post_init__(self):
        for name in ("student_id", "assignment", "grade_id", "status", "reason", "report"):
            _require_str(getattr(self, name), f"ExerciseGrade.{name}")
        if self.status not in STATUSES:
            raise ValueError(
                f"ExerciseGrade.status is {self.status!r}; use one of {', '.join(STATUSES)}"
            )
        for name in ("score", "max_score"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"ExerciseGrade.{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"ExerciseGrade.{name} must be finite, got {value!r}")
        if self.max_score < 0:
            raise ValueError(f"ExerciseGrade.max_score must be >= 0, got {self.max_score!r}")
        if isinstance(self.flags, str) or not isinstance(self.flags, tuple):
            raise TypeError(
                f"ExerciseGrade.flags must be a tuple of strings, got {self.flags!r}; "
                "write flags=(flag,) for a single one"
            )
        for flag in self.flags:
            _require_str(flag, "each of ExerciseGrade.flags")


def safe_text(text: str, limit: int = 2000) -> str:
    """``text`` without terminal escapes or control characters, at most ``limit`` characters.

    Newlines and tabs stay; a carriage return becomes a newline (a progress bar's lines stay
    apart). Longer text is cut and ends with TRUNCATION_MARKER, still within ``limit``.
    """
    _require_str(text, "safe_text's text")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= len(TRUNCATION_MARKER):
        raise ValueError(
            f"safe_text's limit must be an int above {len(TRUNCATION_MARKER)} "
            f"(room for the truncation marker), got {limit!r}"
        )
    text = _TERMINAL_ESCAPE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    if len(text) > limit:
        text = text[: limit - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER
    return text


class ResultsWriter:
    """Writes RESULTS/grades.csv, RESULTS/feedback/<student_id>.md and RESULTS/summary.md (+
    RESULTS/scores.png). Use as a context manager.

    ``add()`` puts a learner's rows on disk before it returns, so a run stopped later keeps
    everything added so far; ``finish()`` writes the summary and the histogram. Leaving the
    ``with`` block closes the CSV without writing a summary: call ``finish()`` for that.
    """

    def __init__(self, out_dir: Path):
        if not isinstance(out_dir, (str, os.PathLike)):
            raise TypeError(f"out_dir must be a path, got {out_dir!r}")
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} is a file; give the results a new directory name")
        if out_dir.is_dir() and any(out_dir.iterdir()):
            raise FileExistsError(
                f"{out_dir} already holds files and results are never overwritten; "
                "give a new directory name, or move the old results away first"
            )
        self.out_dir = out_dir
        self.feedback_dir = out_dir / "feedback"
        self.feedback_dir.mkdir(parents=True, exist_ok=True)
        self._feedback_dir_resolved = self.feedback_dir.resolve()
        # the summary's room is taken first: a disk that fills up later still gets its summary
        with (out_dir / "summary.md").open("wb") as reserve:
            reserve.write(
                b"# Grading summary\n\nThe run has not finished.\n".ljust(SUMMARY_RESERVE)
            )
            reserve.flush()
            os.fsync(reserve.fileno())
        # unbuffered: a row that fails to reach the disk leaves nothing behind to flush later
        self._csv_file = (out_dir / "grades.csv").open("wb", buffering=0)
        self._write_csv([CSV_HEADER])
        self._sync_csv()
        self._broken = False
        self._file_stems: dict[str, str] = {}  # student_id -> feedback file stem
        self._taken_stems: set[str] = set()  # casefolded: unique on any file system
        self._grades: list[ExerciseGrade] = []
        self._learners: dict[str, None] = {}  # insertion-ordered set
        self._finished = False

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the CSV; everything added so far is already on disk."""
        if not self._csv_file.closed:
            try:
                self._csv_file.close()
            except OSError:  # the rows written are synced already; what failed was cut off
                pass

    def add(self, student_id: str, assignment: str, grades: list[ExerciseGrade]) -> None:
        """Record one graded notebook: its CSV rows (flushed to disk) and its feedback section."""
        if self._finished or self._csv_file.closed:
            raise RuntimeError("this ResultsWriter is finished or closed; start a new one")
        _require_str(student_id, "student_id")
        _require_str(assignment, "assignment")
        if isinstance(grades, (str, ExerciseGrade)) or not isinstance(grades, Sequence):
            raise TypeError("grades must be a list of ExerciseGrade, one per exercise")
        # check everything before writing anything, so a bad call leaves no partial record
        for grade in grades:
            if not isinstance(grade, ExerciseGrade):
                raise TypeError(f"grades must hold ExerciseGrade objects, got {grade!r}")
            if (grade.student_id, grade.assignment) != (student_id, assignment):
                raise ValueError(
                    f"a grade for ({grade.student_id!r}, {grade.assignment!r}) was passed to "
                    f"add({student_id!r}, {assignment!r}, ...); add each notebook's grades "
                    "on their own"
                )
        if self._broken:
            raise DiskFull(errno.ENOSPC, "the disk holding the results is full")
        csv_end = self._csv_file.tell()
        feedback = self._feedback_path(student_id)
        feedback_end = feedback.stat().st_size if feedback.exists() else 0
        try:
            self._write_csv([_csv_row(grade) for grade in grades])
            self._sync_csv()
            self._write_feedback(student_id, assignment, grades)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            # back to the last whole rows: a half-written row would read as a grade
            self._broken = True
            _truncate(self._csv_file.fileno(), csv_end)
            if feedback.exists():
                _truncate_path(feedback, feedback_end)
            raise DiskFull(
                error.errno, f"the disk holding {self.out_dir} is full ({error.strerror})"
            ) from None
        self._grades.extend(grades)
        self._learners[student_id] = None

    def finish(self, not_graded: Sequence[str] = (), duplicates: Sequence[str] = ()) -> str:
        """Write summary.md and scores.png, close the CSV and return the summary's text.

        ``not_graded``: the submissions a Ctrl-C, a crash or a full disk left out; the
        summary lists them. ``duplicates``: a learner's other notebooks of a lesson, which
        were not graded.
        """
        if self._finished:
            raise RuntimeError("finish() was already called; the summary is written")
        if isinstance(not_graded, str) or not isinstance(not_graded, Sequence):
            raise TypeError("not_graded must be a list of submission names, not a single string")
        for name in not_graded:
            _require_str(name, "each of not_graded")
        self._finished = True
        self.close()
        totals = self._learner_totals()
        plotted = bool(totals)
        if plotted:
            try:
                _plot_scores(list(totals.values()), self.out_dir / "scores.png")
            except OSError:  # a full disk: the summary matters more than the picture
                plotted = False
                _truncate_path(self.out_dir / "scores.png", 0)
        summary = self._summary(not_graded, plotted, duplicates)
        data = summary.encode("utf-8")
        # into the room reserved at the start, then cut to size: no new blocks needed
        with (self.out_dir / "summary.md").open("r+b") as f:
            f.write(data[:SUMMARY_RESERVE])
            f.truncate(min(len(data), SUMMARY_RESERVE))
        if len(data) > SUMMARY_RESERVE:
            try:
                with (self.out_dir / "summary.md").open("ab") as f:
                    f.write(data[SUMMARY_RESERVE:])
            except OSError:  # a full disk: the summary's first megabyte is on disk
                pass
        return summary

    # -- feedback ------------------------------------------------------------------------

    def _feedback_path(self, student_id: str) -> Path:
        stem = self._file_stems.get(student_id)
        if stem is None:
            base = _file_stem(student_id)
            stem, n = base, 1
            while stem.casefold() in self._taken_stems:
                n += 1
                suffix = f"-{n}"
                stem = base[: FILE_STEM_LIMIT - len(suffix)] + suffix
            self._taken_stems.add(stem.casefold())
            self._file_stems[student_id] = stem
        path = self.feedback_dir / f"{stem}.md"
        # the stem has no separators and no leading dot; this guards the rule, not a case
        if path.resolve().parent != self._feedback_dir_resolved:
            raise RuntimeError(f"feedback path {path} would leave {self.feedback_dir}")
        return path

    def _write_feedback(self, student_id: str, assignment: str, grades) -> None:
        score = sum(g.score for g in grades)
        max_score = sum(g.max_score for g in grades)
        lines = [
            f"# {_md_inline(assignment)}: feedback for {_md_inline(student_id)}",
            "",
            f"**Total: {score:g} / {max_score:g}**",
            "",
        ]
        if not grades:
            lines += ["No exercises were found in this notebook.", ""]
        for g in grades:
            lines += [
                f"## {_md_inline(g.grade_id)}: {g.score:g} / {g.max_score:g} ({g.status})",
                "",
                _md_inline(g.reason, limit=REASON_LIMIT),
                "",
            ]
            report = safe_text(g.report, limit=REPORT_LIMIT).strip("\n")
            if report:
                fence = _fence_for(report)
                lines += [fence, report, fence, ""]
        # flags are for the instructor: the learner's file never shows them
        with self._feedback_path(student_id).open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    # -- summary -------------------------------------------------------------------------

    def _write_csv(self, rows) -> None:
        text = io.StringIO(newline="")
        csv.writer(text).writerows(rows)
        data = memoryview(text.getvalue().encode("utf-8"))
        while data:
            data = data[self._csv_file.write(data) :]

    def _sync_csv(self) -> None:
        os.fsync(self._csv_file.fileno())

    def _learner_totals(self) -> dict[str, float]:
        totals = {student: 0.0 for student in self._learners}
        for g in self._grades:
            totals[g.student_id] += g.score
        return totals

    def _summary(self, not_graded: Sequence[str], plotted: bool, duplicates=()) -> str:
        n = len(self._learners)
        lines = ["# Grading summary", "", f"{n} learner{'s' if n != 1 else ''} graded.", ""]

        # per assignment: each learner's total on it
        earned: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        possible: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        status_counts: dict[str, Counter] = defaultdict(Counter)
        for g in self._grades:
            earned[g.assignment][g.student_id] += g.score
            possible[g.assignment][g.student_id] += g.max_score
            status_counts[g.assignment][g.status] += 1
        if earned:
            lines += [
                "## Scores by assignment",
                "",
                "| assignment | learners | mean | highest | out of | "
                + " | ".join(STATUSES)
                + " |",
                "|---|---:|---:|---:|---:|" + "---:|" * len(STATUSES),
            ]
            for assignment in sorted(earned):
                scores = list(earned[assignment].values())
                counts = status_counts[assignment]
                lines.append(
                    f"| {_md_inline(assignment)} | {len(scores)} "
                    f"| {sum(scores) / len(scores):.3g} | {max(scores):g} "
                    f"| {max(possible[assignment].values()):g} | "
                    + " | ".join(str(counts[s]) for s in STATUSES)
                    + " |"
                )
            lines.append("")

        overall = Counter(g.status for g in self._grades)
        lines += ["## Exercises by status", ""]
        lines += [f"- {status}: {overall[status]}" for status in STATUSES]
        lines.append("")

        flagged = [(g.student_id, g.grade_id, flag) for g in self._grades for flag in g.flags]
        lines += ["## Flagged for review", ""]
        if flagged:
            lines += ["| learner | grade_id | flag |", "|---|---|---|"]
            lines += [
                f"| {_md_inline(s)} | {_md_inline(gid)} | {_md_inline(flag, REASON_LIMIT)} |"
                for s, gid, flag in flagged
            ]
        else:
            lines.append("Nothing was flagged.")
        lines.append("")

        lines += ["## Not graded", ""]
        if not_graded:
            one = len(not_graded) == 1
            lines += [
                f"{len(not_graded)} submission{' was' if one else 's were'} not graded: the run "
                "was interrupted, crashed or ran out of disk before finishing "
                f"{'it' if one else 'them'}, so "
                f"{'it has' if one else 'they have'} no rows in grades.csv. Grade "
                f"{'it' if one else 'them'} again in a new run:",
                "",
            ]
            lines += [f"- {_md_inline(name)}" for name in not_graded]
        else:
            lines.append("Every submission given was graded.")
        lines.append("")

        if duplicates:
            lines += [
                "## Other notebooks of the same lesson, not graded",
                "",
                "Each learner is graded on one notebook per lesson: the one named after the "
                "lesson, nearest the top of their folder. These were left out:",
                "",
            ]
            lines += [f"- {_md_inline(name)}" for name in duplicates]
            lines.append("")

        renamed = [(student, stem) for student, stem in self._file_stems.items() if stem != student]
        if renamed:
            lines += ["## Feedback files under another name", ""]
            lines += [f"- {_md_inline(student)}: feedback/{stem}.md" for student, stem in renamed]
            lines.append("")

        lines += ["## Total scores", ""]
        if plotted:
            lines.append("![Histogram of learners' total scores](scores.png)")
        else:
            lines.append("No learners were graded, so there is no histogram of scores.")
        return "\n".join(lines) + "\n"


def _truncate(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


def _truncate_path(path: Path, size: int) -> None:
    try:
        os.truncate(path, size)
    except OSError:
        pass


def _require_str(value, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")


def _one_line(text: str, limit: int = 2000) -> str:
    return " ".join(safe_text(text, limit=limit).split())


def _csv_text(text: str, limit: int = 2000) -> str:
    cell = _one_line(text, limit)
    if cell.startswith(_FORMULA_STARTS):
        # the quote counts towards the limit too
        cell = "'" + _one_line(text, limit - 1)
    return cell


def _csv_row(grade: ExerciseGrade) -> list[str]:
    return [
        _csv_text(grade.student_id),
        _csv_text(grade.assignment),
        _csv_text(grade.grade_id),
        format(grade.score, "g"),  # written here, never quoted: always a plain number
        format(grade.max_score, "g"),
        _csv_text(grade.status),
        _csv_text(grade.reason, limit=REASON_LIMIT),
        _csv_text("; ".join(grade.flags)),
    ]


def _md_inline(text: str, limit: int = 2000) -> str:
    """One line of learner text that Markdown shows as written (no links, HTML or cells)."""
    return _MARKDOWN_ACTIVE.sub(r"\\\1", _one_line(text, limit))


def _fence_for(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text``, so it cannot close early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _file_stem(student_id: str) -> str:
    """A file name stem from a learner's name: ASCII letters, digits, '-', '_', '.' only."""
    # accents come off (é -> e) rather than turning whole names into underscores
    # escapes go first, so their parameters leave no trace in the name
    decomposed = unicodedata.normalize("NFKD", _one_line(student_id))
    kept = "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")
    stem = _UNSAFE_FILE_CHAR.sub("_", kept).lstrip(".")[:FILE_STEM_LIMIT]
    return stem or "learner"


def _plot_scores(totals: list[float], path: Path) -> None:
    # a Figure without pyplot draws with Agg and leaves the process's backend alone
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    ax.hist(totals, bins=min(20, len(set(totals))), color="tab:blue", edgecolor="white")
    ax.set_xlabel("total score")
    ax.set_ylabel("learners")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # learners come whole
    ax.set_title(f"Total scores of {len(totals)} learner{'s' if len(totals) != 1 else ''}")
    fig.savefig(path, format="png", dpi=100)
