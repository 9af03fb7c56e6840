"""Sweeps: a kernel timed against PyTorch (and other baselines) over sizes or shapes,
next to a ceiling measured in the same run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from course_lib import runtime
from course_lib.bench.timing import (
    bare_launches,
    copy_bandwidth,
    do_bench_ms,
    gb_per_s,
    launch_us,
    median_ms,
    tflop_per_s,
)

Point = int | tuple[int, ...]


def label(point: Point) -> str:
    """'2^20' for a power of two, '4096x781' for a shape, the number otherwise."""
    if isinstance(point, tuple):
        return "x".join(str(p) for p in point)
    if point > 0 and point & (point - 1) == 0:
        return f"2^{point.bit_length() - 1}"
    return str(point)


@dataclass(frozen=True)
class Target:
    """kernel/`baseline` of at least `ratio`, by both timings, at the points `where` picks."""

    baseline: str
    ratio: float
    where: Callable[[Point], bool] = lambda point: True
    described: str = "at every point"


# a finished kernel's launcher may cost this much host time per call, against the bare
# kernel[grid](...) launches of the same compiled kernels with the same arguments
LAUNCH_TARGET = 1.3


@dataclass
class Sweep:
    """Throughput of a kernel and its baselines at each point, and the ceiling."""

    name: str
    dtype: torch.dtype
    ceiling: float
    unit: str = "GB/s"
    ceiling_name: str = "copy bandwidth"
    points: list[Point] = field(default_factory=list)
    kernel: list[float] = field(default_factory=list)
    baselines: dict[str, list[float]] = field(default_factory=dict)
    # the same, timed by triton.testing.do_bench (launch cost included), where measured
    do_bench: dict[str, list[float]] = field(default_factory=dict)
    # host microseconds per call of the kernel's launcher, of its bare launches, of the
    # first baseline and of any other named in run_sweep's host_baselines, where measured
    launch_us: dict[str, list[float]] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    # per point, what the autotuner chose for the kernel's autotuned launches (see
    # tuned_configs): the tile behind a figure, where it jumps between runs
    tuned: list[str] = field(default_factory=list)
    # False where the kernel's call is more than its launcher (a training step through
    # autograd): its host cost is then set beside the first baseline's, with no target
    launcher: bool = True

    def rows(self) -> list[dict]:
        rows = []
        for i, point in enumerate(self.points):
            row = {"point": label(point), "kernel": self.kernel[i]}
            for name, values in self.baselines.items():
                row[name] = values[i]
                row[f"kernel/{name}"] = self.kernel[i] / values[i]
                if self.do_bench:  # times, so baseline over kernel
                    row[f"do_bench kernel/{name}"] = (
                        self.do_bench[name][i] / self.do_bench["kernel"][i]
                    )
            if "bare" in self.do_bench:  # the same launches made bare: the host's limit
                reference = next(iter(self.baselines))
                row[f"do_bench bare/{reference}"] = (
                    self.do_bench[reference][i] / self.do_bench["bare"][i]
                )
            row["kernel/ceiling"] = self.kernel[i] / self.ceiling
            for name, values in self.launch_us.items():
                row[f"{name} launch us"] = values[i]
            rows.append(row)
        return rows

    def table(self) -> str:
        """A markdown table of the sweep, and a line for each target."""
        names = list(self.baselines)
        header = (
            ["size", f"kernel {self.unit}"]
            + [f"{n} {self.unit}" for n in names]
            + [f"kernel/{n}" for n in names]
            + ([f"do_bench kernel/{n}" for n in names] if self.do_bench else [])
            + ([f"do_bench bare/{names[0]}"] if "bare" in self.do_bench else [])
            + ["kernel/ceiling"]
            + ([f"launch µs, {' / '.join(self.launch_us)}"] if self.launch_us else [])
        )
        dtype = str(self.dtype).removeprefix("torch.")
        lines = [
            f"**{self.name}** ({dtype}; ceiling: {self.ceiling_name} "
            f"{self.ceiling:,.0f} {self.unit}, measured in this run)",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---:|" * len(header),
        ]
        for r in self.rows():
            cells = [r["point"], f"{r['kernel']:,.0f}"]
            cells += [f"{r[n]:,.0f}" for n in names]
            cells += [f"{r[f'kernel/{n}']:.3f}" for n in names]
            if self.do_bench:
                cells += [f"{r[f'do_bench kernel/{n}']:.3f}" for n in names]
            if "bare" in self.do_bench:
                ratio = r[f"do_bench bare/{names[0]}"]
                cells.append("—" if math.isnan(ratio) else f"{ratio:.3f}")
            cells.append(f"{r['kernel/ceiling']:.3f}")
            if self.launch_us:
                us = [r[f"{name} launch us"] for name in self.launch_us]
                cells.append(" / ".join("—" if math.isnan(u) else f"{u:.1f}" for u in us))
            lines.append("| " + " | ".join(cells) + " |")
        # the tiles the autotuned kernels ran with: timed there, or taken from a tile table
        notes = self.verdicts() + [
            f"tiles at {label(point)}: {tuned}"
            for point, tuned in zip(self.points, self.tuned)
            if tuned
        ]
        return "\n".join(lines + ([""] + [f"- {note}" for note in notes] if notes else []))

    def verdicts(self) -> list[str]:
        """One line per target: met or not, by each timing, naming the points that miss."""
        lines = []
        for target in self.targets:
            picked = [r for p, r in zip(self.points, self.rows()) if target.where(p)]
            if not picked:
                continue
            ratio = f"kernel/{target.baseline}"
            misses = []
            for timing, column in (("median_ms", ratio), ("do_bench", f"do_bench {ratio}")):
                short = [r for r in picked if column in r and r[column] < target.ratio]
                misses += [f"{r['point']} ({r[column]:.3f}, {timing})" for r in short]
            verdict = "met" if not misses else "missed at " + ", ".join(misses)
            lines.append(f"target {ratio} ≥ {target.ratio} {target.described}: {verdict}")
        if not self.launcher:
            reference = next(iter(self.baselines), None)
            columns = ("kernel launch us", f"{reference} launch us")
            ratios = ", ".join(
                f"{r['point']} {r[columns[0]] / r[columns[1]]:.2f}×"
                for r in self.rows()
                if not any(math.isnan(r.get(column, math.nan)) for column in columns)
            )
            if ratios:
                lines.append(f"host µs per call against {reference}'s (no target): {ratios}")
            return lines
        measured = [r for r in self.rows() if not math.isnan(r.get("bare launch us", math.nan))]
        if measured:
            over = [
                f"{r['point']} ({r['kernel launch us'] / r['bare launch us']:.2f}×)"
                for r in measured
                if r["kernel launch us"] > LAUNCH_TARGET * r["bare launch us"]
            ]
            verdict = "met" if not over else "missed at " + ", ".join(over)
            lines.append(f"target launch µs ≤ {LAUNCH_TARGET}× the bare launch: {verdict}")
        return lines


# the relative error within which a timed kernel must agree with its reference
AGREEMENT = 1e-2


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want| / |want| by norm, in float64: blind to rounding, which moves the fp16
    results of a long dot product by an ulp or two."""
    want = want.detach().double()
    return float((got.detach().double() - want).norm() / want.norm())


