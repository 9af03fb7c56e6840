"""Finished kernels against their references: every size, dtype and error path."""

import math
import time
import warnings

import pytest
import torch
import triton

from course_lib import DEVICE, references, runtime
from course_lib.checks.tolerances import tolerance_for
from course_lib.kernels import relu, vector_add

SIZES = [0, 1, 2, 37, 1009, 1024, 1025, 65_537]
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in runtime.DTYPES]


def _close(got, expected):
    tol = tolerance_for(expected.dtype)
    torch.testing.assert_close(got, expected, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_matches_reference(n, dtype):
    x, y = (torch.randn(n, device=DEVICE).to(dtype) for _ in range(2))
    _close(vector_add.add(x, y), references.vector_add(x, y))


@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_matches_reference(n, dtype):
    x = torch.randn(n, device=DEVICE).to(dtype)
    _close(relu.relu(x), references.relu(x))


def test_relu_keeps_nan_and_inf_like_torch():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -1.0, 2.0], device=DEVICE)
    torch.testing.assert_close(relu.relu(x), torch.relu(x), equal_nan=True)


def test_shapes_and_non_contiguous_inputs():
    x = torch.randn(64, 33, device=DEVICE).t()  # [33, 64], transposed view
    y = torch.randn(33, 64, device=DEVICE)
    out = vector_add.add(x, y)
    assert out.shape == (33, 64) and out.is_contiguous()
    _close(out, x + y)
    _close(relu.relu(x[:, ::3]), torch.relu(x[:, ::3]))


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((torch.ones(3), torch.ones(4)), ValueError, "shapes differ, \\[3\\] vs \\[4\\]"),
        ((torch.ones(3), torch.ones(3, dtype=torch.float16)), TypeError, "dtypes differ"),
        ((torch.ones(3, dtype=torch.int32),) * 2, TypeError, "int32 is not supported"),
        (([1.0], torch.ones(1)), TypeError, "expects torch.Tensor arguments"),
    ],
    ids=["shape", "dtype-mismatch", "int-dtype", "not-a-tensor"],
)
def test_add_rejects_bad_input_clearly(args, error, message):
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(error, match=message):
        vector_add.add(*args)


@pytest.mark.gpu
def test_cpu_tensors_on_a_gpu_machine_are_refused():
    with pytest.raises(ValueError, match="device=course_lib.DEVICE"):
        relu.relu(torch.ones(3))
    with pytest.raises(ValueError, match="devices differ"):
        vector_add.add(torch.ones(3, device="cuda"), torch.ones(3))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [(1 << 24) + 3, 1 << 28], ids=["n2^24+3", "n2^28"])
def test_large_sizes_on_gpu(n):
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    torch.testing.assert_close(vector_add.add(x, y), x + y, rtol=0, atol=0)
    torch.testing.assert_close(relu.relu(x), torch.relu(x), rtol=0, atol=0)


# --- lessons 03-05 ------------------------------------------------------------------------

from course_lib.kernels import (  # noqa: E402
    add_2d,
    hopper,  # noqa: E402
    matmul,
    softmax,
)
from course_lib.kernels import matmul_fast_paths as fast  # noqa: E402
from course_lib.kernels import matmul_stream_k as stream_k  # noqa: E402
from course_lib.kernels._plan import PlanCache  # noqa: E402

SHAPES_2D = [(1, 1), (1, 1000), (1000, 1), (37, 61), (130, 257)]


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "transposed":
        return t.t().contiguous().t()
    if layout == "strided":
        big = torch.zeros(t.shape[0] * 2, t.shape[1] * 3, dtype=t.dtype, device=t.device)
        big[::2, ::3] = t
        return big[::2, ::3]
    return t


@pytest.mark.parametrize("shape", SHAPES_2D, ids=[f"{m}x{n}" for m, n in SHAPES_2D])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_add_2d_any_strides(shape, layout):
    x = _layout(torch.randn(*shape, device=DEVICE), layout)
    y = torch.randn(*shape, device=DEVICE)
    out = add_2d.add_2d(x, y)
    assert out.is_contiguous()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_add_2d_rejects_bad_input_clearly():
    with pytest.raises(ValueError, match="expects 2-D tensors"):
        add_2d.add_2d(torch.ones(3, device=DEVICE), torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match="shapes differ"):
        add_2d.add_2d(torch.ones(2, 3, device=DEVICE), torch.ones(3, 2, device=DEVICE))


SOFTMAX_SHAPES = [(1, 1), (3, 1), (1, 781), (37, 1024), (5, 3001), (3, 20_000), (2, 70_001)]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=[f"{m}x{n}" for m, n in SOFTMAX_SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_float64_softmax(shape, dtype):
    x = (torch.randn(*shape, device=DEVICE) * 3).to(dtype)
    # float32 torch.softmax itself drifts past float32's tolerance on rows of 70,001:
    # compare with the exact answer, rounded to the kernel's dtype
    expected = torch.softmax(x.double(), dim=-1).to(dtype)
    _close(softmax.softmax(x), expected)


@pytest.mark.parametrize("n_cols", [300, 30_000], ids=["one-block", "split-rows"])
def test_softmax_extreme_rows_like_torch(n_cols):
    x = torch.randn(5, n_cols, device=DEVICE)
    x[0] = float("-inf")  # all -inf: NaN, as torch gives
    x[1, : n_cols * 2 // 3] = float("-inf")  # leading -inf blocks, then finite values
    x[2] *= 1e4  # exp would overflow without the max subtraction
    x[3, ::7] = float("-inf")
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, -1), equal_nan=True)


def test_softmax_row_stride_and_columns():
    wide = torch.randn(20, 900, device=DEVICE)
    torch.testing.assert_close(softmax.softmax(wide[:, :781]), torch.softmax(wide[:, :781], -1))
    column_major = torch.randn(300, 40, device=DEVICE).t()  # columns not adjacent
    torch.testing.assert_close(softmax.softmax(column_major), torch.softmax(column_major, -1))
    with pytest.raises(ValueError, match="2-D tensor"):
        softmax.softmax(torch.ones(2, 3, 4, device=DEVICE))


MATMUL_SHAPES = [(1, 1, 1), (1, 37, 17), (37, 1, 23), (29, 31, 1), (61, 67, 71), (45, 53, 7)]


