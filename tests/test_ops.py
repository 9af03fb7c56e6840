"""Lesson 08: the finished kernels as operators under torch.compile, and the checks that
grade an operator and report graph breaks."""

import contextlib

import broken_kernels as broken
import pytest
import torch
from reports import assert_hint_under
from torch.library import custom_op

import course_lib
from course_lib import DEVICE, ops, references, runtime
from course_lib.checks import CheckFailed, ExerciseNotDone, replay
from course_lib.checks.compiled import graph_breaks
from course_lib.kernels import hopper
from course_lib.kernels import linear as lesson07
from course_lib.kernels.softmax import softmax as finished_softmax


def _compiled(fn, **options):
    torch.compiler.reset()
    return torch.compile(fn, fullgraph=True, backend=ops.COMPILE_BACKEND, **options)


def _rand(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(DEVICE, dtype)


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (ops._softmax, lambda: (_rand(5, 37),)),
        (ops._softmax, lambda: (_rand(37, 6).t(),)),  # columns not adjacent: copied
        (ops._matmul, lambda: (_rand(9, 13), _rand(13, 7), None)),
        (ops._matmul, lambda: (_rand(9, 13), _rand(7, 13).t(), "relu")),
        (ops._linear, lambda: (_rand(2, 3, 11).requires_grad_(), _rand(6, 11).requires_grad_(),
                               _rand(6).requires_grad_(), "gelu", True)),
        (ops._linear, lambda: (_rand(4, 11).requires_grad_(), _rand(6, 11), None, "relu", False)),
    ],
    ids=["softmax", "softmax-transposed", "matmul", "matmul-relu-kmajor", "linear-gelu",
         "linear-relu-x-only"],
)  # fmt: skip
def test_operators_pass_opcheck(op, args):
    """Schema, fake against real, autograd registration and AOT dispatch with dynamic
    shapes: what torch.compile relies on."""
    torch.library.opcheck(op, args())


def test_compiled_functions_of_the_operators_match_eager_without_a_graph_break():
    x, a, b = _rand(6, 300), _rand(9, 40), _rand(40, 17)

    def chain(x, a, b):
        return ops.softmax(x * 2) + 1, ops.matmul(a, b).relu()

    assert graph_breaks(chain, x, a, b) == []
    got, expected = _compiled(chain)(x, a, b), chain(x, a, b)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(got[0] - 1, references.softmax(x * 2))


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_compiled_linear_gives_lesson_07s_gradients(activation, bias):
    """The operator's backward is lesson 07's; compiled, the gradients equal eager ones,
    for every input that requires one and with leading dimensions."""
    x = _rand(2, 3, 19, dtype=torch.float64, seed=1).requires_grad_()
    weight = _rand(10, 19, dtype=torch.float64, seed=2).requires_grad_()
    b = _rand(10, dtype=torch.float64, seed=3).requires_grad_() if bias else None
    grad_y = _rand(2, 3, 10, dtype=torch.float64, seed=4)
    inputs = [t for t in (x, weight, b) if t is not None]

    def loss(x, weight, b):
        return (ops.linear(x, weight, b, activation) * grad_y).sum()

    compiled = torch.autograd.grad(_compiled(loss)(x, weight, b), inputs)
    y = lesson07.linear(x, weight, b, activation)
    expected = torch.autograd.grad(y, inputs, grad_y)
    for got, want in zip(compiled, expected):
        torch.testing.assert_close(got, want)


def test_linear_operator_passes_gradcheck_in_float64():
    x = _rand(3, 7, dtype=torch.float64).requires_grad_()
    weight = _rand(5, 7, dtype=torch.float64, seed=1).requires_grad_()
    b = _rand(5, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: ops.linear(*t, "gelu"), (x, weight, b))


def test_linear_operator_stores_the_preactivation_only_for_a_backward(monkeypatch):
    asked = []
    linear_op = ops._linear
    monkeypatch.setattr(ops, "_linear", lambda *args: asked.append(args[-1]) or linear_op(*args))
    x, weight = _rand(4, 11), _rand(6, 11)
    with torch.no_grad():
        ops.linear(x.requires_grad_(), weight, None, "gelu")
    ops.linear(x, weight, None, "gelu")  # x requires a gradient
    ops.linear(x.detach(), weight, None, "gelu")  # nothing does
    ops.linear(x, weight, None, "relu")  # relu's slope comes from y
    assert asked == [False, True, False, False]
    _, z = linear_op(x.detach(), weight, None, "gelu", False)
    assert z.numel() == 0


