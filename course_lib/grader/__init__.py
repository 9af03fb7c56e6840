"""Grade learners' exercise notebooks by running them.

    python -m course_lib.grader SUBMISSION.ipynb [...] [--csv grades.csv] [--timeout 900]

Each submission runs top to bottom in a fresh Jupyter kernel (errors do not stop
it). A graded cell (nbgrader metadata ``"grade": true``: the check cells) earns its
points when it runs without an error and its source is the one the course shipped;
an edited check cell earns nothing. Submissions are read, never written.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from course_lib.builder import NOTEBOOKS


@dataclass
class GradedCell:
    grade_id: str
    points: float
    earned: float
    reason: str


def _graded_cells(nb) -> dict[str, nbformat.NotebookNode]:
    return {
        c.metadata["nbgrader"]["grade_id"]: c
        for c in nb.cells
        if c.get("metadata", {}).get("nbgrader", {}).get("grade", False)
    }


def _error_line(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            lines = output.get("traceback") or []
            # CheckFailed renders its report as the traceback; its first line says it all
            first = next((line for line in lines if line.strip()), "")
            plain = _strip_ansi(first) if first else ""
            return (
                plain if "✗" in plain else f"{output['ename']}: {output['evalue']}".splitlines()[0]
            )
    return None


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def grade(path: Path, timeout: int = 900, shipped_dir: Path = NOTEBOOKS) -> list[GradedCell]:
    """Run one submission and grade its check cells against the shipped notebook."""
    submission = nbformat.read(path, as_version=4)
    shipped_path = shipped_dir / path.name
    generated_from = submission.metadata.get("course", {}).get("generated_from")
    if generated_from:
        shipped_path = shipped_dir / Path(generated_from).name
    if not shipped_path.exists():
        raise FileNotFoundError(
            f"{path}: no course notebook named {shipped_path.name}; keep the lesson's file name"
        )
    shipped = _graded_cells(nbformat.read(shipped_path, as_version=4))
    # a cell that runs past the timeout is interrupted, and the notebook goes on
    client = NotebookClient(
        submission,
        interrupt_on_timeout=True,
        timeout=timeout,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    ran = _graded_cells(submission)
    results = []
    for grade_id, reference in shipped.items():
        points = float(reference.metadata["nbgrader"].get("points", 0))
        cell = ran.get(grade_id)
        if cell is None:
            results.append(GradedCell(grade_id, points, 0.0, "check cell missing"))
        elif cell.source.strip() != reference.source.strip():
            results.append(GradedCell(grade_id, points, 0.0, "check cell was edited"))
        elif (error := _error_line(cell)) is not None:
            results.append(GradedCell(grade_id, points, 0.0, error))
        else:
            results.append(GradedCell(grade_id, points, points, "passed"))
    return results


def main(argv: list[str] | None = None) -> int:
    from tqdm.auto import tqdm

    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grader",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("submissions", nargs="+", type=Path)
    parser.add_argument("--csv", type=Path, help="also write one row per graded cell here")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)
    if args.csv and args.csv.exists():
        print(f"error: {args.csv} exists; choose another name", file=sys.stderr)
        return 2

    with contextlib.ExitStack() as stack:
        writer = None
        if args.csv:
            # rows are written as each submission finishes, so an interrupted run keeps them
            writer = csv.writer(stack.enter_context(args.csv.open("w", newline="")))
            writer.writerow(["submission", "grade_id", "earned", "points", "reason"])
        for path in tqdm(args.submissions, desc="grading", unit="notebook"):
            try:
                cells = grade(path, args.timeout)
            except Exception as error:  # noqa: BLE001  (one broken submission must not stop the rest)
                reason = f"not graded: {type(error).__name__}: {error}".splitlines()[0]
                print(f"{path}: {reason}", file=sys.stderr)
                if writer:
                    writer.writerow([str(path), "", 0, "", reason])
                continue
            earned, total = sum(c.earned for c in cells), sum(c.points for c in cells)
            print(f"{path}: {earned:g} / {total:g}")
            for c in cells:
                print(f"  {c.grade_id:<24} {c.earned:g}/{c.points:g}  {c.reason}")
                if writer:
                    writer.writerow([str(path), c.grade_id, c.earned, c.points, c.reason])
    return 0


if __name__ == "__main__":
    sys.exit(main())