@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=["x".join(map(str, s)) for s in MATMUL_SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_matches_float64(shape, dtype):
    m, n, k = shape
    a = torch.randn(m, k, device=DEVICE).to(dtype)
    b = torch.randn(k, n, device=DEVICE).to(dtype).t().contiguous().t()  # B column-major
    expected = (a.double() @ b.double()).to(dtype)
    tol = tolerance_for("tf32" if dtype == torch.float32 and runtime.MODE == "gpu" else dtype)
    atol = tol.atol * k**0.5
    torch.testing.assert_close(matmul.matmul(a, b), expected, rtol=tol.rtol, atol=atol)
    relu = matmul.matmul(a, b, activation="relu")
    torch.testing.assert_close(relu, torch.relu(expected), rtol=tol.rtol, atol=atol)


def test_matmul_edge_cases_and_errors():
    a, b = torch.randn(3, 0, device=DEVICE), torch.randn(0, 4, device=DEVICE)
    assert torch.equal(matmul.matmul(a, b), torch.zeros(3, 4, device=DEVICE))
    with pytest.raises(ValueError, match=r"a \[M, K\] and b \[K, N\]"):
        matmul.matmul(torch.ones(2, 3, device=DEVICE), torch.ones(4, 2, device=DEVICE))
    huge = torch.empty(1, 1, device=DEVICE).expand(1 << 16, 1 << 15)  # a view of 1 element
    with pytest.raises(ValueError, match="2\\^31 elements or more"):
        matmul.matmul(huge, torch.empty(1 << 15, 4, device=DEVICE))
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        matmul.matmul(torch.ones(2, 2, device=DEVICE), torch.ones(2, 2, device=DEVICE), "gelu")


def _matmul_error(got, a, b):
    """|got - a @ b| over |a| @ |b| (Frobenius norms): the rounding errors against the size
    of the terms they come from. Where a row of the product nearly cancels (b with all
    rows equal, say), |a @ b| can be tiny and no bound relative to it holds."""
    expected = a.double() @ b.double()
    scale = (a.double().abs() @ b.double().abs()).norm()
    return ((got.double() - expected).norm() / scale).item()


def _to_tf32(x):
    """x rounded to nearest at TF32's 10 significand bits, as the kernel rounds B."""
    rounded = ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(x.isfinite(), rounded, x)


@pytest.mark.parametrize("b_layout", ["row-major", "column-major"])
@pytest.mark.parametrize("tf32", [False, True], ids=["ieee", "tf32"])
def test_fp32_matmul_takes_b_in_either_layout(tf32, b_layout):
    # with TF32 a row-major B goes first in the dot (C^T = B^T A^T), rounded on the way.
    # An error over the whole product (see _matmul_error): a GPU adds the K terms one after
    # another in float32, and on an element near zero that sum's rounding can pass any rtol
    bound = 2e-3 if tf32 else 1e-5
    # the last shape is past SMALL_PRODUCT: on a GPU it autotunes, non-square tiles included
    for m, n, k in [(61, 67, 71), (1, 37, 17), (37, 1, 23), (45, 53, 7), (128, 384, 352)]:
        # a already holds TF32 values, so that whatever the tensor cores do to it is exact
        # and only the treatment of b shows
        a = _to_tf32(torch.randn(m, k, device=DEVICE))
        b = torch.randn(k, n, device=DEVICE)
        if b_layout == "column-major":
            b = b.t().contiguous().t()
        with runtime.tf32(tf32):
            got = matmul.matmul(a, b)
            relu = matmul.matmul(a, b, activation="relu")
        assert _matmul_error(got, a, b) < bound, (m, n, k)
        assert torch.equal(relu, torch.relu(got)), (m, n, k)
        if tf32 and b_layout == "row-major" and n > 1:
            # b is rounded to the nearest TF32 value, not cut: a cut would be 4e-5 or more
            # off (a b of one column is K-major too, and takes the plain kernel)
            assert _matmul_error(got, a, _to_tf32(b)) < 1e-5, (m, n, k)


@pytest.mark.parametrize("tf32", [False, True], ids=["ieee", "tf32"])
def test_matmul_keeps_nan_and_inf(tf32):
    a = torch.randn(9, 40, device=DEVICE)
    b = torch.randn(40, 24, device=DEVICE)
    b.view(torch.int32)[3, 5] = 0x7FFFFFFF  # the NaN GPU arithmetic makes; +1 would carry
    b[4, 7] = float("inf")
    with runtime.tf32(tf32):
        got = matmul.matmul(a, b)
    expected = a.double() @ b.double()
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.isinf(), expected.isinf())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_matmul_awkward_large_shape_on_gpu(dtype):
    a = torch.randn(1000, 777, device=DEVICE, dtype=dtype)
    b = torch.randn(777, 3000, device=DEVICE, dtype=dtype)
    expected = a.float() @ b.float()
    error = (matmul.matmul(a, b).float() - expected).norm() / expected.norm()
    assert error < 1e-2


@pytest.mark.gpu
def test_matmul_tunes_each_layout_of_its_operands_on_its_own():
    # at the same sizes a row-major and a K-major B want different tiles: each gets its own
    # choice (tuned, or from the tile table), not the one the other layout left behind
    M, N, K = 515, 1031, 771
    a = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    b = torch.randn(K, N, device=DEVICE, dtype=torch.float16)
    tuner = matmul.matmul_kernel_autotuned
    for b_seen in (b, b.t().contiguous().t()):
        expected = a.float() @ b_seen.float()
        assert (matmul.matmul(a, b_seen).float() - expected).norm() / expected.norm() < 1e-2
    assert sum(key[:3] == (M, N, K) for key in tuner.cache) == 2


TMA_SHAPES = [(1, 8, 1), (5, 8, 3), (37, 96, 77), (70, 40, 130), (150, 232, 70)]
needs_tma = pytest.mark.skipif(not fast.tma_available(), reason="needs a TMA unit (Hopper)")


@needs_tma
@pytest.mark.parametrize("b_layout", ["row-major", "K-major"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_matmul_matches_float64(dtype, b_layout):
    # N a multiple of 8 keeps C's rows 16 bytes apart, as the TMA unit needs; A and B are
    # padded copies for the same reason. Tiles of 32 make every shape an edge case: smaller
    # than a tile, prime sizes, several tiles in M and in K with a ragged last one
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "WARP_SPECIALIZE": False}
    bound = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}[dtype]
    for m, n, k in TMA_SHAPES:
        a = fast.padded_copy(torch.randn(m, k, device=DEVICE).to(dtype), contiguous_axis=1)
        b = torch.randn(k, n, device=DEVICE).to(dtype)
        b = fast.padded_copy(b, contiguous_axis=1 if b_layout == "row-major" else 0)
        c, relu = (torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype) for _ in "cr")
        fast.tma_matmul(a, b, c, config=config)
        fast.tma_matmul(a, b, relu, "relu", config=config)
        assert _matmul_error(c, a, b) < bound, (m, n, k)
        assert torch.equal(relu, torch.relu(c)), (m, n, k)


@needs_tma
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_matmul_takes_an_m_major_a_and_a_bias(dtype, activation):
    # lesson 07's Linear: grad_weight = g^T @ x reads g^T, M-major; the forward adds a bias
    # and an activation in the epilogue. N a multiple of 8 keeps C's rows 16 bytes apart
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "WARP_SPECIALIZE": False}
    for m, n, k in TMA_SHAPES:
        a = fast.padded_copy(torch.randn(m, k, device=DEVICE).to(dtype), contiguous_axis=0)
        b = fast.padded_copy(torch.randn(k, n, device=DEVICE).to(dtype), contiguous_axis=1)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        c = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
        fast.tma_matmul(a, b, c, activation, config=config, bias=bias)
        exact = references.linear_activation(a.double() @ b.double() + bias.double(), activation)
        tol = tolerance_for(dtype)
        torch.testing.assert_close(c.double(), exact, rtol=tol.rtol, atol=tol.rtol * k**0.5)


# (M, N, K) and programs, over tiles of 32: one tile's seven steps shared by five programs,
# fewer steps than programs (the last ones idle), shares inside one tile, M and N smaller
# than a tile, K not a multiple of 32, several tiles with ragged edges; N a multiple of 8
# keeps C's rows 16 bytes apart
STREAM_K_CASES = [((32, 32, 224), 5), ((32, 32, 96), 5), ((5, 8, 300), 4), ((70, 40, 130), 3),
                  ((37, 96, 77), 4), ((150, 232, 70), 7)]  # fmt: skip


@needs_tma
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("layouts", ["row-major", "A M-major, B K-major"])
def test_stream_k_matches_float64(layouts, activation):
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4}
    contiguous_axis = 1 if layouts == "row-major" else 0
    dtype = torch.float32 if runtime.INTERPRETED else torch.float16
    tol = tolerance_for(dtype)
    for (m, n, k), programs in STREAM_K_CASES:
        a = fast.padded_copy(torch.randn(m, k, device=DEVICE).to(dtype), contiguous_axis)
        b = fast.padded_copy(torch.randn(k, n, device=DEVICE).to(dtype), contiguous_axis)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        exact = references.linear_activation(a.double() @ b.double() + bias.double(), activation)
        c = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
        launch = stream_k.stream_k_launch(a, b, c, activation or "", "ieee", True, config, programs)
        partials, flags = stream_k._workspace(c.device, programs, 32 * 32)
        for _ in range(2):  # the second launch finds the flags as the first left them
            c.fill_(float("nan"))
            partials.fill_(float("nan"))  # what a program reading too early would add
            launch(a, b, c, bias)
            torch.testing.assert_close(c.double(), exact, rtol=tol.rtol, atol=tol.rtol * k**0.5)
        assert torch.count_nonzero(flags) == 0, (m, n, k, programs)