def test_linear_operator_refuses_a_second_derivative():
    x = _rand(3, 5, dtype=torch.float64).requires_grad_()
    weight = _rand(4, 5, dtype=torch.float64, seed=1).requires_grad_()
    (grad_x,) = torch.autograd.grad(ops.linear(x, weight, None, "gelu").sum(), x,
                                    create_graph=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="differentiable once"):
        grad_x.sum().backward()


LAYER_CASES = [
    # x's shape, bias, activation, which inputs train, grad_y transposed
    ((3, 7), True, "gelu", "xwb", False),
    ((2, 5, 7), False, "relu", "xw", True),
    ((2, 5, 7), True, None, "x", False),
    ((4, 7), True, "gelu", "w", True),
    ((4, 7), True, "relu", "b", False),
    ((0, 7), True, "gelu", "xwb", False),
]


@pytest.mark.parametrize(("x_shape", "bias", "activation", "trained", "transposed"), LAYER_CASES)
def test_linear_operator_gradients_match_pytorch_in_float64(
    x_shape, bias, activation, trained, transposed
):
    """Against F.linear and the activation in float64, not against lesson 07's kernels,
    which share the backward: every subset of inputs that train, leading dimensions, no
    bias, a transposed output gradient and no rows at all."""
    x = _rand(*x_shape, dtype=torch.float64, seed=1)
    weight = _rand(6, 7, dtype=torch.float64, seed=2)
    b = _rand(6, dtype=torch.float64, seed=3) if bias else None
    leaves = {"x": x, "w": weight, "b": b}
    for name in trained:
        if leaves[name] is not None:
            leaves[name].requires_grad_()
    grad_y = _rand(*x_shape[:-1], 6, dtype=torch.float64, seed=4)
    if transposed and grad_y.dim() == 2:
        grad_y = grad_y.t().contiguous().t()
    inputs = [t for t in leaves.values() if t is not None and t.requires_grad]
    activate = {None: lambda z: z, "relu": torch.relu, "gelu": torch.nn.functional.gelu}
    ours = torch.autograd.grad(ops.linear(x, weight, b, activation), inputs, grad_y)
    theirs = torch.autograd.grad(
        activate[activation](torch.nn.functional.linear(x, weight, b)), inputs, grad_y
    )  # fmt: skip
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want)


def test_compiled_linear_recompiles_nothing_for_a_new_batch_under_dynamic_shapes():
    layer = ops.Linear(16, 8, activation="relu").to(DEVICE)
    frames = []

    def counting(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    torch.compiler.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=counting)
    for rows in (5, 9, 33):
        x = _rand(rows, 16, seed=rows)
        torch.testing.assert_close(compiled(x), torch.relu(torch.nn.functional.linear(
            x, layer.weight, layer.bias)), rtol=1e-5, atol=1e-5)  # fmt: skip
    assert len(frames) == 1


def test_ops_linear_module_is_an_nn_linear_with_its_state_dict():
    ours = ops.Linear(12, 5, activation="gelu")
    theirs = torch.nn.Linear(12, 5)
    theirs.load_state_dict(ours.state_dict())
    assert "activation='gelu'" in repr(ours)
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.Linear(3, 4, activation="tanh")


def test_linear_operator_refuses_bad_input_with_lesson_07s_errors():
    with pytest.raises(ValueError, match="in_features"):
        ops.linear(_rand(3, 4), _rand(5, 6))
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.linear(_rand(3, 4), _rand(5, 4), None, "tanh")


# -- check_compiled -------------------------------------------------------------------------


def _with_breaks(x):
    y = x * 2
    print("inside")
    if y.sum() > 0:
        y = y + 1
    return y


def test_check_compiled_names_each_graph_break_with_its_line_and_hint(capsys):
    with pytest.raises(CheckFailed) as info:
        course_lib.check_compiled(_with_breaks, _rand(4, 8))
    report = info.value.result.report()
    assert 'print("inside")' in report and "if y.sum() > 0:" in report, report
    assert "test_ops.py, line" in report
    assert "hint: print inside compiled code breaks the graph" in report
    assert "not run until the function compiles as one graph" in report


def test_check_compiled_passes_a_function_of_operators(capsys):
    x = _rand(6, 300)
    result = course_lib.check_compiled(lambda x: ops.softmax(x).sum(-1), x)
    assert result.passed
    assert capsys.readouterr().out.startswith("✓ compiled")


