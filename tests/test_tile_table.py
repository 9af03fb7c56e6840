"""The tile table: the nearest measured shape's choice, matched on layout, dtype size and
options; settled into the autotuner before it would time anything; recorded while
measuring; and every shipped table naming configs its kernels still have."""

import json

import pytest
import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.kernels import tile_table
from course_lib.kernels.tile_table import choice, config_entry, split_key


@triton.jit
def _kernel(x_ptr, M, N, K, stride_k, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))


CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=3) for b, w in ((16, 4), (32, 8))]
SMALL, LARGE = (config_entry(c) for c in CONFIGS)


@pytest.fixture
def tuner(monkeypatch):
    monkeypatch.setitem(tile_table.SIZES, "_kernel", ("M", "N", "K"))
    return triton.autotune(configs=CONFIGS, key=["M", "N", "K", "stride_k", "DEPTH"])(_kernel)


def _key(M, N, K, stride_k=1, depth=3, dtype="torch.float16"):
    return (M, N, K, stride_k, depth, dtype)


def _entry(sizes, config, stride_k=True, depth=3, dtype_bytes=2, kernel="_kernel"):
    M, N, K = sizes
    exact = {"stride_k": stride_k, "DEPTH": depth, "dtypes": [dtype_bytes]}
    return {"kernel": kernel, "sizes": {"M": M, "N": N, "K": K}, "exact": exact,
            "config": config}  # fmt: skip


def test_a_key_splits_into_sizes_and_a_layout_dtype_size_and_options(tuner):
    sizes, exact = split_key(tuner, _key(1000, 64, 4096, stride_k=4096, dtype="torch.bfloat16"))
    assert sizes == {"M": 1000, "N": 64, "K": 4096}
    # a stride says only whether it is 1; fp16 and bf16 are alike at 2 bytes
    assert exact == {"stride_k": False, "DEPTH": 3, "dtypes": [2]}
    assert split_key(tuner, _key(1000, 64, 4096, dtype="torch.float16"))[1]["dtypes"] == [2]


def test_the_nearest_shape_in_octaves_chooses(tuner):
    table = [_entry((1024, 1024, 1024), SMALL), _entry((8192, 8192, 8192), LARGE)]
    assert choice(tuner, _key(1000, 1100, 900), table) is CONFIGS[0]
    assert choice(tuner, _key(6000, 8192, 9000), table) is CONFIGS[1]
    # one octave off in M against two in N and K: the first is nearer
    assert choice(tuner, _key(2048, 2048, 4096), table) is CONFIGS[0]
    # equals: the first entry of the table
    assert choice(tuner, _key(2896, 2896, 2896), table) is CONFIGS[0]


def test_only_entries_with_the_same_layout_dtype_size_options_and_kernel_count(tuner):
    near, far = _key(1024, 1024, 1024), _entry((8192, 8192, 8192), LARGE)
    for other in (
        _entry((1024, 1024, 1024), SMALL, stride_k=False),
        _entry((1024, 1024, 1024), SMALL, depth=4),
        _entry((1024, 1024, 1024), SMALL, dtype_bytes=4),
        _entry((1024, 1024, 1024), SMALL, kernel="another_kernel"),
        _entry((1024, 1024, 1024), {**SMALL, "num_warps": 2}),  # a config the kernel lacks
    ):
        assert choice(tuner, near, [other, far]) is CONFIGS[1], other
        assert choice(tuner, near, [other]) is None, other


def test_a_choice_is_settled_before_the_autotuner_would_time_anything(tuner, monkeypatch):
    monkeypatch.setattr(runtime, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tile_table, "_table", lambda device: [_entry((1024, 1024, 1024), LARGE)])
    x = torch.empty(8, dtype=torch.float16)
    named = {"x_ptr": x, "M": 1000, "N": 1000, "K": 1000, "stride_k": 1, "DEPTH": 3}
    assert tile_table.settle_from_table(tuner, named) is False  # nothing to time
    assert tuner.cache == {(1000, 1000, 1000, 1, 3, "torch.float16"): CONFIGS[1]}
    # a choice the autotuner has already made stays
    tuner.cache[(1000, 1000, 1000, 1, 3, "torch.float16")] = CONFIGS[0]
    assert tile_table.settle_from_table(tuner, named) is False
    assert tuner.cache[(1000, 1000, 1000, 1, 3, "torch.float16")] is CONFIGS[0]
    # a shape past the table's reach, or any new key while measuring, is timed
    assert tile_table.settle_from_table(tuner, named | {"M": 16}) is True
    with tile_table.measuring():
        assert tile_table.settle_from_table(tuner, named | {"M": 999}) is True
    assert len(tuner.cache) == 1


