"""Timing with device events, and the arithmetic that turns time into throughput."""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib import runtime


def median_ms(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of `fn()` in milliseconds, timed with CUDA events after a warm-up.

    `triton.testing.do_bench` flushes the L2 cache between runs, so sizes that
    would fit in the cache are timed from memory, like the large ones.
    """
    if runtime.INTERPRETED:
        raise RuntimeError("timing needs a GPU; guard the call with course_lib.gpu_only(...)")
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


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