def test_check_compiled_compares_every_output_and_gives_each_run_fresh_inputs():
    x = _rand(6, 30)
    with pytest.raises(CheckFailed) as info:  # a dict of outputs, compared inside
        course_lib.check_compiled(lambda x: {"y": x * 2}, x, reference=lambda x: {"y": x * 3})
    assert "differs by up to" in info.value.result.report()

    def doubles_in_place(x):
        return x.mul_(2)

    assert course_lib.check_compiled(doubles_in_place, x).passed
    torch.testing.assert_close(x, _rand(6, 30))  # the caller's tensor untouched


def test_check_compiled_compares_with_the_reference_given():
    x = _rand(6, 30)
    with pytest.raises(CheckFailed) as info:
        course_lib.check_compiled(lambda x: x * 2, x, reference=lambda x: x * 3)
    assert "differs by up to" in info.value.result.report()


# -- check_softmax_op: the exercise ---------------------------------------------------------


def _operator(name, fake=None, body=finished_softmax):
    @custom_op(f"course_tests::{name}", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return body(x)

    if fake is not None:
        op.register_fake(fake)
    return op


def test_check_softmax_op_passes_a_registered_operator_with_its_fake(capsys):
    op = _operator("right", lambda x: x.new_empty(x.shape))  # contiguous, as softmax returns
    assert course_lib.check_softmax_op(op).passed
    assert capsys.readouterr().out.strip() == "✓ softmax_op: every case passed"


OPERATOR_MISTAKES = [
    ("plain function", lambda: finished_softmax, "opcheck", "decorate the function with "
     "@torch.library.custom_op"),
    ("no fake", lambda: _operator("no_fake"), "opcheck", "give the operator a fake"),
    ("fake of one column", lambda: _operator("fake_column", lambda x: x.new_empty(x.shape[0], 1)),
     "opcheck", "the fake must describe what the real operator returns"),
    ("fake of float64", lambda: _operator(
        "fake_float64", lambda x: x.new_empty(x.shape, dtype=torch.float64)),
     "opcheck", "the fake must describe what the real operator returns"),
    ("fake of a fixed shape", lambda: _operator("fake_fixed", lambda x: x.new_empty(9, 100)),
     "opcheck", "A shape written as numbers fits one input only"),
    ("fake copies strides", lambda: _operator("fake_like", lambda x: torch.empty_like(x)),
     "opcheck", "torch.empty_like(x) copies a transposed x's strides"),
    ("returns its input", lambda: _operator("aliases", lambda x: x.new_empty(x.shape),
                                            body=lambda x: x),
     "eager: 1x1", "an operator must return a new tensor"),
    ("no kernel", lambda: _operator("torch_only", lambda x: x.new_empty(x.shape),
                                    body=lambda x: torch.softmax(x, -1)),
     "eager: 1x1", "launch your kernel"),
    ("the course's operator", lambda: ops._softmax, "eager: 1x1", "register your own launcher"),
    ("the course's wrapper", lambda: ops.softmax, "eager: 1x1", "register your own launcher"),
    ("fake returns nothing", lambda: _operator("fake_none", lambda x: None),
     "opcheck", "the fake must return its result"),
    ("fake of float32", lambda: _operator(
        "fake_float32", lambda x: torch.empty(x.shape, dtype=torch.float32, device=x.device)),
     "opcheck", "the fake must describe what the real operator returns"),
    ("fake of Python ints", lambda: _operator(
        "fake_ints", lambda x: x.new_empty(int(x.shape[0]), int(x.shape[1]))),
     "dynamic=True", "each new shape compiles again"),
    ("fake that launches", lambda: _operator("fake_launches", finished_softmax),
     "opcheck", "a fake only allocates"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "case", "hint"), [m[1:] for m in OPERATOR_MISTAKES],
    ids=[m[0] for m in OPERATOR_MISTAKES],
)  # fmt: skip
def test_check_softmax_op_names_the_mistake(make, case, hint):
    with pytest.raises(CheckFailed) as info:
        course_lib.check_softmax_op(make())
    assert_hint_under(info.value.result.report(), case, hint)


def test_check_softmax_op_shows_the_stub_of_an_unwritten_fake():
    def unwritten(x):
        raise ExerciseNotDone("write the fake")

    with pytest.raises(ExerciseNotDone, match="write the fake"):
        course_lib.check_softmax_op(_operator("fake_unwritten", unwritten))


@pytest.mark.parametrize("fake_given", [True, False], ids=["right", "no-fake"])
def test_check_softmax_op_replays_in_the_graders_process(fake_given):
    """The grader calls nothing of the learner's: it judges the recorded outputs against its
    own references, and adopts what only the learner's process saw (opcheck, compiling),
    which can fail a case and never pass one."""
    fake = (lambda x: x.new_empty(x.shape)) if fake_given else None
    op = _operator(f"replayed_{fake_given}", fake)
    with replay.recording() as recorder, contextlib.suppress(CheckFailed):
        course_lib.check_softmax_op(op)

    def stub(x, stage="eager"):
        raise AssertionError("a replay must not call the learner's function")

    with replay.replaying(recorder.records):
        try:
            result = course_lib.check_softmax_op(stub)
        except CheckFailed as failure:
            result = failure.result
    assert result.passed == fake_given, result.report()
    if not fake_given:
        assert "give the operator a fake" in result.report()


@pytest.mark.skipif(runtime.MODE == "gpu", reason="the interpreter's limit")
def test_a_raw_launch_does_not_trace_in_the_interpreter():
    """Under TRITON_INTERPRET=1 the kernel itself would run on fake tensors: the lesson
    says so, and the check's hint points at custom_op."""
    with pytest.raises(CheckFailed) as info:
        course_lib.check_compiled(lambda x: finished_softmax(x) * 2, _rand(4, 8))
    assert "graph break" in info.value.result.report()


@pytest.mark.parametrize("activation", [None, "relu"])
def test_matmul_and_softmax_operators_differentiate(activation):
    """matmul's backward is two more of its products; softmax's is PyTorch's formula.
    Against torch's own gradients (neither kernel takes float64, which gradcheck needs)."""
    a, b = _rand(7, 12).requires_grad_(), _rand(12, 5, seed=1).requires_grad_()
    grad_c = _rand(7, 5, seed=2)
    got = torch.autograd.grad(ops.matmul(a, b, activation), (a, b), grad_c)
    c = a @ b
    want = torch.autograd.grad(c.relu() if activation else c, (a, b), grad_c)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    x, grad_y = _rand(4, 9, seed=3).requires_grad_(), _rand(4, 9, seed=4)
    got = torch.autograd.grad(ops.softmax(x), x, grad_y)[0]
    want = torch.autograd.grad(torch.softmax(x, -1), x, grad_y)[0]
    torch.testing.assert_close(got, want)


def test_a_launch_with_fake_tensors_is_stopped_before_it_runs():
    """On a GPU, a kernel launched with fake tensors reads a pointer to nowhere, and the
    illegal memory access leaves the CUDA context unusable: the check refuses the launch,
    through the finished kernels' lean launch as through kernel[grid](...)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from course_lib.checks.launches import LaunchOnFakeTensors, refusing_fake_launches

    x = _rand(4, 8)
    finished_softmax(x)  # compiled and kept: the next call takes the lean path
    with FakeTensorMode() as mode, refusing_fake_launches():
        fake = mode.from_tensor(x)
        with pytest.raises(LaunchOnFakeTensors):
            finished_softmax(fake)
    torch.testing.assert_close(finished_softmax(x), torch.softmax(x, -1))


def _generated_code(fn, *args):
    """What Inductor writes for fn, forward and backward, after running it."""
    from torch._inductor.utils import run_and_get_code

    torch.compiler.reset()
    return "\n".join(run_and_get_code(fn, *args)[1])


@pytest.mark.gpu
def test_inductor_launches_the_operators_plain_kernels_itself():
    """Taken apart on a GPU: softmax's kernel and a small layer's kernels, forward and
    backward, are launched from Inductor's code, with no call of the operator left."""
    x = _rand(33, 781)
    compiled = torch.compile(lambda x: ops.softmax(x) * 2, fullgraph=True)
    code = _generated_code(compiled, x)
    assert "torch.ops.course" not in code and "softmax_kernel" in code
    torch.testing.assert_close(compiled(x), torch.softmax(x, -1) * 2)

    x, weight = _rand(5, 40).requires_grad_(), _rand(24, 40, seed=1).requires_grad_()
    bias, grad_y = _rand(24, seed=2).requires_grad_(), _rand(5, 24, seed=3)
    layer = torch.compile(ops.linear, fullgraph=True)
    code = _generated_code(
        lambda *a: torch.autograd.grad(layer(*a, activation="gelu"), a, grad_y), x, weight, bias
    )
    assert "torch.ops.course" not in code
    assert "linear_kernel" in code and "output_grad_kernel" in code
    got = torch.autograd.grad(layer(x, weight, bias, activation="gelu"), (x, weight, bias), grad_y)
    want = torch.autograd.grad(
        torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias)), (x, weight, bias),
        grad_y,
    )  # fmt: skip
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)


