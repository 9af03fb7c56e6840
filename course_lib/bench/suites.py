"""The finished kernels' benchmarks, as run by ``python -m course_lib.bench``.

Each suite takes the copy bandwidth measured once at the start of the run and
returns its Sweeps. Add a lesson's kernel by adding a suite to SUITES.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

from course_lib import references, runtime
from course_lib.bench import first_call
from course_lib.bench.first_call import FirstCallTable
from course_lib.bench.sweep import (
    AGREEMENT,
    Sweep,
    Target,
    bandwidth_sweep,
    flops_sweep,
    label,
    matmul_peak,
    relative_error,
    run_sweep,
)
from course_lib.bench.timing import gb_per_s, tflop_per_s
from course_lib.kernels import add_2d, conv2d, linear, matmul, relu, softmax, vector_add

T = TypeVar("T")

# 2^12..2^18 show where launches dominate; 2^20..2^28 are where bandwidth is judged.
SIZES = [1 << p for p in (12, 14, 16, 18)] + [1 << p for p in range(20, 29)]
SOFTMAX_SHAPES = [(4096, 781), (4096, 1024), (8192, 4096), (4096, 16384), (1823, 12345),
                  (4096, 1 << 17), (64, 1 << 20)]  # fmt: skip
MATMUL_SHAPES = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (1000, 3000, 777)]

# The course's targets, checked in the report by both timings. A softmax reads and writes
# its matrix once, as a copy does: a copy of the same matrix bounds it
ELEMENTWISE_TARGETS = [
    Target("torch", 0.98, lambda n: n >= 1 << 20, "from 2^20 elements up"),
]
ONE_BLOCK_ROWS = [(4096, 781), (4096, 1024), (8192, 4096), (4096, 16384), (1823, 12345)]
SOFTMAX_TARGETS = [
    Target("copy", 0.95, lambda shape: shape in ONE_BLOCK_ROWS, "on rows of one block"),
    Target("torch", 1.0, lambda shape: shape in ONE_BLOCK_ROWS, "on rows of one block"),
    Target(
        "torch.compile",
        1.0,
        lambda shape: shape in ONE_BLOCK_ROWS and shape != (4096, 1024),
        "on rows of one block, but 4096x1024",
    ),
    Target(
        "torch.compile",
        0.97,
        lambda shape: shape == (4096, 1024),
        "at 4096x1024 (Inductor emits the same kernel)",
    ),
    Target("torch", 0.9, lambda shape: shape not in ONE_BLOCK_ROWS, "on wide rows"),
]


def _at(*shapes):
    return lambda shape: shape in shapes


def _matmul_targets(*targets: tuple[float, tuple]) -> list[Target]:
    return [
        Target("torch", ratio, _at(*shapes), f"at {' and '.join(map(label, shapes))}")
        for ratio, shapes in targets
    ]


HALF_TARGETS = _matmul_targets(
    (0.95, ((4096,) * 3, (8192,) * 3)), (0.8, ((1024,) * 3,)), (0.85, ((1000, 3000, 777),))
)
TF32_TARGETS = _matmul_targets((0.9, ((4096,) * 3, (8192,) * 3)))
TF32_K_MAJOR_TARGETS = _matmul_targets((1.0, ((8192,) * 3,)), (0.95, ((4096,) * 3,)))


def _elementwise_suite(name, kernel, reference, n_inputs, bytes_moved):
    def suite(ceiling_gbps: float) -> list[Sweep]:
        sweep = bandwidth_sweep(
            name, kernel, reference, n_inputs=n_inputs, bytes_moved=bytes_moved, sizes=SIZES,
            ceiling_gbps=ceiling_gbps,
        )  # fmt: skip
        sweep.targets = ELEMENTWISE_TARGETS
        return [sweep]

    return suite


vector_add_suite = _elementwise_suite(
    "add", vector_add.add, references.vector_add, 2, references.vector_add_bytes
)
relu_suite = _elementwise_suite("relu", relu.relu, references.relu, 1, references.relu_bytes)


def add_2d_suite(ceiling_gbps: float) -> list[Sweep]:
    sweeps = []
    for layout in ("contiguous", "transposed"):

        def make_inputs(shape, layout=layout):
            m, n = shape
            x, y = (torch.randn(m, n, device=runtime.DEVICE) for _ in range(2))
            return (x, y) if layout == "contiguous" else (x.t(), y.t())

        sweeps.append(
            bandwidth_sweep(
                f"add_2d ({layout} inputs)", add_2d.add_2d, lambda x, y: x + y,
                bytes_moved=lambda shape, dtype: references.add_2d_bytes(*shape, dtype),
                sizes=[(1024, 1024), (4096, 4096), (8192, 8192)],
                ceiling_gbps=ceiling_gbps, make_inputs=make_inputs,
            )
        )  # fmt: skip
    return sweeps


def softmax_suite(ceiling_gbps: float) -> list[Sweep]:
    compiled = torch.compile(references.softmax, dynamic=False)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    sweep = bandwidth_sweep(
        "softmax", softmax.softmax, references.softmax, n_inputs=1,
        bytes_moved=lambda shape, dtype: references.softmax_bytes(*shape, dtype),
        sizes=SOFTMAX_SHAPES, ceiling_gbps=ceiling_gbps,
        # a copy moves the same bytes and computes nothing: the most a softmax of this
        # shape can hope for, and with small shapes less than the ceiling
        others={"torch.compile": compiled, "copy": torch.clone},
    )  # fmt: skip
    sweep.targets = SOFTMAX_TARGETS
    return [sweep]


def matmul_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """The matmul sweeps, each yielded as soon as it is measured (the suite is long)."""
    half_ceiling = None
    for dtype in (torch.float16, torch.bfloat16):
        sweep = flops_sweep(
            "matmul", matmul.matmul, torch.matmul, shapes=MATMUL_SHAPES, dtype=dtype
        )
        sweep.targets = HALF_TARGETS
        half_ceiling = half_ceiling or sweep.ceiling
        yield sweep
    # a K-major B is how a Linear layer's weight arrives: x @ W.t()
    yield flops_sweep(
        "matmul (B K-major)", matmul.matmul, torch.matmul, shapes=MATMUL_SHAPES,
        dtype=torch.float16, ceiling_tflops=half_ceiling, b_k_major=True,
    )  # fmt: skip
    # fp32 runs as TF32 on both sides, the fair fight on tensor cores; B comes row-major,
    # which matmul copies K-major (large products on Hopper) or puts first in its dot, and
    # K-major, as a Linear layer's weight
    ceiling = None
    for b_k_major in (False, True):
        with runtime.tf32(True):
            sweep = flops_sweep(
                "matmul (TF32, B K-major)" if b_k_major else "matmul (TF32)",
                matmul.matmul, torch.matmul, shapes=MATMUL_SHAPES, dtype=torch.float32,
                ceiling_tflops=ceiling, b_k_major=b_k_major,
            )  # fmt: skip
        ceiling = sweep.ceiling
        sweep.targets = TF32_K_MAJOR_TARGETS if b_k_major else TF32_TARGETS
        yield sweep


# (B, C, H = W, O, kernel side, stride, padding): three ResNet-50 layers and its stem
RESNET_LAYERS = [
    (32, 64, 56, 64, 3, 1, 1),
    (32, 128, 28, 128, 3, 1, 1),
    (32, 256, 14, 256, 3, 1, 1),
]
STEM = (8, 3, 224, 64, 7, 2, 3)
# the 28x28 layer at batch 256: past conv2d_fast_paths.NCHW_TMA_PRODUCT, where an NCHW
# input goes through a channels-last copy to the Hopper kernel
LARGE_BATCH = (256, 128, 28, 128, 3, 1, 1)
CONV_SHAPES = [*RESNET_LAYERS, STEM, LARGE_BATCH]
# cuDNN with its own autotuner on. cuDNN keeps the algorithm it chose for a convolution per
# thread, keyed by the convolution and not by cudnn.benchmark: in one thread, whichever
# setting meets a shape first decides for both. Those sweeps run on a thread of their own
CUDNN_TUNED = "torch, cudnn.benchmark"
CONV_TARGETS = {
    "channels-last": [
        Target("torch", 0.8, lambda p: p in RESNET_LAYERS, "on the ResNet 3x3 layers"),
        Target("torch", 0.5, lambda p: p == STEM, "on the 7x7 stem"),
    ],
    # torch's default layout; any conversion a kernel makes counts in its time
    "NCHW": [Target("torch", 1.0, lambda p: p in RESNET_LAYERS, "on the ResNet 3x3 layers")],
}
CUDNN_TUNED_TARGETS = {
    layout: [Target(CUDNN_TUNED, ratio, lambda p: p in RESNET_LAYERS, "on the ResNet 3x3 layers")]
    for layout, ratio in (("channels-last", 0.8), ("NCHW", 0.9))
}


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """torch.backends.cudnn.benchmark set for the `with` block, its old value back after."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def with_cudnn_tuning(fn: Callable[[], T]) -> T:
    """fn() with cudnn.benchmark on, on a new thread: cuDNN's choices of this thread, made
    at its default settings, do not carry over."""

    def run() -> T:
        with cudnn_benchmark(True):
            return fn()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(run).result()


