"""The finished kernels' tiles, taken from a table measured once per kind of GPU instead
of being autotuned for each new shape in each process.

Autotuning a shape compiles and times every config of the kernel: seconds, up to a minute,
for a first call, paid again in every new process, and where two configs run close the
winner changes from one process to the next. A table measured on a GPU
(`python -m course_lib.bench.tile_search`) holds each autotuned kernel's choice for a set of
shapes. A launch takes the choice measured at the nearest shape with the same layout, dtype
sizes and options (sizes compared in octaves): one compile, and the same tile in every
process. Kernels, options or GPUs the table does not cover are autotuned as before.

COURSE_TILE_TABLE=off turns the table off (every new key is autotuned); a path to a JSON
file uses that table instead of the one shipped for the GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import triton

from course_lib import runtime, triton_internals
from course_lib.triton_internals import Autotuner

TABLES = Path(__file__).with_name("tile_tables")

# the parameters of each autotuned kernel's key compared by nearness, in octaves; the rest
# of the key (layouts, options, head dimension, filter size) must match exactly
SIZES = {
    "matmul_kernel": ("M", "N", "K"),
    "tf32_b_first_kernel": ("M", "N", "K"),
    "tma_matmul_kernel": ("M", "N", "K"),
    "linear_kernel": ("M", "N", "K"),
    "conv2d_kernel": ("B", "C", "H", "W", "O", "OH", "OW"),
    "tma_conv2d_kernel": ("B", "H", "W", "C", "O", "OH", "OW"),
    "attention_fwd_kernel": ("N_Q", "N_K"),
}

# A measured shape stands for others up to this many octaves away in each size; past it
# (one row against a table of square products, say) the autotuner times the configs
MAX_OCTAVES = 3

# while measuring (see `measuring`): each choice the autotuners made, as a table entry
_measured: list[dict] | None = None
_tables: dict[Path | None, list[dict]] = {}  # by file, read once


def settle_from_table(tuner: Autotuner, named: dict) -> bool:
    """Before `tuner` launches with these arguments (by name, constexprs included): where
    it has no choice yet for their key and the table has one, make that its choice.
    Whether the tuner will time its configs for this launch (no choice either way).
    A choice once made stays for the process, whatever COURSE_TILE_TABLE says later."""
    key = triton_internals.tuning_key(tuner, named)
    if key in tuner.cache:
        return False
    if _measured is None and not runtime.INTERPRETED:
        config = choice(tuner, key, _table(torch.cuda.current_device()))
        if config is not None:
            triton_internals.settle(tuner, key, config)
            return False
    return True


def record_choice(tuner: Autotuner, named: dict) -> None:
    """After `tuner` timed its configs for a launch with these arguments (see
    settle_from_table): while measuring, note what it chose."""
    if _measured is None:
        return
    sizes, exact = split_key(tuner, triton_internals.tuning_key(tuner, named))
    timings = triton_internals.last_timings(tuner).items()
    # the three fastest, for the record (Triton keeps a list where a timer gives quantiles)
    timed = [(ms[0] if isinstance(ms, list) else ms, config_entry(c)) for c, ms in timings]
    fastest = sorted(timed, key=lambda pair: pair[0])
    entry = {"kernel": tuner.base_fn.__name__, "sizes": sizes, "exact": exact,
             "config": config_entry(tuner.best_config), "fastest": fastest[:3]}  # fmt: skip
    if entry not in _measured:
        _measured.append(entry)


@contextlib.contextmanager
def measuring() -> Iterator[list[dict]]:
    """For the block, the table is not read and every autotuner tunes each new key; the
    list yielded gets one entry per choice made (what course_lib.bench.tile_search saves)."""
    global _measured
    saved, _measured = _measured, []
    try:
        yield _measured
    finally:
        _measured = saved


def choice(tuner: Autotuner, key: tuple, table: list[dict]) -> triton.Config | None:
    """The config of `tuner` that `table` chooses for `key`: that of the entry for the same
    kernel and exact part of the key nearest in sizes (the sum of the octaves between them;
    the first of equals), among entries naming one of the tuner's configs and no more than
    MAX_OCTAVES from the key in any size. None if none."""
    sizes, exact = split_key(tuner, key)
    configs = {json.dumps(config_entry(c), sort_keys=True): c for c in tuner.configs}
    best, best_distance = None, math.inf
    for entry in table:
        if entry["kernel"] != tuner.base_fn.__name__ or entry["exact"] != exact:
            continue
        config = configs.get(json.dumps(entry["config"], sort_keys=True))
        if config is None:  # measured for a config the kernel no longer has
            continue
        apart = [abs(_octaves(sizes[k]) - _octaves(entry["sizes"].get(k, 1))) for k in sizes]
        distance = sum(apart)
        if distance < best_distance and max(apart, default=0) <= MAX_OCTAVES:
            best, best_distance = config, distance
    return best


def split_key(tuner: Autotuner, key: tuple) -> tuple[dict, dict]:
    """The key's sizes, by name, and the rest, made comparable across shapes: a stride
    becomes whether it is 1 (the layout), a dtype its size in bytes (fp16 and bf16 take
    the same tiles)."""
    size_names = SIZES.get(tuner.base_fn.__name__, ())
    names = [k for k in tuner.keys if k in tuner.arg_names]
    sizes, exact = {}, {}
    for name, value in zip(names, key):
        if name in size_names:
            sizes[name] = int(value)
        elif name.startswith("stride"):
            exact[name] = value == 1
        else:
            exact[name] = _dtype_bytes(value) if isinstance(value, str) else value
    exact["dtypes"] = [_dtype_bytes(d) for d in key[len(names) :]]
    return sizes, exact


def config_entry(config) -> dict:
    """A triton.Config as a table stores it."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def _table(device: int) -> list[dict]:
    path = _table_path(device)
    if path not in _tables:
        _tables[path] = read_table(path)
    return _tables[path]


def _table_path(device: int) -> Path | None:
    chosen = os.environ.get("COURSE_TILE_TABLE", "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    return TABLES / f"{gpu_kind(device)}.json"


def gpu_kind(device: int) -> str:
    """What a table is measured for: the compute capability and the number of SMs (an H100
    SXM and an H200 share both), as in sm90-132sms."""
    props = torch.cuda.get_device_properties(device)
    return f"sm{props.major}{props.minor}-{props.multi_processor_count}sms"


def read_table(path: Path | None) -> list[dict]:
    """The entries of the table at `path`; none where there is no such file. A file that
    cannot be read as a table stops with an error naming it."""
    if path is None or not path.is_file():
        if path is not None and os.environ.get("COURSE_TILE_TABLE"):
            raise FileNotFoundError(f"COURSE_TILE_TABLE names {path}, which does not exist")
        return []
    try:
        entries = json.loads(path.read_text())["entries"]
        missing = [e for e in entries if not {"kernel", "sizes", "exact", "config"} <= e.keys()]
        if missing:
            raise KeyError(f"an entry lacks kernel, sizes, exact or config: {missing[0]}")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f"{path} is not a tile table ({err!r}); measure one with "
            "python -m course_lib.bench.tile_search, or set COURSE_TILE_TABLE=off"
        ) from err
    return entries


def _octaves(n: int) -> float:
    return math.log2(max(n, 1))


def _dtype_bytes(value: str):
    """'torch.bfloat16' -> 2; any other string as it is."""
    dtype = (
        getattr(torch, value.removeprefix("torch."), None) if value.startswith("torch.") else None
    )
    return dtype.itemsize if isinstance(dtype, torch.dtype) else value
