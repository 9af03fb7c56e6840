"""Measure the tile table of this GPU (see course_lib.kernels.tile_table): every finished
kernel called at the shapes models and the benchmark use, its autotuners free to time every
config, and each choice they make saved.

python -m course_lib.bench.tile_search --out FILE [--only matmul linear] [--compilers 8]

Compiling the configs is most of the work, and the GPU sits idle through it: `--compilers`
child processes first call the same kernels, each config launched once and not timed,
filling Triton's cache on disk; then this process times every config alone on the GPU,
loading the compiled kernels. FILE is written after each kernel's calls, so an interrupted
search keeps its part; an existing FILE is kept as FILE.bak. Point COURSE_TILE_TABLE at
FILE to use it, or copy it to course_lib/kernels/tile_tables/ under the name that
tile_table.gpu_kind gives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import triton

from course_lib import gpu_timer, runtime
from course_lib.kernels import tile_table

# (M, N, K) of plain products: cubes, the long and flat shapes between them, and a few rows
# against large matrices (a batch of tokens through a layer), which the cubes are too far
# from to stand for (tile_table.MAX_OCTAVES)
PRODUCTS = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
            (8192, 8192, 8192), (4096, 4096, 1024), (1024, 1024, 4096), (8192, 8192, 2048),
            (2048, 2048, 8192), (16, 4096, 4096), (64, 8192, 8192)]  # fmt: skip
# (tokens, in, out) of Linear layers: transformer MLPs and projections, and the benchmark's
LAYERS = [(tokens, i, o) for tokens in (4096, 16384)
          for i, o in ((768, 3072), (3072, 768), (1024, 4096), (4096, 1024), (4096, 11008),
                       (11008, 4096))] + [(1024, 1024, 1024), (8192, 4096, 4096)]  # fmt: skip
# (B, C, H, O, k, stride, padding): the conv2d benchmark's layers
CONVOLUTIONS = [(32, 64, 56, 64, 3, 1, 1), (32, 128, 28, 128, 3, 1, 1),
                (32, 256, 14, 256, 3, 1, 1), (8, 3, 224, 64, 7, 2, 3),
                (256, 128, 28, 128, 3, 1, 1)]  # fmt: skip
# (B, H, N, d) of attention, causal and not
ATTENTION = [(4, 32, n, 128) for n in (1024, 2048, 4096, 8192)] + [
    (8, 16, n, 64) for n in (1024, 2048, 4096, 8192, 16384)
]


def _randn(*shape, dtype):
    return torch.randn(*shape, device=runtime.DEVICE, dtype=dtype)


def matmul_calls() -> Iterator[Callable[[], object]]:
    from course_lib.kernels.matmul import matmul

    def product(a, b, tf32: bool):
        with runtime.tf32(tf32):  # which the finished matmul reads
            return matmul(a, b)

    # (dtype, TF32 or not): 16-bit, and float32 both ways; fp16 and bf16 share their tiles
    for dtype, tf32 in ((torch.float16, False), (torch.float32, False), (torch.float32, True)):
        for M, N, K in PRODUCTS:
            if dtype == torch.float32 and M * N * K > 2**33:  # a float32 product is slow
                continue
            a, b = _randn(M, K, dtype=dtype), _randn(K, N, dtype=dtype)
            # row-major operands, a K-major B (x @ W^T), an M-major A (g^T @ x)
            for left, right in ((a, b), (a, b.t().contiguous().t()), (a.t().contiguous().t(), b)):
                yield lambda left=left, right=right, tf32=tf32: product(left, right, tf32)


def linear_calls() -> Iterator[Callable[[], object]]:
    from course_lib.kernels.linear import linear

    for tokens, i, o in LAYERS:
        x = _randn(tokens, i, dtype=torch.bfloat16).requires_grad_()
        w = (_randn(o, i, dtype=torch.bfloat16) / i**0.5).requires_grad_()
        b = _randn(o, dtype=torch.bfloat16).requires_grad_()
        g = _randn(tokens, o, dtype=torch.bfloat16)
        yield lambda x=x, w=w, b=b, g=g: torch.autograd.grad(linear(x, w, b), (x, w, b), g)
        yield lambda x=x, w=w, b=b: linear(x.detach(), w.detach(), b.detach(), "gelu")


def conv2d_calls() -> Iterator[Callable[[], object]]:
    from course_lib.kernels.conv2d import conv2d

    for B, C, H, O, k, stride, padding in CONVOLUTIONS:
        for memory_format in (torch.channels_last, torch.contiguous_format):
            x = _randn(B, C, H, H, dtype=torch.float16).contiguous(memory_format=memory_format)
            w = _randn(O, C, k, k, dtype=torch.float16).contiguous(memory_format=memory_format)
            yield lambda x=x, w=w, s=stride, p=padding: conv2d(x, w, None, s, p)


def attention_calls() -> Iterator[Callable[[], object]]:
    from course_lib.kernels.attention import attention

    for B, H, N, d in ATTENTION:
        q, k, v = (_randn(B, H, N, d, dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            yield lambda q=q, k=k, v=v, causal=causal: attention(q, k, v, causal=causal)


KERNELS = {"matmul": matmul_calls, "linear": linear_calls, "conv2d": conv2d_calls,
           "attention": attention_calls}  # fmt: skip


def search(names: list[str], out: Path | None, part: tuple[int, int] = (0, 1)) -> list[dict]:
    """Call each kernel's workloads (of those numbered i mod n == k, for part (k, n)) with
    the table off; the choices made, saved to `out` after each kernel where given."""
    found: list[dict] = []
    with tile_table.measuring() as measured:
        for name in names:
            start = time.perf_counter()
            for i, call in enumerate(KERNELS[name]()):
                if i % part[1] == part[0]:
                    call()
                    torch.cuda.synchronize()
            found = list(measured)
            print(f"{name}: {len(found)} choices so far, {time.perf_counter() - start:.0f} s",
                  flush=True)  # fmt: skip
            if out is not None:
                _save(found, out)
            torch.cuda.empty_cache()
    return found


def _save(entries: list[dict], out: Path) -> None:
    props = torch.cuda.get_device_properties(0)
    table = {"gpu": props.name, "kind": tile_table.gpu_kind(0), "triton": triton.__version__,
             "torch": torch.__version__, "entries": entries}  # fmt: skip
    out.write_text(json.dumps(table, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.bench.tile_search",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="+", choices=sorted(KERNELS), default=sorted(KERNELS))
    parser.add_argument("--compilers", type=int, default=0,
                        help="child processes that compile first (0: none)")  # fmt: skip
    parser.add_argument("--part", default="0/1", help=argparse.SUPPRESS)  # a child's share
    args = parser.parse_args(argv)
    if not runtime.gpu_only("Measuring a tile table"):
        return 0
    if os.environ.get("COURSE_TILE_TABLE"):
        raise SystemExit("unset COURSE_TILE_TABLE: the search measures every choice itself")
    k, n = (int(p) for p in args.part.split("/"))
    if n > 1:  # a compiling child: each config launched once, untimed, its choices thrown away
        gpu_timer.compile_only = True
        search(args.only, None, (k, n))
        return 0
    if args.compilers:
        start = time.perf_counter()
        children = [
            subprocess.Popen([sys.executable, "-m", "course_lib.bench.tile_search", "--out",
                              os.devnull, "--only", *args.only, "--part", f"{i}/{args.compilers}"])
            for i in range(args.compilers)
        ]  # fmt: skip
        if any(child.wait() for child in children):
            raise SystemExit("a compiling child failed; see its output above")
        print(f"compiled in {time.perf_counter() - start:.0f} s", flush=True)
    if args.out.exists():
        args.out.replace(args.out.with_name(args.out.name + ".bak"))
    entries = search(args.only, args.out)
    print(f"{len(entries)} choices written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