def conv2d_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """fp16 convolutions against torch (cuDNN) on the same tensors, channels-last (input
    and weight, as model.to(memory_format=torch.channels_last) leaves them) and NCHW:
    cuDNN at its default settings, then on the ResNet layers with cudnn.benchmark on."""
    ceiling = matmul_peak(torch.float16)
    for layout, memory_format in (("channels-last", torch.channels_last),
                                  ("NCHW", torch.contiguous_format)):  # fmt: skip

        def make_inputs(point, memory_format=memory_format):
            B, C, H, O, k, stride, padding = point
            x = torch.randn(B, C, H, H, device=runtime.DEVICE, dtype=torch.float16)
            w = torch.randn(O, C, k, k, device=runtime.DEVICE, dtype=torch.float16)
            return (x.contiguous(memory_format=memory_format),
                    w.contiguous(memory_format=memory_format), None, stride, padding)  # fmt: skip

        def throughput(point, ms):
            B, C, H, O, k, stride, padding = point
            side = references.conv2d_output_size(H, k, stride, padding, 1)
            return tflop_per_s(references.conv2d_flops(B, O, side, side, C, k, k), ms)

        sweep = Sweep(f"conv2d ({layout}), B x C x H x O x k x stride x padding",
                      torch.float16, ceiling, unit="TFLOP/s",
                      ceiling_name="torch.matmul at 8192^3")  # fmt: skip
        run_sweep(sweep, conv2d.conv2d, {"torch": torch.nn.functional.conv2d}, CONV_SHAPES,
                  make_inputs, throughput, rounds=3)  # fmt: skip
        sweep.targets = CONV_TARGETS[layout]
        yield sweep

        def tuned_inputs(point, make_inputs=make_inputs):
            inputs = make_inputs(point)
            # cuDNN times its algorithms on a shape's first call: before anything is timed
            torch.nn.functional.conv2d(*inputs)
            torch.cuda.synchronize()
            return inputs

        tuned = Sweep(f"conv2d ({layout}) against cudnn.benchmark, B x C x H x O x k x "
                      "stride x padding", torch.float16, ceiling, unit="TFLOP/s",
                      ceiling_name="torch.matmul at 8192^3")  # fmt: skip
        tuned.targets = CUDNN_TUNED_TARGETS[layout]
        yield with_cudnn_tuning(
            lambda tuned=tuned, tuned_inputs=tuned_inputs, throughput=throughput: run_sweep(
                tuned,
                conv2d.conv2d,
                {CUDNN_TUNED: torch.nn.functional.conv2d},
                RESNET_LAYERS,
                tuned_inputs,
                throughput,
                rounds=3,
            )
        )


