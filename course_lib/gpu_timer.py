"""The GPU's own time for a call, and the timer the finished kernels' autotuners use.

Below the kernels (they import it for their autotuners' `do_bench`) and below the
benchmark (course_lib.bench re-exports it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from course_lib import runtime

_FLUSH_BYTES = 256 << 20  # several times any L2 cache
_flush_and_clock: dict[int, tuple[torch.Tensor, float]] = {}  # per device, made once


def launch_us(fn: Callable[[], object], calls: int = 20) -> float:
    """Host time in microseconds that one call of `fn()` takes to return: for a kernel
    launcher, Python's and the driver's cost of queuing the launch, while the GPU works
    through the queue behind it."""
    if runtime.INTERPRETED:
        raise RuntimeError("timing needs a GPU; guard the call with course_lib.gpu_only(...)")
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


# True in course_lib.bench.tile_search's compiling processes: an autotuner's configs are
# each launched once, which compiles them, and not timed
compile_only = False


def autotune_timer(
    kernel_call: Callable[[], object], quantiles: Sequence[float] | None = None
) -> float | list[float]:
    """The timer the finished kernels' autotuners compare their configs by (their
    `do_bench`): median_ms, the GPU's time alone, given for every quantile asked (Triton
    asks for three and compares the first). Triton's default, do_bench, counts the host's
    launch cost in wherever the host is the slower side, by different amounts from one
    tuning to the next, and so can keep a slower tile (figures in lesson 02)."""
    if compile_only:
        kernel_call()
        ms = 0.0
    else:
        ms = median_ms(kernel_call)
    return ms if quantiles is None else [ms] * len(quantiles)


def median_ms(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median GPU time of `fn()` in milliseconds, timed with CUDA events after a warm-up.

    Before each timed call the L2 cache is flushed (a 256 MB buffer is zeroed), so sizes
    that fit in the cache are timed from memory like the large ones. Then the GPU is
    given a wait of three times the host's launch time (`launch_us`), so that `fn`'s
    launches are queued before the start event is reached: the time is the GPU's,
    however slow the host. A small kernel can take less GPU time than Python takes to
    launch it; code that calls many of them is bound by the host, which `launch_us`
    measures.
    """
    if runtime.INTERPRETED:
        raise RuntimeError("timing needs a GPU; guard the call with course_lib.gpu_only(...)")
    device = torch.cuda.current_device()
    if device not in _flush_and_clock:
        flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        _flush_and_clock[device] = flush, _gpu_cycles_per_us()
    flush, cycles_per_us = _flush_and_clock[device]
    # the wait covers the launch of fn plus those of the flush, the wait and the events
    wait_cycles = int((3 * launch_us(fn) + 50) * cycles_per_us)

    def timed(runs: int) -> list[float]:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(runs)
        ]
        for start, end in events:
            flush.zero_()
            torch.cuda._sleep(wait_cycles)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    estimate = max(statistics.median(timed(5)), 1e-4)  # a function with no GPU work: ~0
    timed(max(1, min(100, int(warmup_ms / estimate))))
    # a median of 500 runs is steady; more would only cost flushes
    return statistics.median(timed(max(10, min(500, int(rep_ms / estimate)))))


def _gpu_cycles_per_us() -> float:
    """The GPU's clock, from the time of a fixed number of cycles of torch.cuda._sleep,
    after a first spin that lets an idle GPU raise its clock."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e3)
