"""Build the exercise notebooks in notebooks/ from the solved lessons in solutions/.

    python -m course_lib.builder            # write every stale notebook
    python -m course_lib.builder --check    # exit 1 if any notebook is stale
    python -m course_lib.builder --force    # also replace notebooks you edited (backed up)

Exercise cells carry nbgrader metadata (``"solution": true``) and mark their answers
the nbgrader way::

    ### BEGIN SOLUTION
    ...the answer...
    ### END SOLUTION

Each region becomes a stub with the region's indentation. In plain Python the stub
raises course_lib.ExerciseNotDone (a NotImplementedError); inside a ``@triton.jit``
function, where ``raise`` does not compile, it is a ``tl.static_assert(False, ...)``
that fails at launch. Every
exercise cell must hold at least one plain-Python region, so that running an
unsolved notebook stops at its first exercise with ExerciseNotDone. Outputs
are cleared, except the recorded GPU run of a ``gpu_only`` cell, which is kept under
a line naming the GPU it ran on (see recordings.py) and also written to
course_lib/gpu_recordings/ for learners running without a GPU.

A learner may work in notebooks/ directly, so the builder never overwrites a
notebook whose cells differ from what it generated last time (it keeps a
fingerprint in the notebook's metadata) unless told to with --force, and then it
keeps a backup beside it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_lib import recordings
from course_lib.recordings import label as label_for

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, NOTEBOOKS = ROOT / "solutions", ROOT / "notebooks"
RECORDINGS = recordings.RECORDINGS
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_MARKER = re.compile(r"^(\s*)### (BEGIN|END) SOLUTION\s*$")


def is_appendix(path: Path) -> bool:
    """An optional appendix to a lesson, such as 05b_matmul_on_hopper.ipynb: read and run,
    with no exercise to build or grade."""
    return re.match(r"\d+[a-z]_", path.name) is not None


class BuildError(ValueError):
    """A solution notebook breaks the rules above; the message says where."""


@dataclass(frozen=True)
class Region:
    begin: int  # line index of BEGIN
    end: int  # line index of END
    indent: str
    in_kernel: bool


def _is_solution(cell) -> bool:
    return cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get(
        "solution", False
    )


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "exercise")


def _kernel_spans(source: str, where: str) -> list[tuple[int, int]]:
    """0-based line spans of the @triton.jit functions in a cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise BuildError(f"{where}: the solution cell does not parse: {error}") from error
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            if any("jit" in ast.unparse(d) for d in node.decorator_list):
                spans.append((node.lineno - 1, node.end_lineno - 1))
    return spans


def find_regions(source: str, where: str) -> list[Region]:
    """The solution regions of a cell, checked for balanced markers."""
    lines = source.splitlines()
    kernels = _kernel_spans(source, where)
    regions, open_at = [], None
    for i, line in enumerate(lines):
        match = _MARKER.match(line)
        if not match:
            continue
        indent, kind = match.groups()
        if kind == "BEGIN":
            if open_at is not None:
                raise BuildError(f"{where}, line {i + 1}: BEGIN SOLUTION inside another region")
            open_at = (i, indent)
        else:
            if open_at is None:
                raise BuildError(f"{where}, line {i + 1}: END SOLUTION without BEGIN SOLUTION")
            begin, indent = open_at
            in_kernel = any(start <= begin <= stop for start, stop in kernels)
            regions.append(Region(begin, i, indent, in_kernel))
            open_at = None
    if open_at is not None:
        raise BuildError(f"{where}, line {open_at[0] + 1}: BEGIN SOLUTION is never closed")
    return regions


def stub_source(source: str, grade_id: str, where: str) -> str:
    """The exercise version of a solution cell's source."""
    regions = find_regions(source, where)
    if not regions:
        raise BuildError(f"{where}: an exercise cell without a {BEGIN} region")
    if all(r.in_kernel for r in regions):
        raise BuildError(
            f"{where}: every region is inside a @triton.jit function; put one in the "
            "launcher too, so an unsolved notebook stops here with ExerciseNotDone"
        )
    lines = source.splitlines()
    out, cursor = [], 0
    for r in regions:
        out += lines[cursor : r.begin]
        message = f"Exercise {grade_id!r}: replace this line with your code (see the TODOs above)."
        if r.in_kernel:
            out.append(f"{r.indent}tl.static_assert(False, {message!r})")
        else:
            out.append(f"{r.indent}raise course_lib.ExerciseNotDone({message!r})")
        cursor = r.end + 1
    out += lines[cursor:]
    return "\n".join(out)