# (rows, in_features, out_features): a large layer, a small one where the host's cost of a
# training step's five launches and autograd shows, and a transformer MLP's first layer,
# [8, 512, 768] -> 3072
LARGE_LAYER = (8192, 4096, 4096)
LINEAR_SHAPES = [LARGE_LAYER, (1024, 1024, 1024), (8 * 512, 768, 3072)]
LINEAR_TARGETS = [Target("torch", 0.95, _at(LARGE_LAYER), f"at {label(LARGE_LAYER)}")]
FUSED_GELU_TARGETS = [
    Target("torch", 1.2, lambda point: True, "at every shape (linear, then gelu)"),
    Target("torch.compile", 1.0, lambda point: True, "at every shape"),
]


def _layer_inputs(point, dtype, requires_grad):
    rows, in_features, out_features = point
    make = lambda *shape: torch.randn(*shape, device=runtime.DEVICE, dtype=dtype)
    x, weight = make(rows, in_features), make(out_features, in_features) / in_features**0.5
    bias = make(out_features)
    leaves = [t.requires_grad_(requires_grad) for t in (x, weight, bias)]
    return (*leaves, make(rows, out_features)) if requires_grad else leaves


def _forward_backward(forward):
    """One training step's work of a layer: y = forward(x, weight, bias), then the three
    gradients for the output's gradient g; returns grad_weight, for the check."""

    def step(x, weight, bias, g):
        y = forward(x, weight, bias)
        return torch.autograd.grad(y, (x, weight, bias), g)[1]

    return step


def linear_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """bf16 Linear layers: forward and backward against nn.Linear's (cuBLAS, through
    autograd on both sides), and the forward with a fused GELU against torch's linear then
    gelu, eager and compiled. TFLOP/s from the products' flops: three products for a
    forward and backward, one for a forward."""
    dtype = torch.bfloat16
    ceiling = matmul_peak(dtype)
    sides = {"forward + backward": (3, True), "forward, fused GELU": (1, False)}
    for name, (products, requires_grad) in sides.items():

        def throughput(point, ms, products=products):
            return tflop_per_s(products * references.linear_flops(*point), ms)

        def make_inputs(point, requires_grad=requires_grad):
            return _layer_inputs(point, dtype, requires_grad)

        sweep = Sweep(f"linear, {name}, rows x in x out", dtype, ceiling, unit="TFLOP/s",
                      ceiling_name="torch.matmul at 8192^3")  # fmt: skip
        if requires_grad:
            kernel = _forward_backward(linear.linear)
            baselines = {"torch": _forward_backward(torch.nn.functional.linear)}
            sweep.targets = LINEAR_TARGETS
            # a step is autograd's work as much as the launches: the launcher target is
            # for the forward, below; the step's host cost is set beside torch's
            sweep.launcher = False
        else:
            eager = lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))
            kernel = lambda x, w, b: linear.linear(x, w, b, "gelu")
            # the product alone, without its GELU: what a fused kernel could at best match
            # if its product were as fast as cuBLAS's
            baselines = {"torch": eager, "torch.compile": torch.compile(eager, dynamic=False),
                         "torch linear alone": torch.nn.functional.linear}  # fmt: skip
            sweep.targets = FUSED_GELU_TARGETS
        yield run_sweep(sweep, kernel, baselines, LINEAR_SHAPES, make_inputs, throughput, 3)
    yield from linear_transformer_suite(ceiling_gbps)


