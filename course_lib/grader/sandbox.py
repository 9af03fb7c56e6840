"""Run one submission's lesson in a process of its own, and bring back only data.

Where the machine allows it (Linux with unprivileged user namespaces, and util-linux's
``unshare``), the process also gets namespaces of its own: no network, its own process IDs
(when it ends, everything it started ends too, whatever session it moved to), and a view
of the file system in which the submissions and the results folder are empty, locked
mounts it cannot remove. Elsewhere only the process is isolated, and the grader says so.

The process (child.py) starts in a fresh temporary directory, which is also its home and
its Triton cache, with a minimal environment and Python in isolated mode (``-I``): no
PYTHON* variables, no user site, and not the current directory on sys.path. Its sys.path
is the grader's own minus anything under a submission or the current directory, so
``course_lib`` always comes from the installed course. It runs in a session of its own,
and the whole process group is killed when a cell or the notebook runs past its limit,
when the run is stopped, and in any case once it is done. Its output is kept up to a cap
and the rest drained. The directory is removed afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_lib import runtime
from course_lib.grader.lesson import Answers, Lesson

OUTPUT_CAP = 64 * 1024  # bytes of the child's printed output kept for the report
RECORDS_CAP = 256 * 1024 * 1024  # bytes of one check's records the grader reads
BOOT = (
    "import json, sys; job = json.load(open(sys.argv[1] + '/job.json'));"
    "sys.path[:0] = job['sys_path']; from course_lib.grader.child import main; main(sys.argv[1])"
)
_PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "SYSTEMROOT")


# an outer user namespace (root inside, to mount), with its own mounts, network and PIDs;
# the inner one, without a user mapping, leaves the learner's code no privilege there, and
# makes the outer mounts locked: they cannot be removed to uncover what they hide
_UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--kill-child",
            "--mount-proc"]  # fmt: skip
_HIDE_THEN_RUN = (
    'while [ "$1" != -- ]; do mount -t tmpfs -o size=4k,mode=000 none "$1" || exit 97; '
    'shift; done; shift; unshare --user --mount "$@"'
)  # sh stays PID 1, so the learner's process is an ordinary one that signals can reach
HIDE_FAILED = 97


@functools.cache
def namespaces_work() -> bool:
    """Whether this machine lets the grader hide folders from the learner's process."""
    probe = Path(tempfile.mkdtemp(prefix="course-grade-probe-"))
    try:
        done = subprocess.run(
            [*_UNSHARE, "sh", "-c", _HIDE_THEN_RUN, "sh", str(probe), "--", "true"],
            capture_output=True,
            timeout=30,
        )
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _hideable(paths: list[Path], needed: list[Path]) -> list[Path]:
    """The folders among `paths` that can be hidden: existing, and holding nothing the
    process needs (the course, Python, its own folder)."""
    hide = []
    for path in paths:
        folder = path if path.is_dir() else path.parent
        folder = folder.resolve()
        if folder.is_dir() and not any(n == folder or folder in n.parents for n in needed):
            hide.append(folder)
    # a folder inside another hidden one is hidden with it (and cannot be mounted on)
    return sorted({h for h in hide if not any(o in h.parents for o in hide)})


class Stopped(Exception):
    """The run was stopped (Ctrl-C) while this submission was running."""


@dataclass
class Limits:
    cell_s: float = 300.0
    notebook_s: float = 1200.0
    seed: int = 1  # moves every check's cases off the ones learners' check cells show
    namespaces: bool = True  # where the machine allows them (namespaces_work())
    hidden: tuple[Path, ...] = ()  # folders the learner's process must not see


@dataclass
class SandboxRun:
    """What came back from one run: per exercise index, the child's outcome and records."""

    outcomes: dict[int, dict] = field(default_factory=dict)
    records: dict[int, list] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    cells: dict[int, str] = field(default_factory=dict)  # cell index -> "ok" / "error: ..."
    stopped_at: int | None = None  # the cell running when the process ended early
    ended: str = ""  # why it ended early: "timed out (cell)", "died (signal 9)", ...
    output: str = ""  # the child's printed output, capped


def _trusted_sys_path(submissions: list[Path]) -> list[str]:
    course_root = str(Path(__file__).resolve().parents[2])
    submitted, here = [p.resolve() for p in submissions], Path.cwd().resolve()
    kept = [course_root]
    for entry in sys.path:
        if not entry or entry in kept:
            continue
        resolved = Path(entry).resolve()
        if resolved == here or any(resolved == s or s in resolved.parents for s in submitted):
            continue
        kept.append(entry)
    return kept