def test_stream_k_takes_the_products_whose_tiles_leave_sms_idle():
    pays = stream_k.stream_k_pays
    # weight gradients of 768-wide layers: 72 tiles of 128 x 256 on 132 SMs
    assert pays(3072, 768, 4096, 132) and pays(768, 3072, 16384, 132)
    assert not pays(4096, 768, 3072, 132)  # 96 tiles: measured slower stream-K
    assert not pays(4096, 1024, 4096, 132)  # 128 tiles: 4 SMs idle
    assert not pays(2048, 2056, 2048, 132)  # two waves, as 192 tiles, which ran slower stream-K
    assert not pays(8192, 8192, 8192, 132)
    assert not pays(3072, 768, 768, 132)  # 12 steps along K: too few to share out


@pytest.mark.skipif(runtime.MODE == "gpu", reason="the interpreter's fixed config")
def test_tma_matmul_runs_without_a_config_in_the_interpreter():
    a = fast.padded_copy(torch.randn(70, 45), contiguous_axis=1)
    b = torch.randn(45, 40)
    c = torch.empty(70, 40)
    fast.tma_matmul(a, b, c)
    assert _matmul_error(c, a, b) < 1e-5


@needs_tma
def test_tma_matmul_names_the_matrix_that_breaks_the_rules():
    a = torch.randn(8, 7, device=DEVICE)  # rows 28 bytes apart
    b = torch.randn(7, 8, device=DEVICE)
    c = torch.empty(8, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"a \(strides \[7, 1\].*multiple of 16 bytes apart"):
        fast.tma_matmul(a, b, c)
    with pytest.raises(ValueError, match=r"b \(strides \[8, 1\].*16-byte aligned address"):
        fast.tma_matmul(a[:, :4].contiguous(), torch.randn(33, device=DEVICE)[1:].view(4, 8), c)
    with pytest.raises(ValueError, match="activation must be None, 'relu' or 'gelu'"):
        fast.tma_matmul(a[:, :4].contiguous(), b[:4], c, "tanh")
    with pytest.raises(ValueError, match="has an empty axis"):
        fast.tma_matmul(a[:0], b, c[:0])


def test_matmul_hands_the_tma_kernel_only_what_it_can_take(monkeypatch):
    # the routing rule alone, as on a Hopper GPU; no kernel runs
    monkeypatch.setattr(runtime, "INTERPRETED", False)
    monkeypatch.setattr(fast, "capability", lambda device: (9, 0))
    f16 = torch.float16

    def suits(a, b, c=None, tf32=False):
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype) if c is None else c
        return fast._tma_suits(a, b, c, tf32)

    a, b = torch.randn(64, 48).to(f16), torch.randn(48, 32).to(f16)
    assert suits(a, b) and suits(a, b.t().contiguous().t())  # B row-major or K-major
    assert suits(a.t().contiguous().t(), b)  # A column-major: tiles of A^T, transposed
    assert not suits(torch.randn(48, 64).t(), torch.randn(48, 32).t().contiguous().t(), tf32=True)
    assert not suits(torch.randn(64, 49).to(f16)[:, 1:], b)  # starts 2 bytes in
    assert not suits(a, b[:1].expand(48, 32))  # rows on top of each other
    assert not suits(a, torch.randn(48, 36).to(f16))  # C's rows 72 bytes apart
    a32, b32 = torch.randn(64, 48), torch.randn(48, 32)
    assert suits(a32, b32.t().contiguous().t(), tf32=True)  # TF32, B K-major
    assert not suits(a32, b32, tf32=True)  # TF32, B row-major: B-first, or a copy
    assert not suits(a32, b32.t().contiguous().t())  # exact fp32: no tensor cores
    assert not suits(a.double(), b.double().t().contiguous().t())  # float64: no TMA kernel
    monkeypatch.setattr(fast, "capability", lambda device: (8, 0))
    assert not suits(a, b)


on_tma_gpu = pytest.mark.skipif(
    runtime.MODE != "gpu" or hopper.capability(DEVICE) not in fast.TMA_GPUS,
    reason="needs a GPU in TMA_GPUS",
)


@pytest.mark.gpu
@on_tma_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 compiles as fp16
def test_every_tma_config_compiles_and_matches(dtype):
    # the autotuner keeps whichever config wins; each must be right, warp-specialised or
    # not, on awkward shapes: one row and K of 1, primes, several tiles with ragged edges
    # (a config that needs more shared memory than the GPU has, the autotuner skips too)
    precision = "tf32" if dtype == torch.float32 else "ieee"
    for m, n, k, stages, warps, specialize in fast.TMA_TILE_SHAPES:
        tiles = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}
        launch = {"WARP_SPECIALIZE": specialize, "num_stages": stages, "num_warps": warps}
        for rows, cols, depth in [(1, 8, 1), (37, 96, 77), (300, 1000, 260)]:
            a = fast.padded_copy(torch.randn(rows, depth, device=DEVICE).to(dtype), 1)
            b = fast.padded_copy(torch.randn(cols, depth, device=DEVICE).to(dtype), 1).t()
            c = torch.full((rows, cols), float("nan"), device=DEVICE, dtype=dtype)
            try:
                fast.tma_matmul(a, b, c, input_precision=precision, config=tiles | launch)
            except triton.runtime.errors.OutOfResources:
                assert dtype == torch.float32 and k == 64, (tiles, launch)
                break
            assert _matmul_error(c, a, b) < 2e-3, (tiles, launch, rows, cols, depth)