# a transformer's Linear layers, (tokens, in, out): the MLP's two layers of 768-wide models
# (BERT-base, GPT-2), of 1024-wide ones, and of a 4096-wide one with a gated MLP of 11008
# (LLaMA-7B), at 4096 and 16384 tokens; and one small layer, where the host's cost shows
TRANSFORMER_LAYERS = [(768, 3072), (3072, 768), (1024, 4096), (4096, 1024), (4096, 11008),
                      (11008, 4096)]  # fmt: skip
SMALL_LAYER = (1024, 1024, 1024)
TRANSFORMER_SHAPES = [
    *((tokens, n_in, n_out) for tokens in (4096, 16384) for n_in, n_out in TRANSFORMER_LAYERS),
    SMALL_LAYER,
]
TRANSFORMER_TARGETS = [
    Target(
        "torch",
        0.95,
        lambda point: point != SMALL_LAYER,
        f"at every shape but {label(SMALL_LAYER)}",
    ),
    Target("torch", 0.9, _at(SMALL_LAYER), f"at {label(SMALL_LAYER)}"),
]


def linear_transformer_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """The linear suite's transformer shapes: bf16 Linear layers, the forward and the
    forward and backward, against nn.Linear's (torch.nn.functional.linear, through autograd
    for the backward). One median_ms round per point: these products take milliseconds,
    whose medians are steady, and there are thirteen of them."""
    dtype = torch.bfloat16
    ceiling = matmul_peak(dtype)
    for name, products, requires_grad in (("forward", 1, False), ("forward + backward", 3, True)):

        def throughput(point, ms, products=products):
            return tflop_per_s(products * references.linear_flops(*point), ms)

        def make_inputs(point, requires_grad=requires_grad):
            return _layer_inputs(point, dtype, requires_grad)

        sweep = Sweep(f"linear, transformer shapes, {name}, rows x in x out", dtype, ceiling,
                      unit="TFLOP/s", ceiling_name="torch.matmul at 8192^3")  # fmt: skip
        sweep.targets = TRANSFORMER_TARGETS
        if requires_grad:
            kernel = _forward_backward(linear.linear)
            baselines = {"torch": _forward_backward(torch.nn.functional.linear)}
            sweep.launcher = False  # a step is autograd's work as much as the launches
        else:
            kernel, baselines = linear.linear, {"torch": torch.nn.functional.linear}
        yield run_sweep(sweep, kernel, baselines, TRANSFORMER_SHAPES, make_inputs, throughput,
                        rounds=1)  # fmt: skip


# lesson 08: the same kernels as operators inside torch.compile
COMPILED_SOFTMAX_SHAPES = [(4096, 781), (8192, 4096)]
EAGER_KERNEL = "eager kernel"  # the finished kernel called directly, as lessons 04-07 do
AS_EAGER = [Target(EAGER_KERNEL, 0.97, lambda point: True, "at every shape")]
# lessons 04 and 05 shapes where the host's cost per call shows
HOST_BOUND_SOFTMAX, HOST_BOUND_MATMUL = (4096, 781), (1024, 1024, 1024)
# (rows, width, hidden): an MLP block x + W2 gelu(W1 x + b1) + b2, forward and backward
BLOCK_SHAPES = [(8 * 512, 768, 3072), (8192, 1024, 4096)]


def _mlp_block(linear_fn, gelu_fused: bool):
    def block(x, w1, b1, w2, b2):
        if gelu_fused:
            hidden = linear_fn(x, w1, b1, "gelu")
        else:
            hidden = torch.nn.functional.gelu(linear_fn(x, w1, b1))
        return x + linear_fn(hidden, w2, b2)

    return block


def _block_step(block):
    """A training step's work of the block: forward, then every gradient for the output's
    gradient g; returns grad_w1, for the check."""

    def step(x, w1, b1, w2, b2, g):
        return torch.autograd.grad(block(x, w1, b1, w2, b2), (x, w1, b1, w2, b2), g)[1]

    return step


