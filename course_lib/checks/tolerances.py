"""How close a kernel's result must be to the reference's: one table, keyed by dtype.

A value passes when |got - expected| <= atol + rtol * |expected| (torch.isclose).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Tolerance(NamedTuple):
    rtol: float
    atol: float
    why: str


TOLERANCES: dict[torch.dtype | str, Tolerance] = {
    torch.float64: Tolerance(1e-12, 1e-12, "53-bit mantissa; the order of operations may differ"),
    torch.float32: Tolerance(
        1e-5, 1e-6, "24-bit mantissa (a rounding is 6e-8); room for reordered sums"
    ),
    torch.float16: Tolerance(2e-3, 1e-5, "11-bit mantissa: one rounding is up to 4.9e-4 relative"),
    torch.bfloat16: Tolerance(
        1.6e-2, 1e-5, "8-bit mantissa: one rounding is up to 3.9e-3 relative"
    ),
    # a float32 tl.dot on a GPU runs on tensor cores as TF32 unless told otherwise
    "tf32": Tolerance(
        1e-2, 3e-3, "TF32 keeps 10 mantissa bits of each input: about 1e-3 per product"
    ),
}


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    try:
        return TOLERANCES[dtype]
    except KeyError:
        return Tolerance(0.0, 0.0, "integers and booleans must match exactly")
