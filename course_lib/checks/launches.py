"""Count the Triton kernel launches a learner's function makes during a check.

A checker that only compares outputs would pass `lambda x, y: x + y`: PyTorch, not a
kernel. Both ways a kernel can run, compiled and interpreted, go through a `run` method;
while counting, those methods are wrapped (`triton_internals.wrapping_launches`), and
autotuned kernels are counted through the kernel they run. The finished kernels' lean
launches skip `run` once a kernel is compiled, and are counted at
`LeanLauncher.run_compiled`. `recording_grids` wraps the same `run` methods to record
each launch's grid, and can run only the first programs of it.
"""

from __future__ import annotations

import contextlib

from course_lib.triton_internals import wrapping_launches


@contextlib.contextmanager
def counting_launches():
    """Yields a one-element list holding the number of launches so far."""
    count = [0]

    def wrap(run):
        def counted(self, *args, warmup=False, **kwargs):
            if not warmup:
                count[0] += 1
            return run(self, *args, warmup=warmup, **kwargs)

        return counted

    def counted_compiled(self, *args, **kwargs):
        count[0] += 1
        return run_compiled(self, *args, **kwargs)

    from course_lib.kernels._launch import LeanLauncher

    run_compiled = LeanLauncher.run_compiled
    LeanLauncher.run_compiled = counted_compiled
    try:
        with wrapping_launches(wrap):
            yield count
    finally:
        LeanLauncher.run_compiled = run_compiled


@contextlib.contextmanager
def recording_grids(first_programs: int | None = None):
    """Yields a list that receives the grid of each launch, as the launcher asked for it.

    With `first_programs`, each launch runs only the programs 0 .. first_programs - 1
    of its grid's first axis: what the first programs of a grid computed shows the
    order in which a kernel hands out its tiles.
    """
    grids: list[tuple[int, ...]] = []

    def limited(grid: tuple[int, ...]) -> tuple[int, ...]:
        grid = tuple(grid)
        grids.append(grid)
        if first_programs is None or not grid:
            return grid
        return (min(grid[0], first_programs), *grid[1:])

    def wrap(run):
        def recorded(self, *args, grid, warmup=False, **kwargs):
            if not warmup:
                if callable(grid):
                    grid = lambda meta, asked=grid: limited(asked(meta))
                else:
                    grid = limited(grid)
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)

        return recorded

    with wrapping_launches(wrap):
        yield grids


class LaunchOnFakeTensors(RuntimeError):
    """A kernel was about to be launched with fake tensors, which have no memory."""


@contextlib.contextmanager
def refusing_fake_launches():
    """Raise LaunchOnFakeTensors instead of launching a kernel with a fake tensor among its
    arguments. On a GPU such a launch reads a pointer that points nowhere, and the illegal
    memory access that follows leaves the CUDA context unusable."""
    from torch._subclasses.fake_tensor import FakeTensor

    from course_lib.kernels._launch import LeanLauncher

    def refuse_fakes(args, kwargs) -> None:
        # LeanLauncher.run_compiled takes the kernel's arguments as one tuple
        values = [*args, *kwargs.values()]
        values += [v for a in values if isinstance(a, (tuple, list)) for v in a]
        if any(isinstance(v, FakeTensor) for v in values):
            raise LaunchOnFakeTensors("a kernel was launched with fake tensors")

    def wrap(run):
        def refusing(self, *args, **kwargs):
            refuse_fakes(args, kwargs)
            return run(self, *args, **kwargs)

        return refusing

    run_compiled = LeanLauncher.run_compiled
    LeanLauncher.run_compiled = wrap(run_compiled)
    try:
        with wrapping_launches(wrap):
            yield
    finally:
        LeanLauncher.run_compiled = run_compiled