def compiled_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """The finished kernels as operators (course_lib.ops) inside torch.compile: against
    their own eager calls, then where the host's cost per call dominates, with CUDA graphs
    (mode="reduce-overhead") against torch eager and torch's own op compiled the same way
    (what CUDA graphs can at best give one op), then an MLP block four ways."""
    from course_lib import ops

    compiled = lambda fn, **options: torch.compile(fn, fullgraph=True, dynamic=False, **options)

    def softmax_inputs(point):
        return (torch.randn(*point, device=runtime.DEVICE),)

    sweep = Sweep("softmax operator in torch.compile, rows x cols", torch.float32, ceiling_gbps)
    # torch's own op compiled: what entering compiled code costs any op, the bound here
    # where the host sets the pace; its host cost per call is measured beside ours
    sweep.targets = AS_EAGER + [
        Target("torch, compiled", 0.97, lambda point: True, "at every shape")
    ]
    yield run_sweep(
        sweep, compiled(ops.softmax),
        {EAGER_KERNEL: softmax.softmax, "torch": _torch_softmax,
         "torch, compiled": compiled(_torch_softmax)},
        COMPILED_SOFTMAX_SHAPES, softmax_inputs,
        lambda point, ms: gb_per_s(references.softmax_bytes(*point, torch.float32), ms),
        host_baselines=["torch, compiled"],
    )  # fmt: skip

    dtype, peak = torch.bfloat16, matmul_peak(torch.bfloat16)

    def layer_inputs(point):
        return _layer_inputs(point, dtype, requires_grad=True)

    def three_products(point, ms):
        return tflop_per_s(3 * references.linear_flops(*point), ms)

    sweep = Sweep("linear operator in torch.compile, forward + backward, rows x in x out",
                  dtype, peak, unit="TFLOP/s", ceiling_name="torch.matmul at 8192^3")  # fmt: skip
    sweep.targets = AS_EAGER
    yield run_sweep(
        sweep, _forward_backward(compiled(ops.linear)),
        {EAGER_KERNEL: _forward_backward(linear.linear),
         "torch": _forward_backward(torch.nn.functional.linear),
         "torch, compiled": _forward_backward(compiled(torch.nn.functional.linear))},
        LINEAR_SHAPES, layer_inputs, three_products, 3, host_baselines=["torch, compiled"],
    )  # fmt: skip

    # CUDA graphs replay on fixed addresses: an input that is not marked static is copied
    # into the graph's own buffer on every call, as much traffic again as a softmax. A loop
    # that fills one buffer per batch marks it, as here
    def static(*tensors):
        for t in tensors:
            torch._dynamo.mark_static_address(t)
        return tensors

    def matmul_inputs(point):
        M, N, K = point
        make = lambda *shape: torch.randn(*shape, device=runtime.DEVICE, dtype=torch.float16)
        return static(make(M, K), make(K, N))

    graphs = lambda fn: compiled(fn, mode="reduce-overhead")
    # a replay's own host work bounds one op under CUDA graphs in a loop: torch's op
    # replayed the same way shows it, its host cost per call measured beside ours
    in_a_loop = [
        Target(baseline, 0.9, lambda point: True, "at this host-bound shape")
        for baseline in ("torch", "torch, reduce-overhead")
    ]
    sweep = Sweep("softmax operator, CUDA graphs, rows x cols", torch.float32, ceiling_gbps)
    sweep.targets = in_a_loop
    yield run_sweep(
        sweep, graphs(ops.softmax),
        {"torch": _torch_softmax, "torch, reduce-overhead": graphs(_torch_softmax),
         EAGER_KERNEL: softmax.softmax},
        [HOST_BOUND_SOFTMAX], lambda point: static(*softmax_inputs(point)),
        lambda point, ms: gb_per_s(references.softmax_bytes(*point, torch.float32), ms),
        host_baselines=["torch, reduce-overhead"],
    )  # fmt: skip
    sweep = Sweep("matmul operator, CUDA graphs, M x N x K", torch.float16,
                  matmul_peak(torch.float16), unit="TFLOP/s",
                  ceiling_name="torch.matmul at 8192^3")  # fmt: skip
    sweep.targets = in_a_loop
    yield run_sweep(
        sweep, graphs(ops.matmul),
        {"torch": torch.matmul, "torch, reduce-overhead": graphs(torch.matmul),
         EAGER_KERNEL: matmul.matmul},
        [HOST_BOUND_MATMUL], matmul_inputs,
        lambda point, ms: tflop_per_s(2 * point[0] * point[1] * point[2], ms),
        host_baselines=["torch, reduce-overhead"],
    )  # fmt: skip

    def block_inputs(point):
        rows, width, hidden = point
        make = lambda *shape, scale=1.0: (
            torch.randn(*shape, device=runtime.DEVICE, dtype=dtype) * scale
        ).requires_grad_()
        # the weights stay put, as a module's parameters do; x and g are a new batch's
        weights = static(make(hidden, width, scale=width**-0.5), make(hidden),
                         make(width, hidden, scale=hidden**-0.5), make(width))  # fmt: skip
        return (
            make(rows, width),
            *weights,
            torch.randn(rows, width, device=runtime.DEVICE, dtype=dtype),
        )

    def block_rate(point, ms):
        rows, width, hidden = point
        return tflop_per_s(3 * 2 * references.linear_flops(rows, width, hidden), ms)

    torch_block = _mlp_block(torch.nn.functional.linear, gelu_fused=False)
    sweep = Sweep("MLP block x + W2 gelu(W1 x), forward + backward, rows x width x hidden",
                  dtype, peak, unit="TFLOP/s", ceiling_name="torch.matmul at 8192^3")  # fmt: skip
    yield run_sweep(
        sweep, _block_step(compiled(_mlp_block(ops.linear, True), mode="reduce-overhead")),
        {"torch": _block_step(torch_block),
         "torch.compile": _block_step(compiled(torch_block)),
         # the same CUDA graphs around torch's block: what they give without our kernels
         "torch.compile, reduce-overhead": _block_step(
             compiled(torch_block, mode="reduce-overhead")),
         "kernels, eager": _block_step(_mlp_block(linear.linear, True))},
        BLOCK_SHAPES, block_inputs, block_rate, 3,
    )  # fmt: skip