def run_sweep(
    sweep: Sweep,
    kernel: Callable[..., torch.Tensor],
    baselines: dict[str, Callable[..., torch.Tensor]],
    points: Sequence[Point],
    make_inputs: Callable[[Point], Sequence[torch.Tensor]],
    throughput: Callable[[Point, float], float],
    rounds: int = 5,
    host_baselines: Sequence[str] = (),
) -> Sweep:
    """Time `kernel` and each baseline at every point; fill `sweep` with throughputs.

    Each point is timed in `rounds` interleaved rounds (kernel, baselines, kernel, ...),
    each round a `median_ms`, and the median round is kept: drift of clocks and cache
    state between rounds then touches every side alike. Small sizes need it: a few
    microseconds per run swing by 10% from one median to the next. The times are GPU
    times. Then each side once more by `do_bench_ms`, which counts the host's launch
    cost in; and the host's cost per call of the kernel, of its bare launches, of the
    first baseline and of those named in `host_baselines`, interleaved in rounds too.
    do_bench of the bare launches alone says how much of a do_bench figure is the launch
    that Triton itself makes.
    """
    if unknown := set(host_baselines) - set(baselines):
        raise ValueError(f"host_baselines names no baseline of this sweep: {sorted(unknown)}")
    if runtime.INTERPRETED:
        raise RuntimeError("sweeps need a GPU; guard the call with course_lib.gpu_only(...)")
    from tqdm.auto import tqdm

    from course_lib.bench.recording import recording_launches

    reference_name, reference = next(iter(baselines.items()))
    fns = {"kernel": kernel, **baselines}
    sweep.baselines = {name: [] for name in baselines}
    sweep.do_bench = {name: [] for name in fns}
    sweep.launch_us = {name: [] for name in ("kernel", "bare", reference_name, *host_baselines)}
    for point in tqdm(points, desc=sweep.name, leave=False):
        inputs = make_inputs(point)
        # a timing of a wrong kernel is worthless: compare once (relative_error)
        with recording_launches() as first:  # where the autotuner chooses, if anywhere
            got = kernel(*inputs).double()
        want = reference(*inputs).double()
        error = relative_error(got, want)
        if not error < AGREEMENT:
            raise AssertionError(f"{sweep.name} at {label(point)}: relative error {error:.1e}")
        calls = {name: (lambda f=fn, a=inputs: f(*a)) for name, fn in fns.items()}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, call in calls.items():
                times[name].append(median_ms(call))
        for name, call in calls.items():
            sweep.do_bench[name].append(do_bench_ms(call))
        hosts = {"kernel": calls["kernel"], "bare": bare_launches(calls["kernel"])}
        bare = hosts["bare"]
        sweep.do_bench.setdefault("bare", []).append(do_bench_ms(bare) if bare else math.nan)
        hosts |= {name: calls[name] for name in (reference_name, *host_baselines)}
        host_us: dict[str, list[float]] = {name: [] for name in hosts}
        for _ in range(rounds):
            for name, call in hosts.items():
                host_us[name].append(math.nan if call is None else launch_us(call))
        for name, values in host_us.items():
            sweep.launch_us[name].append(statistics.median(values))
        sweep.points.append(point)
        sweep.tuned.append(tuned_configs(first))
        sweep.kernel.append(throughput(point, statistics.median(times["kernel"])))
        for name in baselines:
            sweep.baselines[name].append(throughput(point, statistics.median(times[name])))
        del inputs, calls, hosts
    return sweep


