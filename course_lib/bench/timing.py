"""Timing with device events, and the arithmetic that turns time into throughput."""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib import runtime
from course_lib.bench.recording import recording_launches
from course_lib.gpu_timer import autotune_timer, launch_us, median_ms

__all__ = ["autotune_timer", "bare_launches", "copy_bandwidth", "do_bench_ms", "gb_per_s",
           "launch_us", "median_ms", "tflop_per_s"]  # fmt: skip


def bare_launches(fn: Callable[[], object]) -> Callable[[], None] | None:
    """The kernel launches that one call of `fn()` makes through the finished kernels'
    launchers, as a function that makes them again bare: `kernel[grid](*args, **kwargs)`,
    the same compiled kernels with the same arguments and nothing else. None if `fn`
    launches none that way (torch, or a learner's own launcher)."""
    fn()  # compiled and tuned before the launches are recorded
    with recording_launches() as launches:
        fn()
    if not launches:
        return None
    if len(launches) == 1:
        return launches[0]

    def all_of_them() -> None:
        for launch in launches:
            launch()

    return all_of_them


def do_bench_ms(fn: Callable[[], object]) -> float:
    """`fn()`'s median time in milliseconds by triton.testing.do_bench, its other
    arguments left at their defaults, the way most Triton users time a kernel: L2
    flushed before each run, and the host's launch cost inside the figure wherever it is
    the slower side. The flush, left out of the figure, hides part of the host's time,
    and near the point where the host becomes the slower side the figure jumps between
    runs."""
    if runtime.INTERPRETED:
        raise RuntimeError("timing needs a GPU; guard the call with course_lib.gpu_only(...)")
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median")


def gb_per_s(nbytes: int, ms: float) -> float:
    """Throughput in GB/s (10^9 bytes per second) of moving `nbytes` in `ms` milliseconds."""
    if ms <= 0:
        raise ValueError(f"time must be positive, got {ms} ms")
    return nbytes / (ms * 1e-3) / 1e9


def tflop_per_s(flops: int, ms: float) -> float:
    """Throughput in TFLOP/s (10^12 floating-point operations per second)."""
    if ms <= 0:
        raise ValueError(f"time must be positive, got {ms} ms")
    return flops / (ms * 1e-3) / 1e12


def copy_bandwidth(n_elements: int = 1 << 28, dtype: torch.dtype = torch.float32) -> float:
    """The memory ceiling in GB/s: a device-to-device copy, counting bytes read and written.

    Measure it in the same run as the kernels it bounds: clocks and other tenants
    move it between runs.
    """
    src = torch.randn(n_elements, device=runtime.DEVICE).to(dtype)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return gb_per_s(2 * src.numel() * src.element_size(), ms)
