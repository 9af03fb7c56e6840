"""The untrusted side of grading: runs one submission's lesson in a process of its own.

Started by sandbox.py as ``python -I -c BOOT JOB_DIR``. It runs the lesson's code cells in
order with the learner's answers in place of the answer cells, and for each check cell
runs the check under `replay.recording()`. It writes only data into JOB_DIR:

    progress.jsonl      one line as each cell starts and ends (the parent's cell timeout)
    exercise-N.json     how check N ended, the learner function's parameters, and what
                        PyTorch computed while that function ran (watch.py)
    records-N.pt        what each case of check N produced (see checks/replay.py)

Nothing here decides a grade: the parent replays the records against its own inputs.
"""

from __future__ import annotations

import builtins
import inspect
import json
import linecache
import os
import sys
import time
import traceback
from pathlib import Path


def _write_json_line(path: Path, entry: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def _signature(fn) -> list[list] | None:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, p.default is not inspect.Parameter.empty] for p in parameters]


def _error_line(error: BaseException) -> str:
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip().splitlines()[-1][:500] if lines else type(error).__name__


def run_cell(source: str, index: int, namespace: dict) -> None:
    """Run one cell's code, its source kept where `inspect` finds it, as Jupyter's kernel does.

    A compiled `@triton.jit` function reads its own source through `inspect`: code compiled
    from a bare string has none, and the decorator refuses it.
    """
    filename = f"<cell {index}>"
    # an entry without a modification time is never dropped by linecache.checkcache
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)


def set_limits(rlimits: dict[str, int]) -> None:
    """Lower this process's limits (soft and hard) before any learner code runs."""
    import resource

    for name, value in rlimits.items():
        limit = getattr(resource, name, None)
        if limit is not None:
            hard = resource.getrlimit(limit)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))


def main(job_dir: str) -> None:
    job_path = Path(job_dir)
    job = json.loads((job_path / "job.json").read_text())
    (job_path / "job.json").unlink()  # the seed and the lesson are not left lying around
    set_limits(job.get("rlimits", {}))
    progress = job_path / "progress.jsonl"

    # the course's own modules, bound before any learner code runs
    import torch

    import course_lib
    from course_lib.checks import CheckFailed, ExerciseNotDone, replay
    from course_lib.checks.engine import grading_seed
    from course_lib.grader.watch import Watch, watched, watching_backwards

    checkers = {e["checker"]: getattr(course_lib, e["checker"], None) for e in job["exercises"]}
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    exercise_index = 0
    errors: dict[str, str] = {}  # function name -> the error of the cell meant to define it
    for index, cell in enumerate(job["cells"]):
        _write_json_line(progress, {"cell": index, "event": "start", "time": time.time()})
        status = "ok"
        if cell["kind"] == "check":
            exercise = job["exercises"][exercise_index]
            outcome = {"grade_id": exercise["grade_id"]}
            fn = namespace.get(exercise["function"])
            outcome["signature"] = _signature(fn) if callable(fn) else None
            watch = Watch()
            with (
                replay.recording() as recorder,
                grading_seed(job["seed"]),
                watching_backwards(namespace, watch),
            ):
                try:
                    if not callable(fn):
                        raised = errors.get(exercise["function"])
                        raise NameError(
                            f"{exercise['function']} is not defined: "
                            + (f"its cell raised {raised}" if raised else "did its cell run?")
                        )
                    # a plain function is watched; an operator (lesson 08's custom_op) is
                    # checked through torch.compile, where a dispatch mode cannot follow
                    if inspect.isfunction(fn) or inspect.ismethod(fn):
                        outcome["watch"] = watch
                        fn = watched(fn, watch)
                    checkers[exercise["checker"]](fn)
                    outcome["status"] = "passed"
                except ExerciseNotDone as error:
                    outcome.update(status="not done", message=str(error)[:500])
                except CheckFailed:
                    outcome["status"] = "failed"
                except BaseException as error:  # noqa: BLE001  (the learner's code may raise anything)
                    outcome.update(status="error", message=_error_line(error))
            if outcome.get("watch") is watch:
                outcome["watch"] = watch.as_record()
            torch.save(recorder.records, job_path / f"records-{exercise_index}.pt")
            (job_path / f"exercise-{exercise_index}.json").write_text(json.dumps(outcome))
            exercise_index += 1
            status = outcome["status"]
        else:
            try:
                run_cell(cell["source"], index, namespace)
            except BaseException as error:  # noqa: BLE001
                status = "error: " + _error_line(error)
                for exercise in job["exercises"]:
                    if f"def {exercise['function']}(" in cell["source"]:
                        errors[exercise["function"]] = _error_line(error)
        _write_json_line(progress, {"cell": index, "event": "end", "status": status[:500]})
    sys.stdout.flush()
    os._exit(0)  # threads the learner started must not keep this process alive
