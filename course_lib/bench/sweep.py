"""Bandwidth sweeps over sizes: kernel vs PyTorch vs the measured ceiling."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from course_lib import runtime
from course_lib.bench.timing import copy_bandwidth, gb_per_s, median_ms


@dataclass
class Sweep:
    """One kernel timed against PyTorch over sizes, with the ceiling of the same run."""

    name: str
    dtype: torch.dtype
    ceiling_gbps: float
    sizes: list[int] = field(default_factory=list)
    kernel_gbps: list[float] = field(default_factory=list)
    torch_gbps: list[float] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [
            {
                "n": n,
                "kernel GB/s": k,
                "torch GB/s": t,
                "kernel/torch": k / t,
                "kernel/ceiling": k / self.ceiling_gbps,
            }
            for n, k, t in zip(self.sizes, self.kernel_gbps, self.torch_gbps)
        ]

    def table(self) -> str:
        """A markdown table of the sweep."""
        lines = [
            f"**{self.name}** ({str(self.dtype).removeprefix('torch.')}; "
            f"ceiling: copy bandwidth {self.ceiling_gbps:,.0f} GB/s)",
            "",
            "| n | kernel GB/s | torch GB/s | kernel/torch | kernel/ceiling |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows():
            lines.append(
                f"| 2^{r['n'].bit_length() - 1} | {r['kernel GB/s']:,.0f} | {r['torch GB/s']:,.0f} "
                f"| {r['kernel/torch']:.3f} | {r['kernel/ceiling']:.3f} |"
            )
        return "\n".join(lines)


def bandwidth_sweep(
    name: str,
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    *,
    n_inputs: int,
    bytes_moved: Callable[[int, torch.dtype], int],
    sizes: Sequence[int] = tuple(1 << p for p in range(12, 29, 2)),
    dtype: torch.dtype = torch.float32,
    ceiling_gbps: float | None = None,
    rounds: int = 5,
) -> Sweep:
    """Time `kernel` and `reference` on random inputs of each size; GB/s from `bytes_moved`.

    Each size is timed in `rounds` interleaved rounds (kernel, PyTorch, kernel, ...),
    each round a do_bench median, and the median round is kept: drift of clocks and
    cache state between rounds then touches both sides alike. Small sizes need it:
    a few microseconds per run swing by 10% from one do_bench call to the next.
    """
    if runtime.INTERPRETED:
        raise RuntimeError("sweeps need a GPU; guard the call with course_lib.gpu_only(...)")
    from tqdm.auto import tqdm

    if ceiling_gbps is None:
        ceiling_gbps = copy_bandwidth()
    sweep = Sweep(name, dtype, ceiling_gbps)
    for n in tqdm(sizes, desc=name, leave=False):
        inputs = [torch.randn(n, device=runtime.DEVICE, dtype=dtype) for _ in range(n_inputs)]
        torch.testing.assert_close(kernel(*inputs), reference(*inputs))
        kernel_ms, torch_ms = [], []
        for _ in range(rounds):
            kernel_ms.append(median_ms(lambda a=inputs: kernel(*a)))
            torch_ms.append(median_ms(lambda a=inputs: reference(*a)))
        nbytes = bytes_moved(n, dtype)
        sweep.sizes.append(n)
        sweep.kernel_gbps.append(gb_per_s(nbytes, statistics.median(kernel_ms)))
        sweep.torch_gbps.append(gb_per_s(nbytes, statistics.median(torch_ms)))
    return sweep


def plot_sweep(sweep: Sweep, ax=None, path: str | None = None):
    """Plot GB/s over size: the kernel, PyTorch, and the ceiling as a dashed line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    ax.plot(sweep.sizes, sweep.kernel_gbps, "o-", label=f"Triton {sweep.name}")
    ax.plot(sweep.sizes, sweep.torch_gbps, "s--", label="PyTorch")
    ax.axhline(sweep.ceiling_gbps, color="gray", linestyle=":", label="copy bandwidth (ceiling)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{sweep.name}, {str(sweep.dtype).removeprefix('torch.')}")
    ax.legend()
    ax.grid(True, alpha=0.3)
    if path:
        ax.figure.savefig(path, dpi=120, bbox_inches="tight")
    return ax
