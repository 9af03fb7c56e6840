"""Benchmark arithmetic and plotting; the timing itself runs on a GPU only."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib import bench, references, runtime  # noqa: E402
from course_lib.bench.__main__ import main as bench_main  # noqa: E402


def test_throughput_arithmetic():
    assert bench.gb_per_s(3e9, 1000.0) == pytest.approx(3.0)  # 3 GB in one second
    assert bench.gb_per_s(12 * 2**20, 0.004) == pytest.approx(3145.728)
    assert bench.tflop_per_s(2 * 4096**3, 0.2) == pytest.approx(687.19476736)
    with pytest.raises(ValueError, match="positive"):
        bench.gb_per_s(1, 0.0)


def test_bytes_moved_by_the_references():
    assert references.vector_add_bytes(1 << 20, torch.float32) == 3 * 4 * (1 << 20)
    assert references.relu_bytes(10, torch.float16) == 2 * 2 * 10


def _fake_sweep():
    sweep = bench.Sweep("add", torch.float32, ceiling=3000.0)
    sweep.points = [1 << 20, 1 << 28]
    sweep.kernel = [1500.0, 2850.0]
    sweep.baselines = {"torch": [1600.0, 2800.0]}
    return sweep


def test_sweep_ratios_and_table():
    rows = _fake_sweep().rows()
    assert rows[1]["kernel/torch"] == pytest.approx(2850 / 2800)
    assert rows[1]["kernel/ceiling"] == pytest.approx(0.95)
    table = _fake_sweep().table()
    assert "| 2^28 | 2,850 | 2,800 | 1.018 | 0.950 |" in table
    assert "copy bandwidth 3,000 GB/s" in table


def test_launch_and_do_bench_columns_when_measured():
    sweep = _fake_sweep()
    sweep.do_bench = {"kernel": [0.010, 0.2], "torch": [0.009, 0.21]}  # ms
    sweep.launch_us = {"kernel": [21.4, 30.0], "bare": [20.0, 20.0], "torch": [7.6, 8.2]}
    table = sweep.table()
    assert "| kernel/torch | do_bench kernel/torch | kernel/ceiling |" in table
    assert "| launch µs, kernel / bare / torch |" in table
    assert "| 2^20 | 1,500 | 1,600 | 0.938 | 0.900 | 0.500 | 21.4 / 20.0 / 7.6 |" in table
    assert sweep.rows()[1]["kernel launch us"] == 30.0
    # the launch target holds at 2^20 (1.07x the bare launch), not at 2^28 (1.5x)
    assert "- target launch µs ≤ 1.3× the bare launch: missed at 2^28 (1.50×)" in table
    # a call that is more than a launcher (a training step) is set beside torch instead
    sweep.launcher = False
    assert sweep.verdicts() == [
        "host µs per call against torch's (no target): 2^20 2.82×, 2^28 3.66×"
    ]
    # with or without its bare launches measured
    sweep.launch_us["bare"] = [math.nan, math.nan]
    assert sweep.verdicts() == [
        "host µs per call against torch's (no target): 2^20 2.82×, 2^28 3.66×"
    ]


def test_the_report_names_the_tiles_the_autotuner_chose():
    from course_lib.bench.recording import Launch

    kernel = type("Kernel", (), {"__name__": "tma_conv2d_kernel"})()
    chosen = {"BH": 8, "BW": 8, "GROUP_M": 8, "num_warps": 4, "num_ctas": 1, "maxnreg": None}
    launches = [
        Launch(kernel, (1, 1, 1), (), {}, chosen),
        Launch(kernel, (1, 1, 1), (), {"BLOCK_C": 64}),  # a plain kernel: nothing chosen
    ]
    tuned = bench.sweep.tuned_configs(launches)
    assert tuned == "tma_conv2d_kernel BH=8 BW=8 GROUP_M=8 num_warps=4"
    sweep = _fake_sweep()
    sweep.tuned = ["", tuned]
    lines = sweep.table().splitlines()
    assert lines[-1] == f"- tiles at 2^28: {tuned}"
    assert not any("tiles at 2^20" in line for line in lines)


def test_targets_name_the_points_and_timings_that_miss():
    sweep = _fake_sweep()
    sweep.do_bench = {"kernel": [0.010, 0.2], "torch": [0.009, 0.21]}
    sweep.targets = [
        bench.Target("torch", 0.98, lambda n: n >= 1 << 20, "from 2^20 up"),
        bench.Target("torch", 1.0, lambda n: n == 1 << 28, "at 2^28"),
        bench.Target("torch", 0.5, lambda n: n > 1 << 30, "past 2^30"),  # no such point
    ]
    assert sweep.verdicts() == [
        "target kernel/torch ≥ 0.98 from 2^20 up: missed at 2^20 (0.938, median_ms), "
        "2^20 (0.900, do_bench)",
        "target kernel/torch ≥ 1.0 at 2^28: met",
    ]
    assert "- target kernel/torch ≥ 1.0 at 2^28: met" in sweep.table()


def test_shapes_label_and_extra_baselines():
    sweep = bench.Sweep("softmax", torch.float32, ceiling=4000.0)
    sweep.points = [(4096, 781)]
    sweep.kernel = [2000.0]
    sweep.baselines = {"torch": [1600.0], "torch.compile": [1800.0]}
    table = sweep.table()
    assert "| size | kernel GB/s | torch GB/s | torch.compile GB/s |" in table
    assert "| 4096x781 | 2,000 | 1,600 | 1,800 | 1.250 | 1.111 | 0.500 |" in table


def test_plot_shows_kernel_torch_and_ceiling(tmp_path):
    path = tmp_path / "add.png"
    ax = bench.plot_sweep(_fake_sweep(), path=str(path))
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["Triton add", "PyTorch", "copy bandwidth (ceiling)"]
    assert path.stat().st_size > 1000


@pytest.mark.skipif(not runtime.INTERPRETED, reason="interpreter behaviour")
def test_timing_refuses_in_the_interpreter_and_the_command_says_so(capsys, tmp_path):
    with pytest.raises(RuntimeError, match="needs a GPU"):
        bench.median_ms(lambda: None)
    with pytest.raises(RuntimeError, match="needs a GPU"):
        bench.launch_us(lambda: None)
    assert bench_main(["--out", str(tmp_path / "b")]) == 0
    assert "Benchmarking needs a GPU" in capsys.readouterr().out
    assert not (tmp_path / "b").exists()


@pytest.mark.gpu
def test_small_sweep_on_gpu(tmp_path):
    from course_lib.kernels import vector_add

    ceiling = bench.copy_bandwidth(1 << 24)
    sweep = bench.bandwidth_sweep(
        "add",
        vector_add.add,
        references.vector_add,
        n_inputs=2,
        bytes_moved=references.vector_add_bytes,
        sizes=[1 << 16, 1 << 20],
        rounds=2,
        ceiling_gbps=ceiling,
    )
    assert len(sweep.rows()) == 2
    assert all(0 < r["kernel/ceiling"] < 1.5 for r in sweep.rows())
    assert all(0 < r["do_bench kernel/torch"] < 3 for r in sweep.rows())
    # the kernel's launcher, its bare launch (one add_kernel) and torch were all timed
    assert all(0 < r[f"{name} launch us"] < 1000 for r in sweep.rows() for name in sweep.launch_us)


def test_a_sweep_refuses_host_baselines_it_does_not_time():
    from course_lib.bench.sweep import run_sweep

    with pytest.raises(ValueError, match=r"no baseline of this sweep: \['torch, compiled'\]"):
        run_sweep(
            bench.Sweep("add", torch.float32, 1.0), torch.add, {"torch": torch.add},
            [16], lambda n: [], lambda n, ms: n, host_baselines=["torch, compiled"],
        )  # fmt: skip


@pytest.mark.gpu
def test_a_sweep_times_the_host_cost_of_the_baselines_it_is_asked_for():
    """The first baseline's host cost per call is always measured; another's where named
    (torch's own op compiled, say, which bounds a compiled kernel's host cost)."""
    import time

    from course_lib.bench.sweep import run_sweep
    from course_lib.kernels import vector_add

    def slow_torch(x):
        time.sleep(1e-3)
        return x + x

    sweep = run_sweep(
        bench.Sweep("add", torch.float32, 1.0),
        lambda x: vector_add.add(x, x),
        {"torch": lambda x: x + x, "slow torch": slow_torch, "clone": torch.clone},
        [1 << 16], lambda n: [torch.randn(n, device=runtime.DEVICE)],
        lambda n, ms: n / ms, rounds=1, host_baselines=["slow torch"],
    )  # fmt: skip
    assert list(sweep.launch_us) == ["kernel", "bare", "torch", "slow torch"]
    (row,) = sweep.rows()
    assert row["slow torch launch us"] > 1000 > row["torch launch us"]
    assert "launch µs, kernel / bare / torch / slow torch" in sweep.table()


@pytest.mark.gpu
def test_small_flops_sweep_on_gpu():
    from course_lib.kernels import matmul

    sweep = bench.flops_sweep(
        "matmul",
        matmul.matmul,
        torch.matmul,
        shapes=[(512, 512, 512)],
        dtype=torch.float16,
        rounds=1,
    )
    assert sweep.unit == "TFLOP/s" and 0 < sweep.rows()[0]["kernel/torch"] < 3


@pytest.mark.gpu
def test_median_ms_leaves_the_host_out():
    import time

    from course_lib.kernels import vector_add

    x = torch.randn(1 << 12, device=runtime.DEVICE)

    def slow_host():
        time.sleep(2e-3)  # 2 ms of Python before a kernel of a few microseconds
        return vector_add.add(x, x)

    assert bench.launch_us(slow_host) > 1500
    assert bench.median_ms(slow_host) < 0.5
    # the autotuners' timer, in the form triton.autotune asks of a do_bench
    times = bench.autotune_timer(slow_host, quantiles=(0.5, 0.2, 0.8))
    assert len(times) == 3 and max(times) < 0.5


def test_every_autotuner_compares_its_configs_by_the_gpus_time():
    # Triton's default timer counts a slow host's launch cost in, and picked slower tiles
    import importlib
    import pkgutil

    from triton.runtime.autotuner import Autotuner

    from course_lib import kernels

    autotuners = {
        f"{info.name}.{name}": value
        for info in pkgutil.iter_modules(kernels.__path__, "course_lib.kernels.")
        for name, value in vars(importlib.import_module(info.name)).items()
        if isinstance(value, Autotuner)
    }
    assert len(autotuners) >= 6  # lesson 05's, its two fast paths', 06's two and 07's
    for name, autotuner in autotuners.items():
        assert autotuner.do_bench is bench.autotune_timer, name


def test_the_attention_suite_is_registered_around_its_targets_anchor():
    from course_lib.bench import suites

    assert suites.SUITES["attention"] is suites.attention_suite
    assert suites.ATTENTION_ANCHOR in suites.ATTENTION_POINTS
    # every point has the same tokens and width: as much work per key at every length
    for b, h, n, d in suites.ATTENTION_POINTS:
        assert b * n == suites.ATTENTION_TOKENS and h * d == suites.ATTENTION_WIDTH
    assert {n for _, _, n, _ in suites.ATTENTION_POINTS} >= {1024, 16384}
    for targets in suites.ATTENTION_TARGETS.values():
        assert {t.baseline for t in targets} == {"SDPA flash", "SDPA cuDNN"}
        assert all(t.where(suites.ATTENTION_ANCHOR) for t in targets)


def test_the_tutorial_comparison_needs_the_tutorials_file(tmp_path, capsys):
    from course_lib.bench import suites

    assert suites.SUITE_PARTS["attention_tutorial"] is suites.attention_tutorial_suite
    # as much work per point as the anchor, in one batch
    for b, h, n, d in suites.TUTORIAL_POINTS:
        assert b == 1 and h * n * d == suites.ATTENTION_TOKENS * suites.ATTENTION_WIDTH
    out = str(tmp_path / "b")
    with pytest.raises(SystemExit):
        bench_main(["--only", "attention_tutorial", "--out", out])
    assert "needs --triton-tutorial PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--only", "attention_tutorial", "--triton-tutorial", str(tmp_path / "no.py")])
    assert "no Python file at" in capsys.readouterr().err
    notes = tmp_path / "notes.txt"
    notes.write_text("not a tutorial\n")
    with pytest.raises(SystemExit):
        bench_main(["--only", "attention_tutorial", "--triton-tutorial", str(notes)])
    assert "no Python file at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--only", "add", "--triton-tutorial", __file__, "--out", out])
    assert "is for --only attention_tutorial" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_tutorial_file_without_attention_is_refused_by_name(tmp_path):
    from course_lib.bench import suites

    empty = tmp_path / "06-fused-attention.py"
    empty.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="defines no attention"):
        suites.load_tutorial(empty)
    with pytest.raises(FileNotFoundError, match="06-fused-attention.py"):
        suites.load_tutorial(tmp_path / "notes.txt")
    good = tmp_path / "tutorial.py"
    good.write_text("def attention(q, k, v, causal, sm_scale):\n    return q\n")
    assert suites.load_tutorial(good).attention(1, 2, 3, True, 0.5) == 1


def _sdpa_attention(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


class _ScaledGradient(torch.autograd.Function):
    """o unchanged, its gradient doubled on the way back: a backward gone wrong."""

    @staticmethod
    def forward(ctx, o):
        return o.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_the_tutorial_is_checked_against_ours_before_it_is_timed():
    from course_lib.bench import suites
    from course_lib.kernels import attention

    def ours(q, k, v, causal):
        return attention.attention(q, k, v, causal)

    point = (1, 2, 40, 16)  # a partial last block
    suites._check_against_ours(_sdpa_attention, ours, point, torch.float32)

    def wrong_backward(q, k, v, causal):
        return _ScaledGradient.apply(_sdpa_attention(q, k, v, causal))

    with pytest.raises(AssertionError, match="1x2x40x16, causal: dq's relative error"):
        suites._check_against_ours(wrong_backward, ours, point, torch.float32)

    def no_mask(q, k, v, causal):
        return _sdpa_attention(q, k, v, False)

    with pytest.raises(AssertionError, match="1x2x40x16, causal: o's relative error"):
        suites._check_against_ours(no_mask, ours, point, torch.float32)


# the first call of a new shape, in fresh processes (course_lib.bench.first_call)


def test_the_first_call_suite_is_registered_with_the_courses_cases():
    from course_lib.bench import first_call, suites

    assert suites.SUITES["first_call"] is suites.first_call_suite
    labels = [f"{case.label()} {case.dtype}" for case in first_call.CASES]
    assert len(set(labels)) == len(labels)
    assert {case.kernel for case in first_call.CASES} == {"matmul", "linear", "conv2d", "attention"}
    assert "matmul 8192x8192x8192 bfloat16" in labels
    assert "matmul 3000x127x2000, relu float32" in labels
    assert "linear 4096x3072->768, forward + backward bfloat16" in labels
    assert "conv2d 32x64x56x56->64 3x3, NCHW float16" in labels
    assert "attention B4 H32 N4096 d128, forward + backward bfloat16" in labels


def test_a_case_refuses_what_it_cannot_build():
    from course_lib.bench.first_call import Case

    with pytest.raises(ValueError, match=r"no case for kernel 'softmax'; use one of \["):
        Case("softmax", (4, 4), "float32")
    with pytest.raises(ValueError, match="'half16' is not a torch dtype"):
        Case("matmul", (4, 4, 4), "half16")
    # as the child reads it back from JSON
    assert Case("matmul", [2, 3, 4], "float32").shape == (2, 3, 4)


# shapes no other test uses: the finished kernels keep a plan per shape in this process
TINY_CASES = [
    ("matmul", (19, 11, 7), "float32", "relu"),
    ("linear", (7, 5, 3), "float32", "forward + backward"),
    ("conv2d", (2, 3, 7, 4, 3, 2, 1), "float16", "channels-last"),
    ("conv2d", (2, 3, 5, 4, 3, 1, 1), "float32", "NCHW"),
    ("attention", (1, 2, 9, 16), "float32", "forward + backward"),
]


@pytest.mark.parametrize("kernel, shape, dtype, variant", TINY_CASES,
                         ids=lambda value: "x".join(map(str, value)) if isinstance(value, tuple)
                         else value)  # fmt: skip
def test_the_childs_measurement_runs_the_kernel_at_a_tiny_size(kernel, shape, dtype, variant):
    from course_lib.bench.first_call import Case, measure

    record = measure(Case(kernel, shape, dtype, variant))
    assert record["first_s"] > 0 and record["second_ms"] > 0
    # the third call launched the course's kernels: the record is the kernel's, not torch's
    assert record["launches"] >= (3 if variant == "forward + backward" else 1)
    assert isinstance(record["tuned"], str)
    # torch's side launches none of them
    theirs = measure(Case(kernel, shape, dtype, variant), side="torch")
    assert theirs["first_s"] > 0 and theirs["launches"] == 0 and theirs["tuned"] == ""
    with pytest.raises(ValueError, match="side is 'course' or 'torch', got 'cuBLAS'"):
        measure(Case(kernel, shape, dtype, variant), side="cuBLAS")


def test_a_fresh_process_measures_a_first_call_then_another_its_warm_cache(capsys):
    from course_lib.bench.first_call import MEASURED, Case, first_call_table

    table = first_call_table([Case("matmul", (23, 13, 9), "float32")], timeout_s=120)
    (measured,) = table.calls
    for process in (measured.empty, measured.warm):
        assert process.outcome == MEASURED, process.detail
        assert process.import_s > 0 and process.first_s > 0
    # one launch in the interpreter; on a GPU, float32's exact route may take more
    assert measured.empty.launches == measured.warm.launches >= 1
    assert measured.torch_process.outcome == MEASURED and measured.torch_process.launches == 0
    # without a GPU nothing compiles; on one the first process compiles what the second reuses
    assert measured.compiled[1] == 0
    # the row is printed as soon as it is measured, under the table's header
    printed = capsys.readouterr().out.splitlines()
    assert printed[2].startswith("| case | dtype | imports s |")
    assert printed[4] == table.row(measured) and printed[4].startswith("| matmul 23x13x9 |")


def test_a_child_past_its_timeout_is_reported_and_not_measured_again():
    from course_lib.bench.first_call import NOT_RUN, TIMED_OUT, Case, FirstCallTable, first_call

    case = Case("matmul", (23, 13, 9), "float32")
    measured = first_call(case, timeout_s=0.01)  # not even Python's imports fit
    assert (measured.empty.outcome, measured.empty.detail) == (TIMED_OUT, "after 0.01 s")
    assert measured.warm.outcome == NOT_RUN and measured.torch_process.outcome == TIMED_OUT
    table = FirstCallTable("first call: matmul", [measured]).table()
    assert (
        "| matmul 23x13x9 | float32 | timed out | timed out | not run | timed out | 0 / — "
        "| timed out |" in table
    )
    assert "- matmul 23x13x9, torch: timed out, after 0.01 s" in table
    assert (
        "- target first call ≤ 10 s with an empty cache: missed at matmul 23x13x9 float32 "
        "(timed out)" in table
    )
    assert "- matmul 23x13x9, empty cache: timed out, after 0.01 s" in table


@pytest.mark.skipif(not runtime.INTERPRETED, reason="interpreter behaviour")
def test_a_child_that_fails_reports_its_error():
    from course_lib.bench.first_call import FAILED, Case, run_fresh

    process = run_fresh(Case("matmul", (8, 8, 8), "bfloat16"), "unused-cache", timeout_s=120)
    assert process.outcome == FAILED
    assert process.detail.startswith("TypeError: matmul: bfloat16 needs a GPU")


def test_the_first_call_report_names_the_cases_that_miss_each_target():
    from course_lib.bench.first_call import Case, FirstCall, FirstCallTable, FreshProcess

    def process(first_s, tuned=""):
        return FreshProcess(import_s=4.25, first_s=first_s, second_ms=0.31, launches=1,
                            tuned=tuned)  # fmt: skip

    tile = "matmul_kernel BLOCK_M=128 BLOCK_N=128 num_warps=8"
    other = "matmul_kernel BLOCK_M=64 BLOCK_N=128 num_warps=4"
    table = FirstCallTable(
        "first call: matmul",
        [
            FirstCall(Case("matmul", (1000,) * 3, "float16"), process(3.2), process(0.4), (1, 0),
                      torch_process=process(0.21)),
            FirstCall(Case("matmul", (8192,) * 3, "float16"), process(14.23, tile),
                      process(1.52, other), (11, 0), c_modules=2),
        ],
    )  # fmt: skip
    lines = table.table().splitlines()
    assert "| matmul 1000x1000x1000 | float16 | 4.2 | 3.20 | 0.40 | 0.21 | 1 / 0 | 0.31 |" in lines
    assert (
        "| matmul 8192x8192x8192 | float16 | 4.2 | 14.23 | 1.52 | not run | 11 / 0 | 0.31 |"
        in lines
    )
    assert lines[-4:] == [
        "- target first call ≤ 10 s with an empty cache: missed at matmul 8192x8192x8192 "
        "float16 (14.2 s)",
        "- target first call ≤ 1 s with a warm cache: missed at matmul 8192x8192x8192 "
        "float16 (1.5 s)",
        "- matmul 8192x8192x8192: Triton built 2 C modules into the empty cache, within its figure",
        f"- tiles at matmul 8192x8192x8192: {tile} (warm cache: {other})",
    ]
    table.calls.pop()
    assert table.verdicts() == [
        "target first call ≤ 10 s with an empty cache: met",
        "target first call ≤ 1 s with a warm cache: met",
    ]


@pytest.mark.gpu
def test_a_warm_cache_compiles_nothing_again_on_gpu():
    from course_lib.bench.first_call import MEASURED, Case, first_call

    measured = first_call(Case("matmul", (512, 384, 256), "float16"), timeout_s=300)
    assert measured.empty.outcome == measured.warm.outcome == MEASURED
    assert measured.compiled[0] >= 1 and measured.compiled[1] == 0
    assert measured.warm.first_s < measured.empty.first_s
    assert measured.empty.second_ms < 1e3 * measured.empty.first_s


# the linear suite's transformer shapes, and conv2d against cuDNN's own autotuner


def test_the_transformer_shapes_and_their_targets(tmp_path, capsys):
    from course_lib.bench import suites

    shapes = suites.TRANSFORMER_SHAPES
    assert len(shapes) == 13 and (16384, 11008, 4096) in shapes and (4096, 768, 3072) in shapes
    for shape in shapes:
        ratios = [t.ratio for t in suites.TRANSFORMER_TARGETS if t.where(shape)]
        assert ratios == ([0.9] if shape == (1024, 1024, 1024) else [0.95]), shape
    # the section can be run alone
    assert suites.SUITE_PARTS["linear_transformer"] is suites.linear_transformer_suite
    if runtime.INTERPRETED:
        assert bench_main(["--only", "linear_transformer", "--out", str(tmp_path / "b")]) == 0
        assert "Benchmarking needs a GPU" in capsys.readouterr().out


def test_cudnn_tuning_runs_on_a_thread_of_its_own_and_leaves_the_flag_as_it_was():
    import threading

    from course_lib.bench import suites

    saved = torch.backends.cudnn.benchmark
    thread, flag = suites.with_cudnn_tuning(
        lambda: (threading.get_ident(), torch.backends.cudnn.benchmark)
    )
    assert thread != threading.get_ident() and flag is True
    assert torch.backends.cudnn.benchmark == saved
    with pytest.raises(KeyError), suites.cudnn_benchmark(not saved):
        assert torch.backends.cudnn.benchmark == (not saved)
        raise KeyError("a sweep that stops half-way")
    assert torch.backends.cudnn.benchmark == saved
    for layout, ratio in (("channels-last", 0.8), ("NCHW", 0.9)):
        (target,) = suites.CUDNN_TUNED_TARGETS[layout]
        assert (target.baseline, target.ratio) == (suites.CUDNN_TUNED, ratio)
        assert all(target.where(p) for p in suites.RESNET_LAYERS)
        assert not target.where(suites.STEM)
