"""What the finished kernels' launchers share before they launch: argument checks, and
the integer arithmetic of a grid at a host cost below Triton's own helpers."""

from __future__ import annotations

import torch

from course_lib import runtime


def check_same(name: str, *tensors: torch.Tensor, same_shape: bool = True) -> None:
    """Raise a clear error unless all tensors share dtype, device and (by default) shape."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} expects torch.Tensor arguments, got {type(t).__name__}")
    first = tensors[0]
    for t in tensors[1:]:
        if same_shape and t.shape != first.shape:
            raise ValueError(
                f"{name}: shapes differ, {list(first.shape)} vs {list(t.shape)}. "
                "Broadcasting is not supported: expand and call .contiguous() first."
            )
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name}: dtypes differ, {first.dtype} vs {t.dtype}. Cast one with .to(dtype)."
            )
        if t.device != first.device:
            raise ValueError(
                f"{name}: devices differ, {first.device} vs {t.device}. Move both with .to(device)."
            )
    if runtime.MODE == "gpu" and not first.is_cuda:
        raise ValueError(
            f"{name}: the tensors are on {first.device}; Triton kernels run on the GPU here. "
            "Allocate them with device=course_lib.DEVICE."
        )
    runtime.require_supported_dtype(first.dtype, name)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b), for grids. triton.cdiv gives the same but, being callable inside a
    kernel too, costs the host a good part of a launch's time."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1); triton.next_power_of_2, without its cost.
    A size traced symbolically by torch.compile is made concrete here (it specialises)."""
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1
