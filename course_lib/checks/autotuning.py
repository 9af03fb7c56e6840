"""What a learner's `@triton.autotune`d kernel did during a check, and a BLOCK_SIZE to pin.

An autotuned launcher hides two things a check needs: which config ran, and how many
programs the grid gave it. And the autotuner picks one config per size on this GPU, so a
kernel right at that config may still be wrong at the others. While `watching_autotuners`
is active, every autotuned kernel launched goes through a wrapper of `Autotuner.run`
that can pin the kernel to one BLOCK_SIZE (its first config with that block size: a
single config, which the autotuner runs without timing anything) and that records each
launch, or what Triton's error said when the launcher passed a meta-parameter a config
sets too.

It relies on what `Autotuner.run(*args, grid=..., **kwargs)` reads and leaves (its
`configs` list, `best_config`; see course_lib.triton_internals, which wraps it) and on the
wording of two of Triton's errors. Written for triton 3.6 and 3.9.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from course_lib import runtime
from course_lib.triton_internals import Autotuner, wrapping_launches


@dataclass
class TunedLaunch:
    """One launch of an autotuned kernel."""

    grid_is_function: bool  # a function of the meta-parameters, or a fixed tuple
    programs: int | None  # along axis 0, for the config that ran; None if it cannot be known
    config: dict  # the config that ran, as keyword arguments (BLOCK_SIZE, num_warps, ...)


@dataclass
class AutotuneRecord:
    """What the autotuned kernels launched during one call did."""

    launches: list[TunedLaunch] = field(default_factory=list)
    # a meta-parameter the launcher passed although a config sets it (Triton refused it)
    redefined: str | None = None
    # several configs to time, in the interpreter, without a GPU to time them on
    untimeable: bool = False


# Triton's words when a launch passes a meta-parameter a config also sets: the first when
# the autotuner times several configs, the second when one config runs without timing
_CONFLICT = re.compile(r"Conflicting meta-parameters: ([\w, ]+)")
_TWICE = re.compile(r"got multiple values for (?:keyword )?argument '(\w+)'")


def redefined_meta_parameter(error: BaseException, configs) -> str | None:
    """The meta-parameter Triton refused because the launch passed it and a config sets
    it too; None for any other error."""
    match = _CONFLICT.search(str(error)) or _TWICE.search(str(error))
    if match is None:
        return None
    set_by_configs = {name for config in configs for name in config.all_kwargs()}
    names = [name.strip() for name in match.group(1).split(",")]
    return next((name for name in names if name in set_by_configs), None)


def _untimeable(error: BaseException) -> bool:
    """Triton found no GPU driver to time configs with, in the interpreter on a CPU."""
    no_driver = isinstance(error, RuntimeError) and "active drivers" in str(error)
    return runtime.INTERPRETED and no_driver


def with_block_size(config, block_size: int):
    """A copy of a triton.Config with BLOCK_SIZE set to `block_size`."""
    pinned = copy.copy(config)
    pinned.kwargs = {**config.kwargs, "BLOCK_SIZE": block_size}
    return pinned


@contextlib.contextmanager
def watching_autotuners(block_size: int | None = None) -> Iterator[AutotuneRecord]:
    """Record every autotuned launch in the block; with `block_size`, each autotuned kernel
    runs its first config with that BLOCK_SIZE, and nothing else."""
    record = AutotuneRecord()

    def wrap(original):
        def run(self, *args, **kwargs):
            configs = self.configs
            if block_size is not None:
                self.configs = [with_block_size(configs[0], block_size)]
            try:
                result = original(self, *args, **kwargs)
                record.launches.append(_launch(self, args, kwargs))
            except Exception as error:
                record.redefined = record.redefined or redefined_meta_parameter(error, self.configs)
                record.untimeable = record.untimeable or _untimeable(error)
                raise
            finally:
                self.configs = configs
            return result

        return run

    with wrapping_launches(wrap, (Autotuner,)):
        yield record


def _launch(tuner: Autotuner, args: tuple, kwargs: dict) -> TunedLaunch:
    config = tuner.best_config.all_kwargs()
    grid = kwargs.get("grid")
    meta = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    # what Triton hands a grid function: every argument by name, the config's included
    named = {**dict(zip(tuner.arg_names, args)), **meta, **config}
    try:
        programs = int(tuple(grid(named) if callable(grid) else grid)[0])
    except Exception:  # noqa: BLE001  (a grid we cannot work out again is no finding)
        programs = None
    return TunedLaunch(callable(grid), programs, config)