def _torch_softmax(x):
    return torch.softmax(x, dim=-1)


SUITES = {
    "add": vector_add_suite,
    "relu": relu_suite,
    "add_2d": add_2d_suite,
    "softmax": softmax_suite,
    "matmul": matmul_suite,
    "conv2d": conv2d_suite,
    "linear": linear_suite,
    "compiled": compiled_suite,
}


# lesson 09: layer norm and RMSNorm, bf16, against torch eager and compiled and a copy
NORM_ANCHORS = [(4096, 4096), (8192, 8192), (4096, 1024)]
# and rows wider than one block, which the forward reads twice
NORM_FORWARD_SHAPES = [*NORM_ANCHORS, (1024, 16384)]
NORM_FORWARD_TARGETS = [
    Target("copy", 0.85, _at((4096, 4096), (8192, 8192)), "at 4096x4096 and 8192x8192"),
    Target("torch", 1.0, _at(*NORM_ANCHORS), "at the three anchors"),
]
NORM_STEP_TARGETS = [
    Target("torch", 1.3, _at(*NORM_ANCHORS), "at the three anchors"),
    Target("torch.compile", 1.0, _at(*NORM_ANCHORS), "at the three anchors"),
]
RMS_STEP_TARGETS = [Target("torch.compile", 1.0, _at(*NORM_ANCHORS), "at the three anchors")]


def layer_norm_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """bf16 layer norm and RMSNorm: the forward against torch's, torch.compile's and a copy
    of the same matrix (the most a forward can reach: it reads and writes it once); a
    training step's forward and backward against torch's and torch.compile's. GB/s from
    the least bytes each must move (references.layer_norm_bytes, ..._backward_bytes)."""
    from course_lib.kernels import layer_norm as norm

    dtype, eps = torch.bfloat16, 1e-5
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)

    def inputs(point, requires_grad=False):
        m, n = point
        make = lambda *shape: torch.randn(*shape, device=runtime.DEVICE, dtype=dtype)  # noqa: E731
        leaves = [t.requires_grad_(requires_grad) for t in (make(m, n), make(n) + 1, make(n))]
        return (*leaves, make(m, n)) if requires_grad else leaves

    def rate(count):
        return lambda point, ms: gb_per_s(count(*point, dtype), ms)

    torch_ln = lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)  # noqa: E731
    ours_ln = lambda x, w, b: norm.layer_norm(x, x.shape[-1], w, b, eps)  # noqa: E731
    torch_rms = lambda x, w, b: torch.nn.functional.rms_norm(x, x.shape[-1:], w, eps)  # noqa: E731
    ours_rms = lambda x, w, b: norm.rms_norm(x, x.shape[-1], w, eps)  # noqa: E731
    for name, ours, theirs, rms in (("layer_norm", ours_ln, torch_ln, False),
                                    ("rms_norm", ours_rms, torch_rms, True)):  # fmt: skip
        if not rms:  # RMSNorm's forward is the same kernel, one reduction less
            sweep = Sweep(f"{name} forward, rows x cols", dtype, ceiling_gbps)
            sweep.targets = NORM_FORWARD_TARGETS
            run_sweep(
                sweep, ours,
                {"torch": theirs, "torch.compile": torch.compile(theirs, dynamic=False),
                 "copy": lambda x, w, b: torch.clone(x)},
                NORM_FORWARD_SHAPES, inputs, rate(references.layer_norm_bytes), rounds=3,
            )  # fmt: skip
            yield sweep

        def step_inputs(point):
            return inputs(point, requires_grad=True)

        def step(fn, rms=rms):
            def run(x, w, b, g):
                leaves = (x, w) if rms else (x, w, b)
                return torch.autograd.grad(fn(x, w, b), leaves, g)[1]  # grad_weight

            return run

        sweep = Sweep(f"{name} forward + backward, rows x cols", dtype, ceiling_gbps)
        sweep.targets = RMS_STEP_TARGETS if rms else NORM_STEP_TARGETS
        sweep.launcher = False  # a step is autograd's work as much as the launches
        yield run_sweep(
            sweep, step(ours), {"torch": step(theirs),
                                "torch.compile": step(torch.compile(theirs, dynamic=False))},
            NORM_ANCHORS, step_inputs, rate(references.layer_norm_backward_bytes), rounds=3,
        )  # fmt: skip


SUITES["layer_norm"] = layer_norm_suite