def tuned_configs(launches: Sequence) -> str:
    """The autotuner's choice for each autotuned launch among these recorded launches,
    as 'kernel_name BLOCK_M=128 ... num_warps=8 num_stages=3', joined by '; '."""
    described = []
    for launch in launches:
        chosen = {
            name: value for name, value in launch.tuned.items()
            if name.isupper() or name in ("num_warps", "num_stages")
        }  # fmt: skip
        if chosen:
            settings = " ".join(f"{name}={value}" for name, value in chosen.items())
            described.append(f"{launch.kernel.__name__} {settings}")
    return "; ".join(described)


def bandwidth_sweep(
    name: str,
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    *,
    n_inputs: int = 1,
    bytes_moved: Callable[[Point, torch.dtype], int],
    sizes: Sequence[Point] = tuple(1 << p for p in range(12, 29, 2)),
    dtype: torch.dtype = torch.float32,
    ceiling_gbps: float | None = None,
    rounds: int = 5,
    make_inputs: Callable[[Point], Sequence[torch.Tensor]] | None = None,
    others: dict[str, Callable[..., torch.Tensor]] | None = None,
) -> Sweep:
    """GB/s of `kernel` and `reference` (PyTorch) over sizes or shapes.

    Inputs are `n_inputs` random tensors of each size (an int, or a shape), or
    whatever `make_inputs(size)` returns. `bytes_moved(size, dtype)` counts the
    bytes one call must move. `others` adds baselines, such as a torch.compile'd
    version. The ceiling is the device's copy bandwidth, measured now unless given.
    """

    def random_inputs(size: Point) -> list[torch.Tensor]:
        shape = size if isinstance(size, tuple) else (size,)
        return [torch.randn(shape, device=runtime.DEVICE, dtype=dtype) for _ in range(n_inputs)]

    def throughput(size: Point, ms: float) -> float:
        return gb_per_s(bytes_moved(size, dtype), ms)

    ceiling = copy_bandwidth() if ceiling_gbps is None else ceiling_gbps
    sweep = Sweep(name, dtype, ceiling)
    baselines = {"torch": reference, **(others or {})}
    return run_sweep(
        sweep, kernel, baselines, sizes, make_inputs or random_inputs, throughput, rounds
    )