def _region_lines(source: str, where: str) -> list[list[str]]:
    """Each solution region of a cell, as its stripped non-blank lines."""
    lines = source.splitlines()
    return [
        [line.strip() for line in lines[r.begin + 1 : r.end] if line.strip()]
        for r in find_regions(source, where)
    ]


def answer_lines(source: str) -> list[str]:
    """The code lines (no comments) inside a cell's solution regions."""
    return [
        line
        for region in _region_lines(source, "cell")
        for line in region
        if not line.startswith("#")
    ]


def answer_regions(nb) -> list[list[str]]:
    """Each solution region of a notebook's exercise cells, as its non-blank lines."""
    return [
        region
        for index, cell in enumerate(nb.cells)
        if _is_solution(cell)
        for region in _region_lines(cell.source, f"cell {index}")
    ]


def fingerprint(nb) -> str:
    """A hash of the cells' types and sources: what a learner's edits change."""
    cells = [(c.cell_type, c.source) for c in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def build_notebook(solution_path: Path) -> nbformat.NotebookNode:
    """The exercise notebook generated from one solution notebook."""
    nb = copy.deepcopy(nbformat.read(solution_path, as_version=4))
    rel = solution_path.relative_to(ROOT) if solution_path.is_relative_to(ROOT) else solution_path
    for index, cell in enumerate(nb.cells):
        where = f"{rel}, cell {index}"
        has_marker = BEGIN in cell.source or END in cell.source
        if _is_solution(cell):
            cell.source = stub_source(cell.source, _grade_id(cell), where)
        elif has_marker:
            raise BuildError(
                f"{where}: solution markers in a cell without nbgrader solution metadata"
            )
        if cell.cell_type == "code":
            recorded_on = recorded_run(cell)
            if recorded_on:
                label = nbformat.v4.new_output("stream", name="stdout", text=label_for(recorded_on))
                cell.outputs = [label, *cell.outputs]
            else:
                cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nb.metadata["course"] = {
        "generated_from": str(rel),
        "fingerprint": fingerprint(nb),
        "note": "Generated from the solution notebook; edit that one, then rebuild.",
    }
    return nb


def _serialise(nb) -> str:
    return nbformat.writes(nb) + "\n"


def _gpu_step(source: str) -> str | None:
    """The step a cell's gpu_only("...") call names, if it makes one."""
    match = re.search(r'gpu_only\(\s*"([^"]+)"', source)
    return match.group(1) if match else None


def _source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def recorded_run(cell) -> str | None:
    """Where and when a GPU-only solution cell's outputs were recorded ("<GPU> · torch
    <version> · triton <version> · <date>"), or None if they were not, or if the cell's
    code has changed since: those outputs no longer show what it does."""
    if cell.cell_type != "code" or not cell.outputs or not _gpu_step(cell.source):
        return None
    recorded = cell.metadata.get("course", {})
    if recorded.get("source_sha") != _source_sha(cell.source):
        return None
    return recorded.get("recorded_on")


def recordings_of(solution_path: Path) -> list[dict]:
    """The GPU-only cells of a solution notebook that hold a recorded GPU run."""
    nb = nbformat.read(solution_path, as_version=4)
    return [
        {
            "step": _gpu_step(cell.source),
            "source": cell.source,
            "recorded_on": recorded_on,
            "outputs": cell.outputs,
        }
        for cell in nb.cells
        if (recorded_on := recorded_run(cell))
    ]


def _recordings_text(solution_path: Path) -> str | None:
    entries = recordings_of(solution_path)
    return json.dumps(entries, indent=1, ensure_ascii=False) + "\n" if entries else None


def _edited_by_learner(path: Path) -> bool:
    current = nbformat.read(path, as_version=4)
    recorded = current.metadata.get("course", {}).get("fingerprint")
    return recorded != fingerprint(current)


def build_all(
    check: bool = False,
    force: bool = False,
    src_dir: Path = SOLUTIONS,
    out_dir: Path = NOTEBOOKS,
    recordings_dir: Path | None = None,
) -> list[str]:
    """Build every lesson and its GPU recordings; returns the files that were (or, with
    check, would be) written. Recordings of other solutions than the course's go beside
    out_dir unless recordings_dir says where."""
    if recordings_dir is None:
        recordings_dir = RECORDINGS if src_dir == SOLUTIONS else out_dir.parent / RECORDINGS.name
    changed = _build_recordings(src_dir, recordings_dir, check)
    for source in sorted(src_dir.glob("*.ipynb")):
        target = out_dir / source.name
        text = _serialise(build_notebook(source))
        if target.exists() and target.read_text() == text:
            continue
        changed.append(target.name)
        if check:
            continue
        if target.exists() and _edited_by_learner(target):
            if not force:
                print(
                    f"kept {target}: it has edits of yours. Move it away, or run with --force "
                    "(which keeps a backup) to replace it."
                )
                changed.remove(target.name)
                continue
            backup = target.with_name(f"{target.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
            target.rename(backup)
            print(f"your version of {target.name} is saved as {backup.name}")
        out_dir.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    return changed


def _build_recordings(src_dir: Path, recordings_dir: Path, check: bool) -> list[str]:
    """Write recordings_dir/<lesson>.json from each solution; drop those of lessons gone
    or without recordings. The files are generated: nobody edits them."""
    wanted = {
        f"{path.stem}.json": text
        for path in sorted(src_dir.glob("*.ipynb"))
        if (text := _recordings_text(path)) is not None
    }
    changed = []
    present = sorted(recordings_dir.glob("*.json")) if recordings_dir.exists() else []
    for path in present:
        if path.name not in wanted:
            changed.append(f"{recordings_dir.name}/{path.name}")
            if not check:
                path.unlink()
    for name, text in wanted.items():
        path = recordings_dir / name
        if path.exists() and path.read_text() == text:
            continue
        changed.append(f"{recordings_dir.name}/{name}")
        if not check:
            recordings_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    return changed


def _ran_on(executed, path: Path) -> str | None:
    """The GPU and versions an executed notebook's first cell reported, and the day it
    ran; None if it ran in the interpreter (show_environment prints "Mode: GPU: <name> ·
    torch ..."). The day comes from the execution times nbclient records, else the file."""
    for cell in executed.cells:
        if cell.cell_type != "code" or "show_environment()" not in cell.source:
            continue
        for output in cell.outputs:
            for line in output.get("text", "").splitlines():
                if line.startswith("Mode: GPU: "):
                    started = cell.metadata.get("execution", {}).get("iopub.execute_input")
                    day = (
                        started[:10]
                        if started
                        else time.strftime("%Y-%m-%d", time.gmtime(path.stat().st_mtime))
                    )
                    return f"{line.removeprefix('Mode: GPU: ').strip()} · {day}"
    return None


def adopt_gpu_outputs(executed_dir: Path, src_dir: Path = SOLUTIONS) -> list[str]:
    """Copy the outputs of GPU-only cells from executed copies into the solutions.

    Solution notebooks keep the outputs a reader benefits from, the plots and tables
    of a real GPU run, and no others. A cell qualifies when it calls gpu_only(...)
    and its source is unchanged in the executed copy; stderr (progress bars,
    warnings) and widget outputs are dropped. Each adopted cell records the GPU and
    versions it ran on, which the exercise notebooks and recordings show with it. A
    notebook that did not run on a GPU is refused.
    """
    updated = []
    for executed_path in sorted(executed_dir.glob("*.ipynb")):
        target = src_dir / executed_path.name
        if not target.exists():
            continue
        solution = nbformat.read(target, as_version=4)
        executed = nbformat.read(executed_path, as_version=4)
        ran_on = _ran_on(executed, executed_path)
        if ran_on is None:
            print(
                f"not adopted: {executed_path} did not run on a GPU (its show_environment() "
                "cell reports no GPU)"
            )
            continue
        by_source = {c.source: c for c in executed.cells if c.cell_type == "code"}
        changed = False
        for cell in solution.cells:
            ran = by_source.get(cell.source)
            if cell.cell_type != "code" or "gpu_only(" not in cell.source or ran is None:
                continue
            outputs = [
                o
                for o in ran.outputs
                if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
                and "application/vnd.jupyter.widget-view+json" not in o.get("data", {})
            ]
            recording = {"recorded_on": ran_on, "source_sha": _source_sha(cell.source)}
            if (outputs, ran.execution_count, recording) != (
                cell.outputs,
                cell.execution_count,
                cell.metadata.get("course"),
            ):
                # nbval refuses a cell with outputs and no execution count ("unrun")
                cell.outputs, cell.execution_count, changed = outputs, ran.execution_count, True
                cell.metadata["course"] = recording
        if changed:
            nbformat.write(solution, target)
            updated.append(target.name)
    return updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.builder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    parser.add_argument("--force", action="store_true", help="replace edited notebooks too")
    parser.add_argument(
        "--adopt-gpu-outputs", type=Path, metavar="DIR",
        help="first copy the GPU-only cells' outputs from executed notebooks in DIR",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.adopt_gpu_outputs:
        for name in adopt_gpu_outputs(args.adopt_gpu_outputs):
            print(f"adopted GPU outputs into solutions/{name}")
    try:
        changed = build_all(check=args.check, force=args.force)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check and changed:
        print("stale: " + ", ".join(changed) + " (run: python -m course_lib.builder)")
        return 1
    if not changed:
        print("notebooks/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