# lesson 10: flash attention, bf16, against SDPA's flash and cuDNN backends. B·N stays 16k
# tokens and H·d 2048, so that every point has the same work per key and enough of it
ATTENTION_TOKENS, ATTENTION_WIDTH = 16384, 2048
ATTENTION_LENGTHS = (1024, 2048, 4096, 8192, 16384)
ATTENTION_POINTS = [
    (ATTENTION_TOKENS // n, ATTENTION_WIDTH // d, n, d)
    for d in (64, 128)
    for n in ATTENTION_LENGTHS
]
ATTENTION_ANCHOR = (ATTENTION_TOKENS // 4096, ATTENTION_WIDTH // 128, 4096, 128)
ATTENTION_TARGETS = {
    "forward": [
        Target("SDPA flash", 1.25, _at(ATTENTION_ANCHOR), "at d=128, N=4096"),
        Target("SDPA cuDNN", 0.8, _at(ATTENTION_ANCHOR), "at d=128, N=4096"),
    ],
    "forward + backward": [
        Target("SDPA flash", 1.0, _at(ATTENTION_ANCHOR), "at d=128, N=4096"),
        Target("SDPA cuDNN", 0.7, _at(ATTENTION_ANCHOR), "at d=128, N=4096"),
    ],
}


def _sdpa(backend):
    """scaled_dot_product_attention held to one backend, as (q, k, v, causal) -> o."""
    from torch.nn.attention import sdpa_kernel

    def attend(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return attend


def attention_suite(ceiling_gbps: float) -> Iterator[Sweep]:
    """bf16 attention, B x H x N x d, causal and not: the forward, and a training step's
    forward and backward, against SDPA's flash backend (FlashAttention-2) and its cuDNN
    backend, in TFLOP/s (references.attention_flops; a backward counts 2.5 forwards). Then
    the peak memory of a causal step against SDPA's math backend, which writes the scores."""
    from torch.nn.attention import SDPBackend

    sides = _attention_sides(torch.bfloat16)
    yield from _attention_sweeps(sides, torch.bfloat16, ATTENTION_POINTS, ATTENTION_TARGETS)
    yield _attention_memory_sweep(sides["ours"], _sdpa(SDPBackend.MATH))


# Triton's fused-attention tutorial runs float16 alone, its backward is causal alone, and it
# tunes its forward per length on a first call: it is timed at the anchor's length. One
# batch of as many heads as the anchor's batches hold: the tutorial's TMA forward finds a
# head's rows from its batch wrongly in some versions
TUTORIAL_POINTS = [(1, ATTENTION_TOKENS // 4096 * ATTENTION_WIDTH // d, 4096, d) for d in (128, 64)]


def attention_tutorial_suite(ceiling_gbps: float, tutorial) -> Iterator[Sweep]:
    """float16 attention at TUTORIAL_POINTS: ours, Triton's fused-attention tutorial (the
    module `tutorial` from load_tutorial, python/tutorials/06-fused-attention.py of a
    Triton checkout: its `attention(q, k, v, causal, sm_scale)`), and SDPA's flash and
    cuDNN backends, after a check that the tutorial's output and causal gradients agree
    with ours at each point."""

    def theirs(q, k, v, causal):
        return tutorial.attention(q, k, v, causal, q.shape[-1] ** -0.5)

    sides = _attention_sides(torch.float16) | {"Triton tutorial": theirs}  # ours stays first
    for point in TUTORIAL_POINTS:
        _check_against_ours(theirs, sides["ours"], point, torch.float16)
    yield from _attention_sweeps(
        sides, torch.float16, TUTORIAL_POINTS, {}, causal_steps_only=("Triton tutorial",)
    )


def load_tutorial(path: Path):
    """Triton's fused-attention tutorial, imported from its file."""
    import importlib.util

    if not path.is_file() or path.suffix != ".py":
        raise FileNotFoundError(
            f"{path} is not a Python file: pass the fused-attention tutorial of a Triton "
            f"checkout, python/tutorials/06-fused-attention.py"
        )
    spec = importlib.util.spec_from_file_location("triton_fused_attention_tutorial", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "attention", None)):
        raise AttributeError(f"{path} defines no attention(q, k, v, causal, sm_scale)")
    return module


def _check_against_ours(theirs, ours, point, dtype) -> None:
    """Raise unless `theirs` gives ours's o at `point`, causal and not, and the causal dq, dk
    and dv, within AGREEMENT, as run_sweep checks each kernel against its reference."""
    for causal in (False, True):
        tensors = [torch.randn(*point, device=runtime.DEVICE, dtype=dtype) for _ in range(4)]
        leaves = [t.requires_grad_() for t in tensors[:3]]
        results = []
        for fn in (theirs, ours):
            o = fn(*leaves, causal)
            grads = torch.autograd.grad(o, leaves, tensors[3]) if causal else ()
            results.append([o.detach(), *grads])
        for name, got, want in zip(("o", "dq", "dk", "dv"), *results):
            error = relative_error(got, want)
            if not error < AGREEMENT:
                raise AssertionError(
                    f"Triton's tutorial disagrees with ours at {label(point)}"
                    f"{', causal' if causal else ''}: {name}'s relative error {error:.1e}"
                )


def _attention_sides(dtype) -> dict[str, Callable]:
    """Ours and SDPA's flash and cuDNN backends as (q, k, v, causal) -> o, without a backend
    this GPU or this torch lacks."""
    from torch.nn.attention import SDPBackend

    from course_lib.kernels import attention as attention_kernels

    sides = {
        "ours": lambda q, k, v, causal: attention_kernels.attention(q, k, v, causal),
        "SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    probe = [torch.randn(1, 1, 128, 64, device=runtime.DEVICE, dtype=dtype) for _ in range(3)]
    for name in ("SDPA flash", "SDPA cuDNN"):
        try:
            sides[name](*probe, True)
        except RuntimeError:
            del sides[name]
    return sides


def _attention_sweeps(sides, dtype, points, targets, causal_steps_only=()) -> Iterator[Sweep]:
    """The forward and a step's forward and backward, causal and not, of sides["ours"]
    against the other sides (the first of them the reference run_sweep checks ours with);
    the sides named in `causal_steps_only` have a causal backward alone."""
    ceiling = matmul_peak(dtype)

    def make(point, requires_grad):
        b, h, n, d = point
        tensors = [torch.randn(b, h, n, d, device=runtime.DEVICE, dtype=dtype) for _ in range(4)]
        leaves = [t.requires_grad_(requires_grad) for t in tensors[:3]]
        return (*leaves, tensors[3]) if requires_grad else leaves

    kinds = {"forward": (1.0, False), "forward + backward": (3.5, True)}  # flops per forward's
    for causal in (False, True):
        for name, (factor, requires_grad) in kinds.items():

            def call(fn, requires_grad=requires_grad, causal=causal):
                if not requires_grad:
                    return lambda q, k, v: fn(q, k, v, causal)
                # a step's work: o, then the three gradients; dq for the check
                return lambda q, k, v, do: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)[
                    0
                ]

            def throughput(point, ms, factor=factor, causal=causal):
                b, h, n, d = point
                return tflop_per_s(factor * references.attention_flops(b, h, n, n, d, causal), ms)

            sweep = Sweep(
                f"attention {name}{', causal' if causal else ''}, B x H x N x d", dtype,
                ceiling, unit="TFLOP/s", ceiling_name="torch.matmul at 8192^3",
            )  # fmt: skip
            sweep.targets = [t for t in targets.get(name, ()) if t.baseline in sides]
            sweep.launcher = not requires_grad  # a step is autograd's work as much as launches
            baselines = {
                n: call(fn) for n, fn in sides.items()
                if n != "ours" and (causal or not requires_grad or n not in causal_steps_only)
            }  # fmt: skip
            yield run_sweep(
                sweep, call(sides["ours"]), baselines, points,
                lambda point, requires_grad=requires_grad: make(point, requires_grad),
                throughput, rounds=3,
            )  # fmt: skip


def _attention_memory_sweep(ours, naive) -> Sweep:
    """Peak memory of a causal bf16 step (forward and backward) at B=1, H=8, d=64, over N,
    in MiB beyond the inputs: ours keeps O(N) (o, lse, D); the math backend's scores and
    probabilities are O(N²)."""
    total = torch.cuda.get_device_properties(runtime.DEVICE).total_memory / 2**20
    sweep = Sweep("attention peak memory, causal forward + backward, B x H x N x d",
                  torch.bfloat16, total, unit="MiB", ceiling_name="the GPU's memory")  # fmt: skip
    sweep.baselines = {"SDPA math": []}
    for n in ATTENTION_LENGTHS:
        point = (1, 8, n, 64)
        peaks = []
        for fn in (ours, naive):
            tensors = [torch.randn(*point, device=runtime.DEVICE, dtype=torch.bfloat16)
                       for _ in range(4)]  # fmt: skip
            leaves = [t.requires_grad_() for t in tensors[:3]]
            # a first call may tune, timing tiles on scratch memory: not measured
            torch.autograd.grad(fn(*leaves, True), leaves, tensors[3])
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            torch.autograd.grad(fn(*leaves, True), leaves, tensors[3])
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated() - base) / 2**20)
            del tensors, leaves
        sweep.points.append(point)
        sweep.kernel.append(peaks[0])
        sweep.baselines["SDPA math"].append(peaks[1])
    return sweep


SUITES["attention"] = attention_suite


def first_call_suite(ceiling_gbps: float) -> Iterator[FirstCallTable]:
    """What a new shape's first call costs, in fresh processes (course_lib.bench.first_call)."""
    torch.cuda.empty_cache()  # what this process keeps from other suites is the children's
    yield first_call.first_call_table()


SUITES["first_call"] = first_call_suite
# parts that run only when named (--only): linear_transformer, which the linear suite runs
# too; attention_tutorial, which needs the tutorial's file (--triton-tutorial)
SUITE_PARTS = {
    "linear_transformer": linear_transformer_suite,
    "attention_tutorial": attention_tutorial_suite,
}