def _environment(job_dir: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
    env.update(
        HOME=str(job_dir),
        TMPDIR=str(job_dir),
        LANG="C.UTF-8",
        MPLBACKEND="Agg",
        TRITON_CACHE_DIR=str(job_dir / ".triton"),
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",  # several submissions run at once, one core each
    )
    if runtime.INTERPRETED:
        env["TRITON_INTERPRET"] = "1"
    return env


def _job(lesson: Lesson, answers: Answers, sys_path: list[str], seed: int) -> dict:
    cells = []
    for cell in lesson.cells:
        if cell["kind"] == "answer":
            cells.append({"kind": "answer", "source": answers.sources.get(cell["grade_id"], "")})
        else:
            cells.append({"kind": cell["kind"], "source": cell["source"]})
    exercises = [
        {"grade_id": e.grade_id, "checker": e.checker, "function": e.function}
        for e in lesson.exercises
    ]
    return {"cells": cells, "exercises": exercises, "sys_path": sys_path, "seed": seed}


def _drain(stream, kept: bytearray) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        if len(kept) < OUTPUT_CAP:
            kept += chunk[: OUTPUT_CAP - len(kept)]


def _progress(path: Path) -> tuple[int | None, float | None, dict[int, str]]:
    """The cell running now and since when, and how finished cells ended."""
    running, since, ended = None, None, {}
    try:
        with path.open("rb") as f:
            lines = f.read(4 * 1024 * 1024).splitlines()
    except FileNotFoundError:
        return None, None, {}
    for line in lines:
        try:
            entry = json.loads(line)
            cell = int(entry["cell"])
        except (ValueError, KeyError, TypeError):
            continue
        if entry.get("event") == "start":
            running, since = cell, float(entry.get("time", time.time()))
        elif entry.get("event") == "end":
            ended[cell] = str(entry.get("status", ""))[:500]
            running, since = None, None
    return running, since, ended


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    lesson: Lesson,
    answers: Answers,
    submissions: list[Path],
    limits: Limits,
    stop: threading.Event | None = None,
) -> SandboxRun:
    """Run the lesson with these answers in a fresh sandbox; raise Stopped if `stop` is set."""
    job_dir = Path(tempfile.mkdtemp(prefix="course-grade-"))
    result = SandboxRun()
    try:
        sys_path = _trusted_sys_path(submissions)
        job = _job(lesson, answers, sys_path, limits.seed)
        (job_dir / "job.json").write_text(json.dumps(job))
        command = [sys.executable, "-I", "-c", BOOT, str(job_dir)]
        if limits.namespaces and namespaces_work():
            needed = [Path(p).resolve() for p in (*sys_path, sys.prefix, sys.executable)]
            hide = _hideable([*submissions, *limits.hidden], [*needed, job_dir.resolve()])
            command = [*_UNSHARE, "sh", "-c", _HIDE_THEN_RUN, "sh", *map(str, hide), "--", *command]
        proc = subprocess.Popen(
            command,
            cwd=job_dir,
            env=_environment(job_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
        kept = bytearray()
        reader = threading.Thread(target=_drain, args=(proc.stdout, kept), daemon=True)
        reader.start()
        started = time.monotonic()
        try:
            while proc.poll() is None:
                if stop is not None and stop.is_set():
                    raise Stopped()
                time.sleep(0.2)
                running, since, _ = _progress(job_dir / "progress.jsonl")
                if since is not None and time.time() - since > limits.cell_s:
                    result.ended = f"a cell ran past its {limits.cell_s:g} s limit"
                    break
                if time.monotonic() - started > limits.notebook_s:
                    result.ended = f"the notebook ran past its {limits.notebook_s:g} s limit"
                    break
        finally:
            _kill_group(proc)
            proc.wait()
            reader.join(timeout=5)
        running, _, result.cells = _progress(job_dir / "progress.jsonl")
        if proc.returncode == HIDE_FAILED and not result.cells and not result.ended:
            result.ended = "the sandbox could not hide the submissions from it"
        if running is not None:
            result.stopped_at = running
            if not result.ended:
                # under namespaces a shell reports the learner's process: 128 + the signal
                code = proc.returncode
                signal_number = -code if code < 0 else code - 128 if code > 128 else 0
                result.ended = (
                    f"the process died (signal {signal_number})"
                    if signal_number
                    else f"it exited (status {code})"
                )
        result.output = kept.decode("utf-8", "replace")
        for index in range(len(lesson.exercises)):
            _collect(job_dir, index, result)
        return result
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _collect(job_dir: Path, index: int, result: SandboxRun) -> None:
    outcome_path, records_path = job_dir / f"exercise-{index}.json", job_dir / f"records-{index}.pt"
    if not outcome_path.is_file():
        return
    try:
        outcome = json.loads(outcome_path.read_text()[:100_000])
        if not isinstance(outcome, dict):
            raise ValueError("not an object")
        result.outcomes[index] = outcome
        if records_path.stat().st_size > RECORDS_CAP:
            raise ValueError(f"its records are larger than {RECORDS_CAP // 2**20} MiB")
        records = torch.load(records_path, map_location="cpu", weights_only=True)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ValueError("its records are not a list of records")
        result.records[index] = records
    except Exception as error:  # noqa: BLE001  (whatever the child left, it is only data)
        result.unreadable[index] = f"{type(error).__name__}: {error}"[:300]
