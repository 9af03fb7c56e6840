"""Run every finished kernel's benchmark; write a markdown report and plots.

python -m course_lib.bench [--out bench_results] [--only add relu]
python -m course_lib.bench --only attention_tutorial --triton-tutorial PATH
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import course_lib
from course_lib import runtime


def main(argv: list[str] | None = None) -> int:
    from course_lib.bench.suites import SUITE_PARTS, SUITES

    parser = argparse.ArgumentParser(prog="python -m course_lib.bench", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument(
        "--only", nargs="+", choices=sorted(SUITES) + sorted(SUITE_PARTS), default=sorted(SUITES),
        help="the suites to run (all by default); linear_transformer: the linear suite's "
        "transformer shapes alone; attention_tutorial: ours against Triton's fused-attention "
        "tutorial, which needs --triton-tutorial",
    )  # fmt: skip
    parser.add_argument(
        "--triton-tutorial", type=Path, metavar="PATH",
        help="Triton's fused-attention tutorial, python/tutorials/06-fused-attention.py in a "
        "checkout of Triton's repository (it is not installed with Triton)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    runners = {**SUITES, **SUITE_PARTS}
    if "attention_tutorial" in args.only:
        if args.triton_tutorial is None:
            parser.error("--only attention_tutorial needs --triton-tutorial PATH")
        if not args.triton_tutorial.is_file() or args.triton_tutorial.suffix != ".py":
            parser.error(f"--triton-tutorial: no Python file at {args.triton_tutorial}")
    elif args.triton_tutorial is not None:
        parser.error("--triton-tutorial is for --only attention_tutorial")

    course_lib.show_environment()
    if not course_lib.gpu_only("Benchmarking"):
        return 0

    import matplotlib

    matplotlib.use("Agg")
    from course_lib.bench.sweep import Sweep, plot_sweep
    from course_lib.bench.timing import copy_bandwidth

    if args.triton_tutorial is not None:  # a file that does not import fails now, not late
        from course_lib.bench.suites import load_tutorial

        runners["attention_tutorial"] = functools.partial(
            runners["attention_tutorial"], tutorial=load_tutorial(args.triton_tutorial)
        )
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling = copy_bandwidth()
    sections = [
        f"# Benchmarks\n\n{runtime.describe()}\n\nGPU time, median of many runs after a "
        f"warm-up, L2 flushed before each run and the host's launch cost kept out "
        f"(bench.median_ms). The do_bench columns time the same calls with "
        f"triton.testing.do_bench (default arguments, median), which counts the launch cost "
        f"in wherever the host is slower than the GPU (the flush between calls hides part of "
        f"it, so near that point its figures jump between runs). The host microseconds per "
        f"call are in the last column: the kernel's launcher, the same kernel launches made "
        f"bare (kernel[grid](...) with the same arguments), and the baselines it names. "
        f"Ceiling: device copy bandwidth, {ceiling:,.0f} GB/s, measured in this run.\n"
    ]
    report = args.out / "report.md"
    for name in args.only:
        for result in runners[name](ceiling):
            section = result.table()
            print(section, end="\n\n", flush=True)
            if isinstance(result, Sweep):  # a table of first calls has nothing to plot
                plot_sweep(result, path=str(args.out / f"{result.name}.png"))
                section += f"\n\n![{result.name}]({result.name}.png)"
            sections.append(section + "\n")
            report.write_text("\n".join(sections))  # after each sweep: a long run keeps its part
    print(f"report written to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
