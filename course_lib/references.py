"""Plain PyTorch versions of every operation in the course. No Triton here.

Checkers and benchmarks compare learners' kernels and the finished kernels with
these functions only, so a kernel can never pass by being compared with itself.
Each reference says what it moves through memory: the least any kernel must move.
"""

from __future__ import annotations

import torch


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two tensors of one shape. Reads 2n elements, writes n."""
    return x + y


def vector_add_bytes(n: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 3 * n * itemsize


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0) elementwise. Reads n elements, writes n."""
    return torch.relu(x)


def relu_bytes(n: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * n * itemsize