# a product kernel's tile, in the order Inductor writes a user kernel's constexprs
TILE = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")


def _eager_launch(fn, *args, kernel_name: str) -> dict:
    """Every argument by name (the tile too) of the last launch of `kernel_name` that an
    eager call fn(*args) makes."""
    from course_lib.bench.recording import recording_launches

    with recording_launches() as launches:
        fn(*args)
    named = [launch.kwargs for launch in launches if launch.kernel.__name__ == kernel_name]
    assert named, f"an eager call launched no {kernel_name}: {launches}"
    return named[-1]


def _assert_launched_with_the_eager_tile(a, b, kernel_name):
    """A compiled a @ b launches `kernel_name` from Inductor's code, with no call of the
    operator left and the tile an eager a @ b launches it with (the autotuner's choice, or
    one measured beforehand), and gets the product right."""
    compiled = torch.compile(ops.matmul, fullgraph=True)
    code = _generated_code(compiled, a, b)
    assert "torch.ops.course" not in code and kernel_name in code
    eager = _eager_launch(ops.matmul, a, b, kernel_name=kernel_name)
    expected = [", ".join(f"'{name}': {eager[name]!r}" for name in TILE)]
    if "WARP_SPECIALIZE" in eager:
        expected.append(f"'WARP_SPECIALIZE': {eager['WARP_SPECIALIZE']!r}")
    written = [line.strip()[:400] for line in code.splitlines() if "'BLOCK_M'" in line]
    for part in expected:
        assert part in code, f"an eager call launches {part}; the graph's: {written}"
    torch.testing.assert_close(compiled(a, b), a @ b, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_an_autotuned_product_enters_the_graph_with_the_tile_an_eager_call_takes():
    """Past SMALL_PRODUCT matmul's kernel is autotuned: the graph takes it with the config
    an eager call of that shape launches, so Inductor launches that tile and does not
    tune again. Under dynamic shapes no one config stands for every size, and the
    operator stays whole."""
    a, b = _rand(512, 384, dtype=torch.float16), _rand(384, 640, dtype=torch.float16, seed=1)
    _assert_launched_with_the_eager_tile(a, b, "matmul_kernel")

    dynamic = torch.compile(ops.matmul, fullgraph=True, dynamic=True)
    assert "torch.ops.course.matmul" in _generated_code(dynamic, a, b)
    torch.testing.assert_close(dynamic(a, b), a @ b, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_a_tma_product_enters_the_graph_building_its_descriptors_on_the_gpu():
    """A product for the Hopper TMA kernel enters the graph too: the kernel builds its
    descriptors on the GPU there, with the tile an eager call launches, since torch
    records no descriptor built on the host. So does a GELU layer's forward with its bias
    (taken by the TMA kernel where no backward is to come), and its backward's products."""
    from course_lib.kernels import matmul_fast_paths as fast

    if hopper.capability(DEVICE.index or 0) not in fast.TMA_GPUS:
        pytest.skip("matmul takes no TMA kernel on this GPU")
    # a 16-bit product takes the TMA kernel from 2048^3 on
    a = _rand(2048, 2048, dtype=torch.float16)
    b = _rand(2056, 2048, dtype=torch.float16, seed=1).t()
    _assert_launched_with_the_eager_tile(a, b, "tma_matmul_kernel")

    # past TMA_MIN_PRODUCT
    x = _rand(2048, 2048, dtype=torch.bfloat16).requires_grad_()
    weight = (_rand(2048, 2048, dtype=torch.bfloat16, seed=1) / 45).requires_grad_()
    bias = _rand(2048, dtype=torch.bfloat16, seed=2).requires_grad_()
    grad_y = _rand(2048, 2048, dtype=torch.bfloat16, seed=3)
    layer = torch.compile(ops.linear, fullgraph=True)
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias))
    with torch.no_grad():
        code = _generated_code(lambda *a: layer(*a, activation="gelu"), x, weight, bias)
        assert "torch.ops.course" not in code and "'HAS_BIAS': True" in code
        assert "tma_matmul_kernel" in code and "'ACTIVATION': 'gelu'" in code
        got = layer(x, weight, bias, activation="gelu")
    assert (got - want).float().norm() <= 1e-2 * want.float().norm()

    # with a backward to come, the forward saves its pre-activation from linear_kernel;
    # the backward's two products go to the TMA kernel
    step = lambda *a: torch.autograd.grad(layer(*a, activation="gelu"), a, grad_y)
    code = _generated_code(step, x, weight, bias)
    assert "torch.ops.course" not in code and "tma_matmul_kernel" in code
    expected = torch.autograd.grad(want, (x, weight, bias), grad_y)
    for got, expected_grad in zip(step(x, weight, bias), expected):
        assert (got - expected_grad).float().norm() <= 1e-2 * expected_grad.float().norm()

    # another backend launches the recorded kernels through Triton, the backward's from
    # autograd's own thread, where the kernel's pre-run hook sets the allocator
    torch._dynamo.reset()
    layer = torch.compile(ops.linear, fullgraph=True, backend="aot_eager")
    for got, expected_grad in zip(step(x, weight, bias), expected):
        assert (got - expected_grad).float().norm() <= 1e-2 * expected_grad.float().norm()


