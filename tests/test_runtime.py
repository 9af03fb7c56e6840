import os
import subprocess
import sys

import pytest
import torch

from course_lib import runtime


def _run(code: str, tmp_path, **env) -> str:
    # from a file: @triton.jit reads the kernel's source, which `python -c` has none of
    script = tmp_path / "script.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return result.stdout.strip()


def test_mode_matches_the_machine():
    assert runtime.MODE == ("gpu" if torch.cuda.is_available() else "interpreter")
    assert runtime.DEVICE.type == ("cuda" if runtime.MODE == "gpu" else "cpu")


def test_learners_kernels_are_interpreted_without_a_gpu(tmp_path):
    # the learner defines a kernel after importing course_lib, as the first cell does
    code = (
        "import course_lib, triton\n"
        "@triton.jit\n"
        "def k(x_ptr): pass\n"
        "print(course_lib.MODE, type(k).__name__)"
    )
    env = {"TRITON_INTERPRET": ""}
    expected = "gpu JITFunction" if torch.cuda.is_available() else "interpreter InterpretedFunction"
    assert _run(code, tmp_path, **env) == expected


def test_triton_interpret_forces_the_interpreter(tmp_path):
    code = (
        "import course_lib, os\n"
        "print(course_lib.MODE, course_lib.DEVICE, os.environ['TRITON_INTERPRET'])"
    )
    assert _run(code, tmp_path, TRITON_INTERPRET="1") == "interpreter cpu 1"


def test_late_import_warns():
    code = "import triton, course_lib"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": ""},
    )
    if torch.cuda.is_available():
        assert result.stderr == ""
    else:
        assert "Import course_lib first" in result.stderr


def test_describe_names_mode_and_versions():
    import triton

    line = runtime.describe()
    assert line.startswith("Mode: ")
    assert f"torch {torch.__version__}" in line and f"triton {triton.__version__}" in line
    if runtime.MODE == "gpu":
        assert torch.cuda.get_device_name() in line
    else:
        assert "interpreter" in line


def test_by_mode_picks_the_value_for_this_mode():
    assert runtime.by_mode(gpu="big", interpreter="small") == (
        "small" if runtime.INTERPRETED else "big"
    )


def test_gpu_only_says_so_in_the_interpreter(capsys):
    ran = runtime.gpu_only("Timing")
    out = capsys.readouterr().out
    if runtime.INTERPRETED:
        assert not ran and out == "⏭ Timing needs a GPU: skipped in the interpreter.\n"
    else:
        assert ran and out == ""


def test_gpu_only_names_the_capability_an_older_gpu_lacks(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (8, 0))
    assert runtime.gpu_only("The TMA kernel", capability=(8, 0))
    assert not runtime.gpu_only("The TMA kernel", capability=(9, 0))
    assert capsys.readouterr().out == (
        "⏭ The TMA kernel needs a GPU of compute capability 9.0 or later; "
        "this one is 8.0: skipped.\n"
    )


def test_dtype_errors_say_what_to_do():
    runtime.require_supported_dtype(torch.float32, "op")
    with pytest.raises(TypeError, match="int64 is not supported; use one of float32"):
        runtime.require_supported_dtype(torch.int64, "op")
    if runtime.INTERPRETED:
        with pytest.raises(TypeError, match="bfloat16 needs a GPU"):
            runtime.require_supported_dtype(torch.bfloat16, "op")


def test_tf32_sets_the_flag_for_the_block_and_restores_it_after_an_error():
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(KeyError):
        with runtime.tf32(not before):
            assert torch.backends.cuda.matmul.allow_tf32 is (not before)
            raise KeyError
    assert torch.backends.cuda.matmul.allow_tf32 is before


@pytest.mark.gpu
def test_compile_kernel_compiles_and_loads_without_running():
    import triton
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

    x = torch.randn(100, device="cuda")
    before = x.clone()
    compiled = runtime.compile_kernel(double_kernel, x, 100, BLOCK=128, num_warps=2)
    torch.cuda.synchronize()
    assert torch.equal(x, before)  # compiled, not run
    assert compiled.n_regs > 0 and compiled.metadata.num_warps == 2
    with pytest.raises(TypeError, match="@triton.jit"):
        runtime.compile_kernel(lambda x: x, x)


def test_compile_kernel_says_it_needs_a_gpu_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(runtime, "INTERPRETED", True)
    with pytest.raises(RuntimeError, match="needs a GPU.*gpu_only"):
        runtime.compile_kernel(object())
