"""What the finished kernels' launchers share before they launch: argument checks (and
conv2d's reading of its options), and the integer arithmetic of a grid at a host cost
below Triton's own helpers."""

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


def conv2d_pair(value, name: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair; a clear error for anything else."""
    if type(value) is int:  # the usual case, at the least host cost
        return value, value
    try:
        pair = (value, value) if isinstance(value, int) else tuple(value)
    except TypeError:  # a float, say
        pair = ()
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise TypeError(f"conv2d: {name} must be an int or a pair of ints, got {value!r}")
    return pair


def conv2d_padding(padding, kernel: tuple[int, int], dilation: tuple[int, int], stride) -> tuple:
    """(top, left, bottom, right): torch's "same" puts the odd pixel at the bottom and right."""
    if padding == "valid":
        return 0, 0, 0, 0
    if padding == "same":
        if stride != (1, 1):
            raise ValueError("conv2d: padding='same' needs stride 1, as in torch")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2
    if isinstance(padding, str):
        raise ValueError(f"conv2d: padding must be 'same', 'valid', an int or a pair: {padding!r}")
    ph, pw = conv2d_pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"conv2d: padding must be >= 0, got {padding!r}")
    return ph, pw, ph, pw
