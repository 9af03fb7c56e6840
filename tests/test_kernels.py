"""Finished kernels against their references: every size, dtype and error path."""

import pytest
import torch

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