def matmul_peak(dtype: torch.dtype, size: int = 8192) -> float:
    """The compute ceiling in TFLOP/s: torch.matmul on size^3 random matrices of `dtype`."""
    a = torch.randn(size, size, device=runtime.DEVICE, dtype=dtype)
    b = torch.randn(size, size, device=runtime.DEVICE, dtype=dtype)
    return tflop_per_s(2 * size**3, median_ms(lambda: torch.matmul(a, b)))


def flops_sweep(
    name: str,
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    *,
    shapes: Sequence[tuple[int, int, int]],
    dtype: torch.dtype,
    ceiling_tflops: float | None = None,
    rounds: int = 3,
    b_k_major: bool = False,
) -> Sweep:
    """TFLOP/s of a matmul `kernel(a, b)` and `reference` over (M, N, K) shapes.

    a and b are row-major, or with `b_k_major` b is the transpose of a row-major [N, K]
    matrix, as a Linear layer's weight is used. The ceiling is torch.matmul's own rate
    on an 8192^3 product of the same dtype, measured now unless given: the peak this
    GPU reaches in practice.
    """

    def make_inputs(shape):
        m, n, k = shape
        a = torch.randn(m, k, device=runtime.DEVICE, dtype=dtype)
        if b_k_major:
            return a, torch.randn(n, k, device=runtime.DEVICE, dtype=dtype).t()
        return a, torch.randn(k, n, device=runtime.DEVICE, dtype=dtype)

    ceiling = matmul_peak(dtype) if ceiling_tflops is None else ceiling_tflops
    sweep = Sweep(name, dtype, ceiling, unit="TFLOP/s", ceiling_name="torch.matmul at 8192^3")
    throughput = lambda shape, ms: tflop_per_s(2 * math.prod(shape), ms)
    return run_sweep(sweep, kernel, {"torch": reference}, shapes, make_inputs, throughput, rounds)


def plot_sweep(sweep: Sweep, ax=None, path: str | None = None):
    """Plot throughput per point: the kernel, each baseline, and the ceiling (dotted)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    numeric = all(isinstance(p, int) for p in sweep.points)
    x = sweep.points if numeric else list(range(len(sweep.points)))
    ax.plot(x, sweep.kernel, "o-", label=f"Triton {sweep.name}")
    for (name, values), style in zip(sweep.baselines.items(), ["s--", "^-.", "v:", "D--", "x-."]):
        ax.plot(x, values, style, label="PyTorch" if name == "torch" else name)
    ax.axhline(sweep.ceiling, color="gray", linestyle=":", label=f"{sweep.ceiling_name} (ceiling)")
    if numeric:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements")
    else:
        ax.set_xticks(x, [label(p) for p in sweep.points], rotation=30, ha="right")
        ax.set_xlabel("shape")
    ax.set_ylabel(sweep.unit)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{sweep.name}, {str(sweep.dtype).removeprefix('torch.')}")
    ax.legend()
    ax.grid(True, alpha=0.3)
    if path:
        ax.figure.savefig(path, dpi=120, bbox_inches="tight")
    return ax
