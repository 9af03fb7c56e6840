"""Argument checks shared by the finished kernels' launchers."""

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
    if runtime.MODE == "gpu" and first.device.type != "cuda":
        raise ValueError(
            f"{name}: the tensors are on {first.device}; Triton kernels run on the GPU here. "
            "Allocate them with device=course_lib.DEVICE."
        )
    runtime.require_supported_dtype(first.dtype, name)
