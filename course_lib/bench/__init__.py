"""Benchmarks: timing, bytes and FLOP arithmetic, the measured ceiling, plots, report.

Everything here times on a GPU only; in the interpreter, guard calls with
``course_lib.gpu_only("timing")``. ``python -m course_lib.bench`` (or
``./course bench``) runs every finished kernel's benchmark and writes a report.
"""

from course_lib.bench.sweep import (
    Sweep,
    Target,
    bandwidth_sweep,
    flops_sweep,
    matmul_peak,
    plot_sweep,
)
from course_lib.bench.timing import (
    autotune_timer,
    bare_launches,
    copy_bandwidth,
    do_bench_ms,
    gb_per_s,
    launch_us,
    median_ms,
    tflop_per_s,
)

__all__ = [
    "Sweep",
    "Target",
    "autotune_timer",
    "bare_launches",
    "bandwidth_sweep",
    "copy_bandwidth",
    "do_bench_ms",
    "flops_sweep",
    "gb_per_s",
    "launch_us",
    "matmul_peak",
    "median_ms",
    "plot_sweep",
    "tflop_per_s",
]
