"""What the GPU-only cells showed on a real GPU, for learners running without one.

The solution notebooks keep the outputs of their ``gpu_only`` cells from a GPU run, with
the GPU and versions they ran on (``builder --adopt-gpu-outputs`` records both). The
builder copies them into ``course_lib/gpu_recordings/<lesson>.json``. In the
interpreter, ``gpu_only`` then shows the recording of the cell it was called from
below its "skipped" line, so the prose about those plots and tables has them to
point at. On a GPU nothing changes: the cell measures live.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

RECORDINGS = Path(__file__).resolve().parent / "gpu_recordings"


def label(recorded_on: str) -> str:
    return (
        f"📼 Recorded on {recorded_on} with the course's solution. "
        "On a GPU, this cell measures yours.\n"
    )


@functools.cache
def _all() -> tuple[dict, ...]:
    entries = []
    for path in sorted(RECORDINGS.glob("*.json")):
        entries += json.loads(path.read_text())
    return tuple(entries)


def find(step: str, source: str | None) -> dict | None:
    """The recording of the cell with this source; failing that (a learner edited the
    cell), of the one cell anywhere that runs this step."""
    entries = _all()
    if source is not None:
        for entry in entries:
            if entry["source"].strip() == source.strip():
                return entry
    same_step = [entry for entry in entries if entry["step"] == step]
    return same_step[0] if len(same_step) == 1 else None


def _running_cell() -> str | None:
    """The source of the notebook cell being run, or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    history = shell.history_manager.input_hist_raw
    return history[-1] if history else None


def show(step: str) -> None:
    """Display the recording of the running notebook cell, if there is one."""
    source = _running_cell()
    entry = find(step, source) if source is not None else None
    if entry is None:
        return
    from IPython.display import display

    print(label(entry["recorded_on"]), end="")
    for output in entry["outputs"]:
        if output["output_type"] == "stream":
            print(output["text"], end="")
        elif "data" in output:
            display(output["data"], raw=True, metadata=output.get("metadata") or None)