@pytest.mark.gpu
@on_tma_gpu
def test_matmul_takes_the_tma_kernel_where_it_suits(monkeypatch):
    calls = []
    tma_launch_for = fast.tma_launch
    monkeypatch.setattr(
        fast, "tma_launch", lambda *args, **kw: calls.append(1) or tma_launch_for(*args, **kw)
    )
    monkeypatch.setattr(matmul, "_plans", PlanCache())  # each product chooses its route afresh
    # past SMALL_PRODUCT, none a multiple of the large tiles; the first below TMA_MIN_PRODUCT
    medium, large = (1032, 1040, 1048), (2048, 2056, 2050)
    tall = (fast.TF32_COPY_MIN_ROWS, 1028, 2048)  # enough rows of A to copy a TF32 B
    assert math.prod(medium) < fast.TMA_MIN_PRODUCT <= min(math.prod(large), math.prod(tall))
    cases = [  # shape, dtype, TF32 allowed, B K-major, N + extra, whether the TMA kernel takes it
        (large, torch.float16, False, False, 0, True),
        (large, torch.bfloat16, False, True, 0, True),
        (large, torch.float32, True, True, 0, True),
        (tall, torch.float32, True, False, 0, True),  # B copied K-major first
        (tall, torch.float32, True, False, 2, False),  # C's rows 4120 bytes: B-first
        (large, torch.float32, True, False, 0, False),  # too few rows of A: B-first
        (large, torch.float32, False, True, 0, False),  # exact fp32: no tensor cores
        (large, torch.float16, False, False, 1, False),  # C's rows 4114 bytes apart
        # a product this size takes less GPU time than the TMA launch takes host time, so it
        # stays with the lesson's kernel, whatever its layout
        (medium, torch.float16, False, False, 0, False),
        (medium, torch.float32, True, True, 0, False),
        (medium, torch.bfloat16, False, True, 0, False),
    ]
    for (m, n, k), dtype, tf32, b_k_major, extra, takes_tma in cases:
        cols = n + extra
        calls.clear()
        a = torch.randn(m, k, device=DEVICE).to(dtype)
        b = (
            torch.randn(cols, k, device=DEVICE).to(dtype).t()
            if b_k_major
            else torch.randn(k, cols, device=DEVICE).to(dtype)
        )
        with runtime.tf32(tf32):
            got = matmul.matmul(a, b)
        assert bool(calls) == takes_tma, (m, dtype, tf32, b_k_major, cols)
        assert _matmul_error(got, a, b) < (1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@on_tma_gpu
def test_products_whose_tiles_leave_sms_idle_go_stream_k(monkeypatch):
    # the weight gradients of a transformer's 768 <-> 3072 layers (g^T M-major), through
    # matmul and through Linear's backward; each launch is stream-K's alone
    from course_lib.kernels import linear

    monkeypatch.setattr(matmul, "_plans", PlanCache())
    sms = hopper.sm_count(torch.device(DEVICE).index or 0)
    bf16 = torch.bfloat16
    x = torch.randn(4096, 3072, device=DEVICE, dtype=bf16)
    w = torch.randn(768, 3072, device=DEVICE, dtype=bf16)
    g = torch.randn(4096, 768, device=DEVICE, dtype=bf16)
    for a, b in [(g.t(), x), (x.t(), g)]:
        assert stream_k.stream_k_pays(a.shape[0], b.shape[1], a.shape[1], sms)
        for _ in range(2):  # the first call plans, the second goes straight to the kernel
            with recording_launches() as launches:
                got = matmul.matmul(a, b)
            assert [launch.kernel for launch in launches] == [stream_k.tma_stream_k_kernel]
            assert _matmul_error(got, a, b) < 1e-2
    weight = w.detach().requires_grad_()
    with recording_launches() as launches:
        (grad_weight,) = torch.autograd.grad(linear.linear(x, weight), weight, g)
    assert stream_k.tma_stream_k_kernel in [launch.kernel for launch in launches]
    assert _matmul_error(grad_weight, g.t(), x) < 1e-2


@pytest.mark.gpu
@on_tma_gpu
def test_a_tma_product_runs_in_a_thread_that_has_made_no_cuda_call():
    # as autograd's backward thread may be: the descriptors are built on the host, through
    # CUDA's driver, before Triton's launcher makes a context current
    import threading

    a, b = (torch.randn(2048, 2048, device=DEVICE, dtype=torch.float16) for _ in "ab")
    want = matmul.matmul(a, b)  # planned, compiled and loaded in this thread
    got = []
    thread = threading.Thread(target=lambda: got.append(matmul.matmul(a, b)))
    thread.start()
    thread.join()
    assert got and torch.equal(got[0], want)


@pytest.mark.parametrize("contiguous_axis", [0, 1])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_padded_copy_keeps_the_values_and_pads_the_rows(layout, contiguous_axis):
    base = torch.randn(70, 130, device=DEVICE)
    t = {"contiguous": base, "transposed": base.t(), "sliced": base[1::2, 3:120:2]}[layout]
    copy = fast.padded_copy(t, contiguous_axis)
    assert torch.equal(copy, t)
    assert copy.stride(contiguous_axis) == 1 and copy.stride(1 - contiguous_axis) % 16 == 0


def test_tf32_copies_a_row_major_b_k_major_only_where_the_tma_kernel_then_takes_it(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(runtime, "INTERPRETED", False)
    monkeypatch.setattr(fast, "capability", lambda device: (9, 0))
    meta = dict(device="meta")

    def copies(a, b, a_copied=False):
        chosen = fast._copies_b_k_major(a, b, a_copied)
        if chosen:  # then the TMA kernel takes the copies, as first_call makes them
            (rows, depth), cols = a.shape, b.shape[1]
            padded = -(-depth // 16) * 16
            a = torch.empty_strided((rows, depth), (padded, 1), **meta) if a_copied else a
            b_copy = torch.empty_strided((depth, cols), (1, padded), **meta)
            assert fast._tma_suits(a, b_copy, torch.empty(rows, cols, **meta), tf32=True)
        return chosen

    m, n, k = fast.TF32_COPY_MIN_ROWS, 1028, 2048  # just past TMA_MIN_PRODUCT
    assert m * n * k >= fast.TMA_MIN_PRODUCT > m * n * k // 2
    a, b = torch.empty(m, k, **meta), torch.empty(k, n, **meta)
    assert copies(a, b)
    assert copies(a, torch.empty(k, 2 * n, **meta)[:, ::2])  # any layout but K-major
    assert not copies(a, torch.empty(n, k, **meta).t())  # K-major already
    assert not copies(a, torch.empty(k, n + 2, **meta))  # C's rows 4120 bytes apart
    few_rows = torch.empty(m // 2, 2 * k, **meta)  # as large a product, half the rows
    assert not copies(few_rows, torch.empty(2 * k, n, **meta))
    assert not copies(a[:, : k // 2], b[: k // 2])  # below TMA_MIN_PRODUCT
    a_off = torch.empty(m, k + 4, **meta)[:, 1 : k + 1]  # starts 4 bytes past a boundary
    assert not copies(a_off, b)
    assert copies(a_off, b, a_copied=True)  # its copy is aligned
    assert not copies(torch.empty(1, k, **meta).expand(m, k), b)  # rows on top of each other
    # K x N fits in 32-bit offsets, N rows of K padded to 2048 do not: B-first takes it
    wide_k, wide_n = 2047, 1048580
    assert wide_k * wide_n < 2**31 <= 2048 * wide_n
    wide_b = torch.empty(wide_k, wide_n, **meta)
    assert not copies(torch.empty(m, wide_k, **meta), wide_b, a_copied=True)
    with FakeTensorMode():  # traced into a graph: no address, only an offset
        fake_a, fake_b = torch.empty(m, k + 4)[:, 1 : k + 1], torch.empty(k, n)
        monkeypatch.setattr(hopper, "into_graph", lambda: True)
        assert not fast._copies_b_k_major(fake_a, fake_b, a_copied=False)
        assert fast._copies_b_k_major(torch.empty(m, k + 4)[:, 4:], fake_b, a_copied=False)
        monkeypatch.setattr(hopper, "into_graph", lambda: False)
    monkeypatch.setattr(fast, "capability", lambda device: (8, 0))
    assert not copies(a, b)
    monkeypatch.setattr(fast, "capability", lambda device: (9, 0))
    monkeypatch.setattr(runtime, "INTERPRETED", True)
    assert not copies(a, b)


def test_views_that_reach_past_32_bit_offsets_are_copied(monkeypatch):
    monkeypatch.setattr(runtime, "INTERPRETED", False)  # where copies are made at all
    wide_strides = torch.empty_strided((4, 16), (1 << 30, 1), device="meta")
    assert fast._copy_axis(wide_strides) == 1
    compact = torch.empty(4, 16, device="meta")  # rows 16 elements apart: nothing to do
    assert fast._copy_axis(compact) is None


def test_padding_that_reaches_past_32_bit_offsets_is_refused_before_allocating():
    # 2^27 + 1 rows of 9 elements fit; padded to 16 they would span 2^31 + 9 elements
    tall = torch.empty((1 << 27) + 1, 9, device="meta")
    with pytest.raises(ValueError, match="2\\^31 elements of memory or more"):
        fast.padded_copy(tall, contiguous_axis=1)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_matmul_edge_pieces_never_leak_on_gpu(precision):
    # Inputs in every layout, several padded with NaN past their edge. Where rows are a
    # multiple of 16 elements apart the kernel loads 16-byte pieces, and the piece that
    # straddles M or N reads NaN from the padding: none of it may reach the result.
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)

    def layouts(rows, cols):
        """x [rows, cols] row-major, column-major, in NaN-padded rows and columns a
        multiple of 16 elements apart (no copy is made of those), and one row repeated."""
        x = torch.randn(rows, cols, device=DEVICE).to(dtype)
        nans = lambda r, c: torch.full((r, (c + 15) // 16 * 16 + 16), float("nan")).to(x)
        yield x
        yield x.t().contiguous().t()
        yield nans(rows, cols)[:, :cols].copy_(x)
        yield nans(cols, rows)[:, :rows].copy_(x.t()).t()
        yield x[:1].expand(rows, cols)  # a row stride of 0

    tol = {"fp16": 2e-3, "bf16": 1e-2, "fp32": 1e-5, "tf32": 2e-3}[precision]
    with runtime.tf32(precision == "tf32"):
        for m, n, k in [(61, 301, 77), (1, 301, 77), (61, 1, 77)]:
            for a in layouts(m, k):
                for b in layouts(k, n):
                    error = _matmul_error(matmul.matmul(a, b), a, b)
                    assert error < tol, (m, n, k, a.stride(), b.stride(), error)


@pytest.mark.gpu
def test_softmax_wide_rows_on_gpu():
    for shape in [(4096, 1 << 17), (64, 1 << 20)]:
        x = torch.randn(*shape, device=DEVICE)
        torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, -1))


# --- lesson 06 ----------------------------------------------------------------------------

from course_lib.kernels import conv2d, conv2d_fast_paths  # noqa: E402

CONV_SHAPES = [
    # B, C, H, W, O, kh, kw, stride, padding, dilation
    pytest.param(1, 3, 3, 3, 2, 3, 3, 1, 0, 1, id="one-output-pixel"),
    pytest.param(2, 5, 13, 11, 7, 3, 3, 1, 1, 1, id="odd-3x3-p1"),
    pytest.param(2, 4, 6, 7, 3, 1, 1, 1, 0, 1, id="1x1"),
    pytest.param(1, 3, 12, 9, 4, 5, 5, 2, (2, 1), 1, id="5x5-s2-p2x1"),
    pytest.param(1, 3, 17, 17, 8, 7, 7, 2, 3, 1, id="7x7-stem-s2"),
    pytest.param(1, 20, 11, 10, 5, 3, 3, 1, 2, 2, id="dilation2"),
    pytest.param(1, 37, 6, 5, 19, 3, 3, 1, 1, 1, id="C37-O19"),
    pytest.param(1, 32, 5, 6, 16, 3, 3, 1, 1, 1, id="C32-channel-tiles"),
    pytest.param(2, 4, 8, 9, 3, 1, 3, (2, 1), (0, 1), 1, id="1x3-s2x1"),
    pytest.param(1, 6, 9, 8, 5, 2, 4, 1, "same", (2, 1), id="same-even-kernel"),
    pytest.param(1, 6, 9, 8, 5, 3, 3, 2, "valid", 1, id="valid-s2"),
]
LAYOUTS = [
    pytest.param(torch.contiguous_format, torch.contiguous_format, id="nchw"),
    pytest.param(torch.channels_last, torch.channels_last, id="channels-last"),
    pytest.param(torch.channels_last, torch.contiguous_format, id="channels-last-x-only"),
    pytest.param(torch.contiguous_format, torch.channels_last, id="channels-last-w-only"),
]


def _conv_error(got, x, weight, bias, stride, padding, dilation) -> float:
    """|got - exact| / the largest |exact|: float64 in, so only the kernel's rounding shows."""
    with warnings.catch_warnings():  # torch warns of padding="same" with an even kernel
        warnings.simplefilter("ignore", UserWarning)
        exact = torch.nn.functional.conv2d(
            x.double(), weight.double(), None if bias is None else bias.double(),
            stride, padding, dilation,
        )  # fmt: skip
    assert got.shape == exact.shape
    return float((got.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize(("B", "C", "H", "W", "O", "kh", "kw", "stride", "padding", "dilation"),
                         CONV_SHAPES)  # fmt: skip
@pytest.mark.parametrize(("x_format", "w_format"), LAYOUTS)
def test_conv2d_matches_float64(B, C, H, W, O, kh, kw, stride, padding, dilation, x_format,
                                w_format):  # fmt: skip
    x = torch.randn(B, C, H, W, device=DEVICE).contiguous(memory_format=x_format)
    weight = torch.randn(O, C, kh, kw, device=DEVICE).contiguous(memory_format=w_format)
    bias = torch.randn(O, device=DEVICE)
    with torch.backends.cudnn.flags(allow_tf32=False):
        got = conv2d.conv2d(x, weight, bias, stride, padding, dilation)
    assert _conv_error(got, x, weight, bias, stride, padding, dilation) < 1e-5
    # the output comes in x's memory format
    channels_last = x_format == torch.channels_last and not x.is_contiguous()
    assert got.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_format", [torch.contiguous_format, torch.channels_last])
def test_conv2d_in_every_dtype(dtype, x_format):
    x = torch.randn(2, 24, 10, 9, device=DEVICE).to(dtype).contiguous(memory_format=x_format)
    weight = torch.randn(40, 24, 3, 3, device=DEVICE).to(dtype)
    got = conv2d.conv2d(x, weight, padding=1)
    assert got.dtype == dtype
    # fp16 and bf16 inputs are exact in float64; the sum of 216 products in fp32, rounded once
    bound = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    assert _conv_error(got, x, weight, None, 1, 1, 1) < bound


def test_conv2d_takes_any_strides():
    big = torch.randn(2, 8, 20, 21, device=DEVICE)
    x = big[:, ::2, 1:-1:2, ::3]  # a view with steps along every axis
    weight = torch.randn(10, 12, 3, 3, device=DEVICE)[1::2, ::3]
    with torch.backends.cudnn.flags(allow_tf32=False):
        got = conv2d.conv2d(x, weight, padding=1)
    assert _conv_error(got, x, weight, None, 1, 1, 1) < 1e-5


def test_conv2d_says_what_is_wrong():
    x = torch.randn(1, 3, 8, 8, device=DEVICE)
    weight = torch.randn(4, 3, 3, 3, device=DEVICE)
    with pytest.raises(NotImplementedError, match="groups=2"):
        conv2d.conv2d(x, weight, groups=2)
    with pytest.raises(ValueError, match="x has 3 channels but weight expects 5"):
        conv2d.conv2d(x, torch.randn(4, 5, 3, 3, device=DEVICE))
    with pytest.raises(ValueError, match=r"x \[B, C, H, W\]"):
        conv2d.conv2d(x[0], weight)
    with pytest.raises(TypeError, match="dtypes differ"):
        conv2d.conv2d(x, weight.half())
    with pytest.raises(ValueError, match="bias must have shape"):
        conv2d.conv2d(x, weight, torch.randn(3, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit"):
        conv2d.conv2d(x, torch.randn(4, 3, 9, 9, device=DEVICE))
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        conv2d.conv2d(x, weight, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be"):
        conv2d.conv2d(x, weight, padding="full")
    with pytest.raises(TypeError, match="stride must be an int or a pair"):
        conv2d.conv2d(x, weight, stride=(1, 2, 3))
    with pytest.raises(ValueError, match=">= 1"):
        conv2d.conv2d(x, weight, dilation=0)


def test_conv2d_of_an_empty_batch_is_empty():
    weight = torch.randn(4, 3, 3, 3, device=DEVICE)
    assert conv2d.conv2d(torch.randn(0, 3, 8, 8, device=DEVICE), weight).shape == (0, 4, 6, 6)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("B", "C", "H", "O", "k", "stride", "padding", "dtype", "x_format"),
    [
        (8, 64, 56, 64, 3, 1, 1, torch.float16, torch.channels_last),  # a ResNet layer
        (8, 64, 56, 64, 3, 1, 1, torch.bfloat16, torch.contiguous_format),
        (4, 3, 224, 64, 7, 2, 3, torch.float16, torch.contiguous_format),  # the stem
        (4, 100, 30, 72, 3, 2, 1, torch.float32, torch.channels_last),  # no tile divides C
    ],
    ids=["resnet-fp16-cl", "resnet-bf16-nchw", "stem-fp16", "c100-tf32-cl"],
)
def test_conv2d_on_network_shapes_on_gpu(B, C, H, O, k, stride, padding, dtype, x_format):
    x = torch.randn(B, C, H, H, device=DEVICE, dtype=dtype).contiguous(memory_format=x_format)
    weight = torch.randn(O, C, k, k, device=DEVICE, dtype=dtype)
    got = conv2d.conv2d(x, weight, None, stride, padding)
    bound = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 5e-3}[dtype]
    assert _conv_error(got, x, weight, None, stride, padding, 1) < bound


def test_conv2d_reads_a_large_weight_from_a_copy_in_the_order_of_k(monkeypatch):
    # past MAX_STRIDED_WEIGHT a weight whose rows are not in K's order is copied first;
    # a limit of 0 sends every weight of this test through that path
    monkeypatch.setattr(conv2d_fast_paths, "MAX_STRIDED_WEIGHT", 0)
    monkeypatch.setattr(conv2d, "_plans", PlanCache())  # routes chosen with the old limit go
    x = torch.randn(2, 20, 7, 6, device=DEVICE)
    for x_format, w_format in [(torch.contiguous_format, torch.channels_last),
                               (torch.channels_last, torch.contiguous_format)]:  # fmt: skip
        weight = torch.randn(5, 20, 3, 3, device=DEVICE).contiguous(memory_format=w_format)
        with torch.backends.cudnn.flags(allow_tf32=False):
            got = conv2d.conv2d(x.contiguous(memory_format=x_format), weight, padding=1)
        assert _conv_error(got, x, weight, None, 1, 1, 1) < 1e-5


def test_conv2d_copies_a_strided_weight_of_any_size_in_large_products(monkeypatch):
    # from COPY_WEIGHT_PRODUCT multiply-adds on, even a small weight whose rows are not in
    # K's order is copied first; below it, and for a weight in K's order, none is
    copies = []
    copied = conv2d_fast_paths._copied
    monkeypatch.setattr(
        conv2d_fast_paths, "_copied", lambda t, *f: copies.append(t.shape) or copied(t, *f)
    )
    x = torch.randn(2, 20, 7, 6, device=DEVICE)  # NCHW: K in (r, s, c) order
    product = 2 * 7 * 6 * 5 * 20 * 3 * 3
    nchw = torch.randn(5, 20, 3, 3, device=DEVICE)
    in_k_order = nchw.contiguous(memory_format=torch.channels_last)
    for limit, weight, copied_w in [(product + 1, nchw, False), (product, nchw, True),
                                    (product, in_k_order, False)]:  # fmt: skip
        monkeypatch.setattr(conv2d_fast_paths, "COPY_WEIGHT_PRODUCT", limit)
        monkeypatch.setattr(conv2d, "_plans", PlanCache())
        copies.clear()
        with torch.backends.cudnn.flags(allow_tf32=False):
            got = conv2d.conv2d(x, weight, padding=1)
        assert copies == ([weight.shape] if copied_w else []), (limit, weight.stride())
        assert _conv_error(got, x, weight, None, 1, 1, 1) < 1e-5


def test_conv2d_takes_a_bias_of_any_strides():
    x = torch.randn(1, 4, 6, 6, device=DEVICE)
    weight = torch.randn(4, 4, 3, 3, device=DEVICE)
    for bias in (torch.randn(8, device=DEVICE)[::2], torch.randn(1, device=DEVICE).expand(4)):
        with torch.backends.cudnn.flags(allow_tf32=False):
            got = conv2d.conv2d(x, weight, bias, padding=1)
        assert _conv_error(got, x, weight, bias, 1, 1, 1) < 1e-5


# --- lesson 06 on Hopper: the TMA kernel ------------------------------------------------

from course_lib.bench.recording import recording_launches  # noqa: E402
from course_lib.kernels import conv2d_tma  # noqa: E402

TMA_CONV = fast.tma_available() and (runtime.INTERPRETED or hopper.capability(DEVICE) >= (9, 0))
TMA_CONV_SHAPES = [
    # B, C, H, W, O, kh, kw, padding (top, left, bottom, right), dilation, with a bias
    pytest.param(2, 16, 7, 6, 24, 3, 3, (1, 1, 1, 1), 1, True, id="odd-3x3-p1"),
    pytest.param(1, 24, 9, 5, 8, 3, 3, (2, 2, 2, 2), 2, True, id="dilation2"),
    pytest.param(1, 16, 5, 5, 16, 1, 1, (0, 0, 0, 0), 1, False, id="1x1-no-bias"),
    pytest.param(2, 32, 6, 7, 8, 5, 5, (2, 1, 2, 1), 1, True, id="5x5-p2x1"),
    pytest.param(1, 8, 6, 9, 40, 2, 4, (0, 1, 1, 2), 1, True, id="same-even-kernel"),
    pytest.param(3, 48, 1, 13, 16, 1, 3, (0, 0, 0, 0), 1, False, id="one-row-valid-no-bias"),
]


@pytest.mark.skipif(not TMA_CONV, reason="needs the interpreter or a GPU with a TMA unit")
@pytest.mark.parametrize(("B", "C", "H", "W", "O", "kh", "kw", "padding", "dilation", "with_bias"),
                         TMA_CONV_SHAPES)  # fmt: skip
@pytest.mark.parametrize(("x_format", "w_format", "out_format"), [
    pytest.param(torch.channels_last, torch.channels_last, torch.channels_last, id="cl"),
    pytest.param(torch.contiguous_format, torch.contiguous_format, torch.contiguous_format,
                 id="nchw"),
    pytest.param(torch.channels_last, torch.contiguous_format, torch.contiguous_format,
                 id="mixed"),
])  # fmt: skip
def test_tma_conv2d_matches_float64(B, C, H, W, O, kh, kw, padding, dilation, with_bias,
                                    x_format, w_format, out_format):  # fmt: skip
    # the boxes past the image's edges are the padding: the TMA unit fills them with zeros
    x = torch.randn(B, C, H, W, device=DEVICE).half().contiguous(memory_format=x_format)
    weight = torch.randn(O, C, kh, kw, device=DEVICE).half().contiguous(memory_format=w_format)
    bias = torch.randn(O, device=DEVICE).half() if with_bias else None
    top, left, bottom, right = padding
    OH = H + top + bottom - dilation * (kh - 1)
    OW = W + left + right - dilation * (kw - 1)
    # NaN where nothing is stored shows in the error
    out = torch.full((B, O, OH, OW), float("nan"), device=DEVICE).half()
    out = out.contiguous(memory_format=out_format)
    config = conv2d_tma.INTERPRETER_CONFIG if runtime.INTERPRETED else None
    conv2d_tma.tma_conv2d(x, weight, bias, out, (top, left), (dilation, dilation), config)
    padded = torch.nn.functional.pad(x.double(), (left, right, top, bottom))
    bias64 = None if bias is None else bias.double()
    exact = torch.nn.functional.conv2d(padded, weight.double(), bias64, 1, 0, dilation)
    assert out.shape == exact.shape
    error = (out.double() - exact).abs().max() / exact.abs().max()
    assert error < 2e-3, f"relative error {error:.1e}"


@pytest.mark.parametrize(
    ("shape", "view", "kernel_launches"),
    [
        pytest.param((2, 24, 7, 9), lambda t: t, 1, id="nchw-odd"),
        pytest.param((1, 3, 1, 1), lambda t: t, 1, id="one-pixel"),
        pytest.param((3, 72, 13, 11), lambda t: t, 1, id="multi-tile"),
        # a filter's few taps: narrow tiles of many channels
        pytest.param((40, 300, 3, 3), lambda t: t, 1, id="filter-3x3"),
        pytest.param((24, 80, 5, 5), lambda t: t, 1, id="filter-5x5"),
        pytest.param((2, 16, 1, 70), lambda t: t, 1, id="one-row"),
        pytest.param((2, 16, 70, 1), lambda t: t, 1, id="one-column"),
        pytest.param((2, 40, 9, 10), lambda t: t[:, ::2], 1, id="every-other-channel"),
        pytest.param((1, 16, 9, 10), lambda t: t.expand(3, -1, -1, -1), 1, id="expanded-batch"),
        # channels-last, but 24 channels of 2 bytes: rows the TMA unit does not take
        pytest.param((2, 24, 5, 7), lambda t: t.contiguous(memory_format=torch.channels_last),
                     1, id="channels-last"),  # fmt: skip
        # the pixels are no single axis: torch copies
        pytest.param((2, 8, 9, 10), lambda t: t[:, :, :, 1:-2], 0, id="rows-apart"),
        pytest.param((2, 8, 9, 10), lambda t: t.transpose(2, 3), 0, id="hw-transposed"),
    ],
)  # fmt: skip
def test_channels_last_copies_any_layout(shape, view, kernel_launches):
    x = view(torch.randn(shape, device=DEVICE).half())
    got = conv2d_tma.channels_last(x)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, x)
    with recording_launches() as launches:
        conv2d_tma.channels_last(x)
    assert [launch.kernel for launch in launches] == [conv2d_tma.channels_last_kernel] * (
        kernel_launches
    )


@pytest.mark.gpu
@pytest.mark.skipif(not TMA_CONV, reason="needs a GPU with a TMA unit")
def test_conv2d_sends_stride_1_convolutions_to_the_tma_kernel_on_hopper(monkeypatch):
    if hopper.capability(DEVICE) not in fast.TMA_GPUS:
        pytest.skip("the TMA kernel takes over on the GPUs where it was measured only")
    monkeypatch.setattr(
        conv2d_fast_paths, "_choose_route_by_timing", None
    )  # none of these is timed
    f16 = dict(device=DEVICE, dtype=torch.float16)
    cl = torch.channels_last
    nchw = (torch.randn(2, 128, 14, 14, **f16), torch.randn(136, 128, 3, 3, **f16))
    cases = [  # x, weight, stride, bias, which kernel
        (torch.randn(4, 64, 28, 28, **f16).to(memory_format=cl),
         torch.randn(64, 64, 3, 3, **f16).to(memory_format=cl), 1, True, "tma"),
        # NCHW below NCHW_TIMED_PRODUCT: read in place, with no copies
        (*nchw, 1, False, "lesson"),
        # stride 2, or fp32: the lesson's kernel
        (torch.randn(4, 64, 28, 28, **f16).to(memory_format=cl),
         torch.randn(64, 64, 3, 3, **f16).to(memory_format=cl), 2, False, "lesson"),
        (torch.randn(4, 64, 28, 28, device=DEVICE).to(memory_format=cl),
         torch.randn(64, 64, 3, 3, device=DEVICE), 1, False, "lesson"),
    ]  # fmt: skip
    kernels = {"tma": conv2d_tma.tma_conv2d_kernel, "lesson": conv2d.conv2d_kernel}
    for x, weight, stride, with_bias, which in cases:
        bias = torch.randn(weight.shape[0], device=DEVICE, dtype=x.dtype) if with_bias else None
        with recording_launches() as launches:
            got = conv2d.conv2d(x, weight, bias, stride, 1)
        # one launch: no copy through the course's kernel (a large weight is copied by torch)
        kernel = [launch.kernel for launch in launches]
        assert kernel == [kernels[which]], (which, x.shape, x.stride(), stride)
        bound = 5e-3 if x.dtype == torch.float32 else 2e-3  # TF32
        assert _conv_error(got, x, weight, bias, stride, 1, 1) < bound
        channels_last = x.is_contiguous(memory_format=cl) and not x.is_contiguous()
        assert got.is_contiguous(memory_format=cl if channels_last else torch.contiguous_format)
    # past NCHW_TMA_PRODUCT, x and the weight are copied channels-last first, untimed
    monkeypatch.setattr(conv2d_fast_paths, "NCHW_TIMED_PRODUCT", 0)
    monkeypatch.setattr(conv2d_fast_paths, "NCHW_TMA_PRODUCT", 0)
    monkeypatch.setattr(conv2d, "_plans", PlanCache())  # the routes chosen before the change go
    bias = torch.randn(136, **f16)
    with recording_launches() as launches:
        got = conv2d.conv2d(*nchw, bias, 1, 1)
    kernels = [launch.kernel for launch in launches]
    assert kernels == [conv2d_tma.channels_last_pair_kernel, conv2d_tma.tma_conv2d_kernel]
    assert _conv_error(got, *nchw, bias, 1, 1, 1) < 2e-3 and got.is_contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not TMA_CONV, reason="needs a GPU with a TMA unit")
def test_conv2d_times_an_nchw_inputs_two_routes_and_keeps_the_one_it_chose(monkeypatch):
    if hopper.capability(DEVICE) not in fast.TMA_GPUS:
        pytest.skip("the TMA kernel takes over on the GPUs where it was measured only")
    timer = conv2d_fast_paths._choose_route_by_timing
    f16 = dict(device=DEVICE, dtype=torch.float16)
    x, weight = torch.randn(2, 128, 14, 14, **f16), torch.randn(136, 128, 3, 3, **f16)
    bias = torch.randn(136, **f16)
    monkeypatch.setattr(conv2d_fast_paths, "NCHW_TIMED_PRODUCT", 0)  # this small layer is timed too
    routes = [
        [conv2d.conv2d_kernel],  # in place
        [conv2d_tma.channels_last_pair_kernel, conv2d_tma.tma_conv2d_kernel],  # copied
    ]
    for chosen, kernels in enumerate(routes):
        offered = []

        def pick(calls, chosen=chosen, offered=offered):
            offered.append(calls)
            return chosen

        monkeypatch.setattr(conv2d_fast_paths, "_choose_route_by_timing", pick)
        monkeypatch.setattr(conv2d, "_plans", PlanCache())
        for _ in range(3):  # chosen on the first call only, then kept
            with recording_launches() as launches:
                got = conv2d.conv2d(x, weight, bias, 1, 1)
            assert [launch.kernel for launch in launches] == kernels
            assert launches[-1].tuned.get("BLOCK_N")  # its tiles, for the benchmark's report
            assert _conv_error(got, x, weight, bias, 1, 1, 1) < 2e-3 and got.is_contiguous()
        assert len(offered) == 1 and len(offered[0]) == 2
    # with the timer itself: one of the two, the same on every call
    monkeypatch.setattr(conv2d_fast_paths, "_choose_route_by_timing", timer)
    monkeypatch.setattr(conv2d, "_plans", PlanCache())
    kept = []
    for _ in range(3):
        with recording_launches() as launches:
            got = conv2d.conv2d(x, weight, bias, 1, 1)
        kept.append([launch.kernel for launch in launches])
        assert _conv_error(got, x, weight, bias, 1, 1, 1) < 2e-3 and got.is_contiguous()
        # the convolution's launch names its tiles, chosen while the timer ran, for the
        # benchmark's report, whichever route was kept
        assert launches[-1].tuned.get("BLOCK_N"), launches[-1].kernel
    assert kept[0] in routes and kept == [kept[0]] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not TMA_CONV, reason="needs a GPU with a TMA unit")
def test_conv2d_does_not_time_its_routes_where_it_must_not(monkeypatch):
    if hopper.capability(DEVICE) not in fast.TMA_GPUS:
        pytest.skip("the TMA kernel takes over on the GPUs where it was measured only")
    f16 = dict(device=DEVICE, dtype=torch.float16)
    x, weight = torch.randn(2, 128, 14, 14, **f16), torch.randn(136, 128, 3, 3, **f16)
    monkeypatch.setattr(
        conv2d_fast_paths, "_choose_route_by_timing", None
    )  # called, it would raise
    monkeypatch.setattr(conv2d, "_plans", PlanCache())
    in_place = [conv2d.conv2d_kernel]

    def launched():
        with recording_launches() as launches:
            got = conv2d.conv2d(x, weight, None, 1, 1)
        assert _conv_error(got, x, weight, None, 1, 1, 1) < 2e-3
        return [launch.kernel for launch in launches]

    assert launched() == in_place  # below NCHW_TIMED_PRODUCT, untimed; and its tiles tuned
    monkeypatch.setattr(conv2d_fast_paths, "NCHW_TIMED_PRODUCT", 0)  # from here on, a timed size
    # while a CUDA graph is captured: in place, and chosen again on the next call
    monkeypatch.setattr(conv2d, "_plans", PlanCache())
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert launched() == in_place and conv2d._plans == {}
    capturing[0] = False
    monkeypatch.setattr(conv2d_fast_paths, "_choose_route_by_timing", lambda calls: 1)  # copied
    assert launched() == [conv2d_tma.channels_last_pair_kernel, conv2d_tma.tma_conv2d_kernel]
    assert len(conv2d._plans) == 1
    # under deterministic algorithms: in place, untimed, and kept
    monkeypatch.setattr(conv2d_fast_paths, "_choose_route_by_timing", None)
    monkeypatch.setattr(conv2d, "_plans", PlanCache())
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert launched() == in_place and len(conv2d._plans) == 1
    finally:
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.gpu
def test_the_route_timer_keeps_the_call_that_takes_less_gpu_time():
    image = torch.randn(1, 16, 4, 4, device=DEVICE, dtype=torch.float16)
    quick = lambda: conv2d_tma.channels_last(image)  # one small launch
    gpu_bound = lambda: torch.cuda._sleep(200_000)  # cycles: about 0.1 ms of GPU time

    def host_bound():  # 0.3 ms of the host's time, then the one small launch
        start = time.perf_counter()
        while time.perf_counter() - start < 3e-4:
            pass
        conv2d_tma.channels_last(image)

    with recording_launches() as launches:
        assert conv2d_fast_paths._choose_route_by_timing([gpu_bound, quick]) == 1
        assert conv2d_fast_paths._choose_route_by_timing([quick, gpu_bound]) == 0
        # slower in a loop of its own, which the host bounds, but not on the GPU's clock
        assert conv2d_fast_paths._choose_route_by_timing([gpu_bound, host_bound]) == 1
    assert launches == []  # a benchmark recording a first call's launches sees none of these


# µs per call of the in-place route and the copied one on the GPU's clock, on ResNet's three
# 3x3 layers at batch 32, as measured on an H200 in eight fresh processes. In a loop, where
# the host bounds them, the copied route of the 14x14 layer took from 49.9 to 98.1 µs a call
# in the same processes: no rule reading those figures chose alike in all eight
RESNET_ROUTE_TIMES = {
    "56x56": [[42.9, 38.9], [43.4, 39.7], [43.1, 39.0], [43.0, 39.2],
              [43.3, 39.8], [43.2, 39.7], [43.2, 39.7], [43.2, 39.9]],
    "28x28": [[34.1, 24.8], [34.4, 24.9], [34.1, 24.8], [34.2, 24.7],
              [34.4, 25.1], [34.4, 24.9], [34.4, 24.8], [34.5, 25.0]],
    "14x14": [[44.5, 26.3], [44.8, 26.7], [44.8, 26.4], [44.7, 26.4],
              [44.5, 26.7], [45.1, 26.7], [44.6, 26.7], [44.8, 26.8]],
}  # fmt: skip


@pytest.mark.parametrize("layer", RESNET_ROUTE_TIMES)
def test_a_route_is_chosen_alike_in_every_process(layer):
    # the 14x14 layer is copied, saving 40% of the GPU's time; the others, where the copy
    # saves 28% or less and costs the host a launch, read x in place: in every process
    keep = conv2d_fast_paths._route_to_keep
    assert {keep(on_gpu) for on_gpu in RESNET_ROUTE_TIMES[layer]} == {int(layer == "14x14")}
    # with room to spare: 5% either way moves no choice
    for in_place, copied in RESNET_ROUTE_TIMES[layer]:
        assert keep([in_place, copied * 0.95]) == keep([in_place, copied * 1.05])


def test_a_route_that_ran_out_of_memory_is_never_kept():
    inf = math.inf
    assert conv2d_fast_paths._route_to_keep([inf, 26.0]) == 1
    assert conv2d_fast_paths._route_to_keep([44.0, inf]) == 0
    assert conv2d_fast_paths._route_to_keep([inf, inf]) == 0  # the smaller copy
    assert conv2d_fast_paths._route_to_keep([44.0]) == 0


def test_conv2d_checks_each_signature_of_its_arguments_once(monkeypatch):
    # a call with the shapes, strides, dtypes, devices, alignments and options of an
    # earlier one reuses what that call worked out; anything else is worked out anew
    prepared = []
    prepare = conv2d._prepare
    monkeypatch.setattr(conv2d, "_plans", PlanCache())
    monkeypatch.setattr(conv2d, "_prepare", lambda *a: prepared.append(a) or prepare(*a))
    storage = torch.randn(2 * 16 * 9 * 9 + 4, device=DEVICE)
    weight, bias = torch.randn(8, 16, 3, 3, device=DEVICE), torch.randn(8, device=DEVICE)
    aligned = storage[:-4].view(2, 16, 9, 9)
    misaligned = storage[1:-3].view(2, 16, 9, 9)  # 4 bytes off a 16-byte boundary
    for x, stride, padding, expected_prepared in [
        (aligned, 1, 1, 1),
        (aligned * 2, 1, 1, 1),  # other values, same signature
        (misaligned, 1, 1, 2),
        (aligned, 2, 1, 3),
        (aligned, 1, "same", 4),
        (aligned, [1, 1], [1, 1], 5),  # lists: checked in full, never kept
        (aligned, [1, 1], [1, 1], 6),
        (aligned.contiguous(memory_format=torch.channels_last), 1, 1, 7),
    ]:
        got = conv2d.conv2d(x, weight, bias, stride, padding)
        expected = torch.nn.functional.conv2d(x, weight, bias, stride, padding)
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
        assert len(prepared) == expected_prepared, (x.stride(), stride, padding)
    # the bias's alignment and TF32's switch are part of the signature too
    offset_bias = torch.randn(9, device=DEVICE)[1:]
    conv2d.conv2d(aligned, weight, offset_bias, 1, 1)
    with torch.backends.cudnn.flags(allow_tf32=not torch.backends.cudnn.allow_tf32):
        conv2d.conv2d(aligned, weight, bias, 1, 1)
    assert len(prepared) == 9
    # a call that fails its checks is kept by no one: it fails again, the same way, and a
    # float option equal to a kept int one is refused as on a first call
    for _ in range(2):
        with pytest.raises(ValueError, match="bias must have shape"):
            conv2d.conv2d(aligned, weight, bias[:4], 1, 1)
        with pytest.raises(TypeError, match="stride must be an int or a pair"):
            conv2d.conv2d(aligned, weight, bias, 1.0, 1)


def test_conv2d_measures_a_view_by_how_far_its_strides_reach():
    # 17 channels 2^27 elements apart: few elements, offsets past 32 bits, so x is copied
    view = torch.empty_strided((1, 17, 2, 2), (0, 2**27, 2, 1), device="meta")
    assert conv2d_fast_paths._reach(view) == 16 * 2**27 + 3 >= 2**31
    assert conv2d_fast_paths._reach(torch.empty(2, 3, 4, 5, device="meta")) == 59


# What a first call imports. torch runs some meta-device operations (torch.empty_like on a
# meta tensor among them) through its Python references, whose first use imports sympy:
# measured on an H200, 2.5 s of a conv2d's first call. The finished kernels' host paths
# keep clear of them; a new shape's first call stays the kernels' own cost. The routes
# only a GPU takes are planned on the meta device too, so that the interpreter checks them.
_FIRST_CALLS = """
import sys, torch
import course_lib
from course_lib.kernels import attention, conv2d, conv2d_fast_paths, layer_norm, linear, matmul
from course_lib.kernels import softmax
meta = lambda *shape, **kw: torch.empty(*shape, dtype=torch.float16, device="meta", **kw)
x, w = meta(32, 256, 14, 14), meta(256, 256, 3, 3)
for layout in (torch.channels_last, torch.contiguous_format):
    out = meta(32, 256, 14, 14, memory_format=layout)
    x_seen = conv2d_fast_paths._copied(x, torch.channels_last)
    conv2d_fast_paths._tma_route(x_seen, w, None, out, (1, 1), (1, 1))
d, large = course_lib.DEVICE, not course_lib.runtime.INTERPRETED
dtype = torch.float16 if large else torch.float32
r = lambda *shape: torch.randn(*shape, device=d, dtype=dtype)
n = 1024 if large else 37
matmul.matmul(r(n, n), r(n, n))
for layout in (torch.channels_last, torch.contiguous_format):  # TMA, then the timed route
    x = r(32, 256, 14, 14) if large else r(2, 3, 7, 7)
    w = r(256, 256, 3, 3) if large else r(4, 3, 3, 3)
    x, w = (t.contiguous(memory_format=layout) for t in (x, w))
    conv2d.conv2d(x, w, None, 1, 1)
x, w = r(4 * n, n).requires_grad_(), r(n, n).requires_grad_()
linear.linear(x, w, r(n).requires_grad_(), "gelu").sum().backward()
q = r(1, 2, 4 * n, 64).requires_grad_()
attention.attention(q, q, q, causal=True).sum().backward()
softmax.softmax(r(n, 3 * n))
layer_norm.layer_norm(r(n, n), (n,), r(n), r(n))
torch.cuda.synchronize() if large else None
print(sorted(m for m in sys.modules if m.split(".")[0] == "sympy")[:3])
"""


def test_a_first_call_keeps_clear_of_torchs_python_references():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this checkout's course_lib
    env = {**os.environ, "PYTHONPATH": root}
    run = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True,
                         timeout=600, cwd=root, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]", "a first call imported sympy"
