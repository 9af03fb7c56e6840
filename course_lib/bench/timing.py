"""Timing with device events, and the arithmetic that turns time into throughput."""

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


def bare_launches(fn: Callable[[], object]) -> Callable[[], None] | None:
    """The kernel launches that one call of `fn()` makes through the finished kernels'
    launchers, as a function that makes them again bare: `kernel[grid](*args, **kwargs)`,
    the same compiled kernels with the same arguments and nothing else. None if `fn`
    launches none that way (torch, or a learner's own launcher)."""
    from course_lib.kernels._launch import recording_launches

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


def autotune_timer(
    kernel_call: Callable[[], object], quantiles: Sequence[float] | None = None
) -> float | list[float]:
    """The timer the finished kernels' autotuners compare their configs by (their
    `do_bench`): median_ms, the GPU's time alone, given for every quantile asked (Triton
    asks for three and compares the first). Triton's default, do_bench, counts the host's
    cost in wherever the host takes longer to launch than the L2 flush takes to run (see
    do_bench_ms), and an autotuner launches through Triton's whole Python path. On an H200
    whose host was slow, do_bench read lesson 06's TMA tiles, which take 22-32 µs, up to
    20 µs high, by different amounts from one tuning to the next: at 32x128x28x28 it kept
    a 26.2 µs tile over a 22.2 µs one, and the layer's ratio to cuDNN fell from 0.96 to 0.78
    in one run of the benchmark. In 18 tunings of three layers with this timer, every pick
    was within 0.4 µs of that layer's fastest tile."""
    ms = median_ms(kernel_call)
    return ms if quantiles is None else [ms] * len(quantiles)


def do_bench_ms(fn: Callable[[], object]) -> float:
    """`fn()`'s median time in milliseconds by triton.testing.do_bench, its other
    arguments left at their defaults, the way most Triton users time a kernel: L2
    flushed before each run, and the host's launch cost inside the figure wherever it is
    the slower side. The flush, left out of the figure, hides part of the host's time,
    and near the point where the host becomes the slower side the figure jumps between
    runs. Measured on an H100 with a 4096-element add behind a busy host: 20 µs of host
    time per call did not show, 40 to 80 µs showed in part and differently from run to
    run, and from 100 µs on the figure read about the host's time, within 30 µs either
    way."""
    if runtime.INTERPRETED:
        raise RuntimeError("timing needs a GPU; guard the call with course_lib.gpu_only(...)")
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median")


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