def test_the_kernel_building_its_own_descriptors_computes_what_the_host_built_ones_do():
    """The launch a compiled graph makes, run directly: each layout of A and B, a bias and
    GELU, C with padded rows, bit for bit the product with host descriptors. Where a
    graph runs without Inductor, a misaligned operand stops with an error."""
    from course_lib.kernels import matmul_fast_paths as fast

    if runtime.MODE == "gpu" and hopper.capability(DEVICE.index or 0) not in fast.TMA_GPUS:
        pytest.skip("no TMA kernel on this GPU")
    dtype, (M, K, N) = torch.float16, (40, 64, 48)
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "WARP_SPECIALIZE": False}
    grid = lambda m: (min(4, -(-M // m["BLOCK_M"]) * -(-N // m["BLOCK_N"])),)
    bias = _rand(N, dtype=dtype, seed=2)
    meta = lambda a_m_major, b_k_major: dict(
        NUM_SMS=4, A_M_MAJOR=a_m_major, B_K_MAJOR=b_k_major, HAS_BIAS=True,
        ACTIVATION="gelu", INPUT_PRECISION="ieee", DTYPE=str(dtype),
    )  # fmt: skip

    def in_graph(a, b, c, a_m_major, b_k_major):
        strides = (hopper.by_rows(a).stride(0), hopper.by_rows(b).stride(0), c.stride(0))
        fast._launch_in_graph(
            a, b, c, bias, grid=grid, config=config, meta=meta(a_m_major, b_k_major),
            strides=strides,
        )  # fmt: skip

    for a_m_major, b_k_major in [(False, False), (True, False), (False, True), (True, True)]:
        a = _rand(K, M, dtype=dtype).t() if a_m_major else _rand(M, K, dtype=dtype)
        b = _rand(N, K, dtype=dtype, seed=1).t() if b_k_major else _rand(K, N, dtype=dtype, seed=1)
        want = torch.empty(M, N, dtype=dtype, device=DEVICE)
        got = torch.empty(M, N + 8, dtype=dtype, device=DEVICE)[:, :N]
        fast.tma_matmul(a, b, want, "gelu", config=config, bias=bias)
        in_graph(a, b, got, a_m_major, b_k_major)
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    misaligned = _rand(M * K + 1, dtype=dtype)[1:].view(M, K)
    with pytest.raises(ValueError, match="16-byte aligned address"):
        in_graph(misaligned, _rand(K, N, dtype=dtype), got, False, False)
    # a graph run by another backend than Inductor launches the kernel with every argument
    # it can by position, constexprs included: the pre-run hook reads them there too
    named = config | meta(False, False) | dict(
        a_desc=misaligned, b_desc=_rand(K, N, dtype=dtype), c_desc=got, bias_ptr=bias,
        M=M, N=N, K=K, stride_a=K, stride_b=N, stride_c=got.stride(0), DEVICE_DESCRIPTORS=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="16-byte aligned address"):
        fast._before_device_descriptors(*(named[n] for n in fast.tma_matmul_kernel.arg_names))


def test_the_autotuner_times_a_traced_launch_on_scratch_of_the_same_layout():
    """What tuned_config hands the autotuner: real tensors with the traced ones' sizes,
    strides and dtypes (a transposed view, an empty one), a descriptor over such a
    tensor, and every other argument as it is."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from course_lib.kernels._launch import _scratch_like

    x = _rand(8, 24, dtype=torch.float16)[:, :20].t()
    for t in (x, x[:0]):
        scratch = _scratch_like(t)
        assert (scratch.shape, scratch.stride(), scratch.dtype) == (t.shape, t.stride(), t.dtype)
        assert scratch.data_ptr() != t.data_ptr() or t.numel() == 0
    desc = TensorDescriptor.from_tensor(_rand(16, 16), [16, 16])
    scratch = _scratch_like(desc)
    assert scratch.base is not desc.base and scratch.base.shape == desc.base.shape
    assert (scratch.block_shape, list(scratch.strides)) == (desc.block_shape, list(desc.strides))
    assert _scratch_like(7) == 7


def test_a_launch_into_a_graph_refuses_what_inductor_cannot_take():
    """Host-side TMA descriptors, and autotuned kernels at symbolic sizes, are not
    recorded into a graph: the operator that launches them stays whole (NotTraceable).
    Traced operands are checked against the TMA unit's rules by their offsets."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from triton.tools.tensor_descriptor import TensorDescriptor

    from course_lib.kernels import matmul as lesson05
    from course_lib.kernels import matmul_fast_paths as fast
    from course_lib.kernels._launch import NotTraceable
    from course_lib.kernels._plan import launching_into_graph, signature

    c, size = _rand(16, 16), ShapeEnv().create_unbacked_symint()
    with launching_into_graph():
        with pytest.raises(NotTraceable, match="symbolic"):
            lesson05.matmul_autotuned_launcher[(1,)](c, c, c, size, 16, 16, 16, 1, 16, 1, 16, 1)
        with pytest.raises(NotTraceable, match="TMA descriptors"):
            fast.tma_launcher[(1,)](TensorDescriptor.from_tensor(c, [16, 16]))
        # no plan is kept for traced tensors, which have no address to key it by
        assert signature((c, c), (None,)) is None
    assert signature((c, c), (None,)) is not None

    # a traced tensor has no address (data_ptr raises): its start is checked by its offset
    with FakeTensorMode() as fake_mode:
        fake = fake_mode.from_tensor(c)
        with FunctionalTensorMode():
            traced = FunctionalTensor.to_functional(fake)
            with launching_into_graph():
                assert hopper.tma_rule_broken(traced) is None
                offset = traced.view(-1)[1:-15].view(15, 16)
                assert "aligned" in hopper.tma_rule_broken(offset)


# -- check_softmax_backward and check_add_into: the second and third exercises ---------------


def _softmax_with_backward(name: str, mistake: str = "", saved: str = "output", register=True):
    """lesson08::softmax as the learner registers it, and a backward operator named `name`
    with one mistake, registered on it unless `register` is False."""
    forward = _operator_named("lesson08::softmax", lambda x: x.new_empty(x.shape))

    @custom_op(f"course_tests::{name}", mutates_args=())
    def backward_op(y: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
        return broken.softmax_backward_launch(y, grad_y, mistake)

    backward_op.register_fake(lambda y, grad_y: y.new_empty(y.shape))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0] if saved == "input" else output)

    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        return backward_op(y, grad_y)

    if register:
        forward.register_autograd(backward, setup_context=setup_context)
    return backward_op


def _operator_named(qualname, fake, body=finished_softmax):
    @custom_op(qualname, mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return body(x)

    op.register_fake(fake)
    return op


def test_check_softmax_backward_passes_a_right_backward(capsys):
    assert course_lib.check_softmax_backward(_softmax_with_backward("backward_right")).passed
    assert capsys.readouterr().out.strip() == "✓ softmax_backward: every case passed"


BACKWARD_MISTAKES = [
    ("diagonal", dict(mistake="diagonal"), "backward: 5x37", "only the diagonal"),
    ("no factor y", dict(mistake="no factor y"), "backward: 5x37", "you left out the factor y"),
    ("g's strides", dict(mistake="g read with y's strides"), "grad_y column-major",
     "grad_y arrives with strides of its own"),
    ("input saved", dict(saved="input"), "softmax_op's gradient, eager",
     "read the operator's input x"),
    ("input saved, compiled", dict(saved="input"), "compiled with fullgraph=True",
     "read the operator's input x"),
    ("not registered", dict(register=False), "softmax_op's gradient, eager",
     "register the backward on your forward operator"),
]  # fmt: skip
BACKWARD_HINTS = ["only the diagonal", "the factor y", "strides of its own", "operator's input x",
                  "register the backward"]  # fmt: skip


@pytest.mark.parametrize(
    ("how", "case", "hint"),
    [m[1:] for m in BACKWARD_MISTAKES],
    ids=[m[0] for m in BACKWARD_MISTAKES],
)
def test_check_softmax_backward_names_the_mistake_and_no_other(how, case, hint):
    name = "backward_" + "_".join(f"{k}_{v}" for k, v in how.items()).replace(" ", "_")
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    with pytest.raises(CheckFailed) as info:
        course_lib.check_softmax_backward(_softmax_with_backward(name, **how))
    report = info.value.result.report()
    assert_hint_under(report, case, hint)
    others = [h for h in BACKWARD_HINTS if h not in hint]
    assert not any(h in line for line in report.splitlines() if "hint:" in line for h in others)


def test_check_softmax_backward_grades_an_operator_registered_again_by_its_new_backward(
    monkeypatch, tmp_path
):
    """torch keeps compiled graphs on disk, keyed by Dynamo's graph, which names
    lesson08::softmax but not the backward registered on it: once the learner saves the
    output instead of x and registers again, the compiled case must run the new backward,
    not the graph cached for the mistake. With the caches on, as in a notebook, and
    Inductor compiling (here too: the graph holds only operators, so no C++ is built)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(runtime, "COMPILE_BACKEND", "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with (
        functorch_config.patch(enable_autograd_cache=True),
        inductor_config.patch(fx_graph_cache=True),
    ):
        with pytest.raises(CheckFailed) as info:
            course_lib.check_softmax_backward(
                _softmax_with_backward("backward_fixed_later", saved="input")
            )
        assert_hint_under(info.value.result.report(), "compiled with fullgraph=True",
                          "read the operator's input x")  # fmt: skip
        fixed = _softmax_with_backward("backward_fixed_later")
        assert course_lib.check_softmax_backward(fixed).passed


def test_check_softmax_backward_asks_for_an_operator():
    with pytest.raises(CheckFailed) as info:
        course_lib.check_softmax_backward(broken.softmax_backward_launch)
    assert_hint_under(info.value.result.report(), "backward: 5x37", "@custom_op(")


def _add_into(name: str, mutates_args=("out",)):
    """register_add_into as the learner writes it, under another name."""

    def add_into_impl(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        broken.add_into_launch(x, y, out)

    def register():
        op = custom_op(f"course_tests::{name}", mutates_args=mutates_args)(add_into_impl)
        op.register_fake(lambda x, y, out: None)
        return op

    return register


def test_check_add_into_passes_a_declared_mutation(capsys):
    assert course_lib.check_add_into(_add_into("add_into_right")).passed
    assert capsys.readouterr().out.strip() == "✓ add_into: every case passed"


def test_check_add_into_names_an_undeclared_mutation_where_compiled_code_drops_the_call():
    with pytest.raises(CheckFailed) as info:
        course_lib.check_add_into(_add_into("add_into_undeclared", mutates_args=()))
    report = info.value.result.report()
    for case in ("opcheck", "torch.compile"):
        assert_hint_under(report, case, 'mutates_args=("out",)')
    assert "✓ eager: 1000 elements" in report


def test_check_add_into_names_a_returned_value_and_a_plain_function():
    def returns():
        @custom_op("course_tests::add_into_returns", mutates_args=("out",))
        def op(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            broken.add_into_launch(x, y, out)
            return x.clone()

        op.register_fake(lambda x, y, out: x.new_empty(x.shape))
        return op

    def plain():
        return broken.add_into_launch

    for register, hint in [(returns, "returns nothing"), (plain, "must return the operator")]:
        with pytest.raises(CheckFailed) as info:
            course_lib.check_add_into(register)
        assert_hint_under(info.value.result.report(), "eager: 1 element", hint)


def test_check_add_into_stops_at_an_unwritten_registration():
    def unwritten():
        raise ExerciseNotDone("write register_add_into")

    with pytest.raises(ExerciseNotDone, match="write register_add_into"):
        course_lib.check_add_into(unwritten)