def test_a_measured_shape_stands_only_for_shapes_a_few_octaves_away(tuner):
    table = [_entry((1024, 1024, 1024), SMALL)]
    reach = 2**tile_table.MAX_OCTAVES
    assert choice(tuner, _key(1024 // reach, 1024, 1024), table) is CONFIGS[0]
    assert choice(tuner, _key(1024 // reach - 1, 1024, 1024), table) is None
    assert choice(tuner, _key(1024, 1024 * reach + 16, 1024), table) is None


def test_the_key_is_the_one_the_autotuner_keeps_its_choice_under():
    # run by Triton (in the interpreter, timed by a stub): the key it files its choice under
    # is the one tuning_key builds from the arguments by name, positional ones first
    from course_lib import triton_internals

    stub_timer = lambda kernel_call, quantiles=None: (kernel_call(), [1.0] * len(quantiles))[1]
    tuner = triton.autotune(configs=CONFIGS, key=["M", "K", "stride_k", "DEPTH"],
                            do_bench=stub_timer)(_kernel)  # fmt: skip
    x = torch.empty(32, dtype=torch.bfloat16, device=runtime.DEVICE)
    args, meta = (x, 7, 9, 11, 13), {"DEPTH": 5}
    tuner[(1,)](*args, **meta)
    named = {**dict(zip(tuner.arg_names, args)), **meta}
    assert list(tuner.cache) == [triton_internals.tuning_key(tuner, named)]


def test_measuring_records_each_choice_once_with_the_fastest_timings(tuner):
    named = {"x_ptr": torch.empty(8), "M": 64, "N": 32, "K": 16, "stride_k": 16, "DEPTH": 3}
    tuner.best_config = CONFIGS[1]
    tuner.configs_timings = {CONFIGS[0]: [0.5, 0.4, 0.6], CONFIGS[1]: [0.25, 0.2, 0.3]}
    tile_table.record_choice(tuner, named)  # not measuring: nothing kept
    with tile_table.measuring() as measured:
        tile_table.record_choice(tuner, named)
        tile_table.record_choice(tuner, named)
    assert measured == [{
        "kernel": "_kernel", "sizes": {"M": 64, "N": 32, "K": 16},
        "exact": {"stride_k": False, "DEPTH": 3, "dtypes": [4]}, "config": LARGE,
        "fastest": [(0.25, LARGE), (0.5, SMALL)],
    }]  # fmt: skip


def test_a_table_that_cannot_be_read_is_named_and_what_to_do_said(tmp_path, monkeypatch):
    bad = tmp_path / "table.json"
    bad.write_text(json.dumps({"entries": [{"kernel": "matmul_kernel"}]}))
    with pytest.raises(ValueError, match=r"table\.json is not a tile table.*tile_search"):
        tile_table.read_table(bad)
    bad.write_text("{")
    with pytest.raises(ValueError, match="COURSE_TILE_TABLE=off"):
        tile_table.read_table(bad)
    monkeypatch.setenv("COURSE_TILE_TABLE", str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError, match="missing.json, which does not exist"):
        tile_table.read_table(tile_table._table_path(0))
    monkeypatch.setenv("COURSE_TILE_TABLE", "off")
    assert tile_table.read_table(tile_table._table_path(0)) == []
    monkeypatch.delenv("COURSE_TILE_TABLE")
    assert tile_table.read_table(tmp_path / "no-table-for-this-gpu.json") == []


def _autotuners() -> dict:
    """Every finished kernel's autotuner, by the name of the kernel it tunes."""
    from course_lib.kernels import attention, conv2d, conv2d_tma, linear, matmul
    from course_lib.kernels import matmul_fast_paths as fast

    tuners = [matmul.matmul_kernel_autotuned, fast.tf32_b_first_autotuned,
              fast.tma_matmul_autotuned, linear.linear_kernel_autotuned,
              conv2d.conv2d_kernel_autotuned, conv2d_tma.tma_conv2d_autotuned,
              attention.attention_fwd_autotuned]  # fmt: skip
    return {t.base_fn.__name__: t for t in tuners}


def test_every_autotuned_kernel_says_which_of_its_key_are_sizes():
    tuners = _autotuners()
    assert set(tuners) == set(tile_table.SIZES)
    for name, tuner in tuners.items():
        assert set(tile_table.SIZES[name]) <= set(tuner.keys), name


@pytest.mark.parametrize("path", sorted(tile_table.TABLES.glob("*.json")), ids=lambda p: p.name)
def test_a_shipped_table_names_only_configs_its_kernels_have(path):
    tuners = _autotuners()
    entries = tile_table.read_table(path)
    assert entries, f"{path.name} has no entries"
    for entry in entries:
        tuner = tuners[entry["kernel"]]
        configs = [config_entry(c) for c in tuner.configs]
        assert entry["config"] in configs, f"{path.name}: {entry} is stale; measure it again"
        # a key changed since (a parameter added or renamed) would match no call
        sizes = tile_table.SIZES[entry["kernel"]]
        assert set(entry["sizes"]) == set(sizes)
        others = {k for k in tuner.keys if k not in sizes} | {"dtypes"}
        assert set(entry["exact"]) == others, f"{path.name}: {entry} is stale; measure it again"


@pytest.mark.gpu
def test_a_shape_the_table_covers_times_no_config(monkeypatch):
    from course_lib import gpu_timer
    from course_lib.kernels import matmul

    device = torch.cuda.current_device()
    if not tile_table.read_table(tile_table._table_path(device)):
        pytest.skip(f"no tile table for this GPU ({tile_table.gpu_kind(device)})")
    timed = []
    monkeypatch.setattr(gpu_timer, "median_ms", lambda fn, **_: timed.append(fn) or 1.0)
    M, N, K = 1000, 1016, 1008  # sizes no other test uses, near the table's 1024^3
    a = torch.randn(M, K, device=runtime.DEVICE, dtype=torch.float16)
    b = torch.randn(K, N, device=runtime.DEVICE, dtype=torch.float16)
    c = matmul.matmul(a, b)
    assert timed == [], "the autotuner timed configs for a shape its table covers"
    tuned = matmul.matmul_kernel_autotuned.cache
    chosen = [config for key, config in tuned.items() if key[:3] == (M, N, K)]
    assert len(chosen) == 1
    expected = a.float() @ b.float()
    assert (c.float() - expected).norm() / expected.norm() < 1e-2
