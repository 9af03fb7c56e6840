"""The benchmark's recording of the launches a finished kernel makes, so that it can time
the same launches made bare (`bench.bare_launches`) and report the autotuners' choices.

While a recording runs, the lean launcher's two ways to launch (`run_compiled`,
`launch_plain`) and a bound launch's call are wrapped; outside one they are left as they
are, so that no call pays for a recording that nobody makes. Launches made as trials
(`course_lib.kernels._launch.trial_launches`, a route timed on its first call) are left
out. Launches are recorded for one thread at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from course_lib.kernels import _launch
from course_lib.kernels._launch import BoundLaunch, LeanLauncher


@dataclass
class Launch:
    """One launch as `kernel[grid](*args, **kwargs)` would make it: the bare launch."""

    kernel: object  # the @triton.jit function
    grid: tuple[int, int, int]
    args: tuple
    kwargs: dict
    tuned: dict = field(default_factory=dict)  # the autotuner's config, where it chose one

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


_recorded: list[Launch] | None = None  # where the innermost recording puts its launches


def _record(launcher: LeanLauncher, grid, args: tuple, meta: dict, config: dict) -> None:
    if _recorded is not None and not _launch.trials:
        if callable(grid):
            grid = grid(launcher.named_arguments(args, meta, config))
        grid = (*grid, 1, 1)[:3]
        _recorded.append(Launch(launcher.jit, grid, args, {**meta, **config}, config))


@contextlib.contextmanager
def _wrapped() -> Iterator[None]:
    run_compiled, launch_plain = LeanLauncher.run_compiled, LeanLauncher.launch_plain
    bound_call = BoundLaunch.__call__

    def recorded_run(self, entry, grid, args, meta, device):
        _record(self, entry.grid if entry.grid is not None else grid, args, meta, entry.config)
        return run_compiled(self, entry, grid, args, meta, device)

    def recorded_plain(self, grid, args, meta):
        compiled, config = launch_plain(self, grid, args, meta)
        _record(self, grid, args, meta, config)
        return compiled, config

    def tagged_call(self, *args):
        first = None if _recorded is None else len(_recorded)
        bound_call(self, *args)
        if self.tuned and first is not None:
            for launch in _recorded[first:]:
                launch.tuned = dict(self.tuned)

    LeanLauncher.run_compiled, LeanLauncher.launch_plain = recorded_run, recorded_plain
    BoundLaunch.__call__ = tagged_call
    try:
        yield
    finally:
        LeanLauncher.run_compiled, LeanLauncher.launch_plain = run_compiled, launch_plain
        BoundLaunch.__call__ = bound_call


@contextlib.contextmanager
def recording_launches() -> Iterator[list[Launch]]:
    """Yields a list that fills with every launch a LeanLauncher makes in the block (those
    of an inner recording go to that one's list only)."""
    global _recorded
    saved, _recorded = _recorded, []
    try:
        if saved is None:
            with _wrapped():
                yield _recorded
        else:
            yield _recorded
    finally:
        _recorded = saved
