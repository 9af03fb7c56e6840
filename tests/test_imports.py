"""The library's import graph, read from its source: no circle, no arrow from a lower
layer up to a higher one (the finished kernels import neither the benchmark nor the
checkers, the grader or the builder), and Triton's internals reached from one module."""

import ast
from pathlib import Path

import course_lib

ROOT = Path(course_lib.__file__).parent

# the layers, lowest first: a module may import its own layer's and those below
LAYERS = [
    ("course_lib.runtime", "course_lib.triton_internals", "course_lib.interpreter_guard",
     "course_lib.gpu_rules", "course_lib.gpu_timer", "course_lib.references",
     "course_lib.recordings"),
    ("course_lib.kernels",),
    ("course_lib.ops",),
    ("course_lib.bench", "course_lib.figures", "course_lib.checks"),
    ("course_lib.grader", "course_lib.builder", "course_lib"),
]  # fmt: skip


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(path: Path, modules: dict) -> set[str]:
    """The course_lib modules that `path` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return {name for name in found if name in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    """The layer of a module: that of the longest prefix the table names; a package's
    __main__, a command, stands above them all."""
    if module.endswith(".__main__"):
        return len(LAYERS)
    best, rank = "", None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, rank = name, i
    assert rank is not None, f"{module} is in no layer: add it to LAYERS"
    return rank


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by a depth-first walk (each reported once, from where it closed).
    A package's __init__ is left out: importing a submodule runs it, but it is not what
    the submodule depends on."""
    packages = {name for name in graph if (ROOT.parent / name.replace(".", "/")).is_dir()}
    circles, state = [], {}

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module] - packages):
            if state.get(target) == "open":
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = "done"

    for module in sorted(set(graph) - packages):
        if module not in state:
            walk(module, [module])
    return circles


def test_the_import_graph_has_no_circle():
    assert _circles(_graph()) == []


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def test_the_walk_sees_circles_and_upward_imports():
    # the checks above can fail: a made-up graph with both mistakes is caught
    graph = {
        "course_lib.kernels.a": {"course_lib.kernels.b"},
        "course_lib.kernels.b": {"course_lib.kernels.a", "course_lib.bench.timing"},
        "course_lib.bench.timing": set(),
    }
    assert _circles(graph) == [
        ["course_lib.kernels.a", "course_lib.kernels.b", "course_lib.kernels.a"]
    ]
    assert _layer("course_lib.bench.timing") > _layer("course_lib.kernels.b")
    # and the graph read from the source is not empty: matmul imports its fast paths
    assert "course_lib.kernels.matmul_fast_paths" in _graph()["course_lib.kernels.matmul"]


# Triton's internal modules, which only the adapter imports or reaches through attributes;
# a name that starts with "_" anywhere under `triton` counts as internal too
TRITON_INTERNALS = ("triton.runtime", "triton.compiler", "triton.backends", "triton.tools",
                    "triton.knobs", "triton.language.core")  # fmt: skip
TRITON_ADAPTER = "course_lib.triton_internals"


def _triton_internals_reached(source: str) -> list[str]:
    """Each place in `source` that names one of Triton's internals: an import, or an
    attribute path through an imported name (`triton.runtime.driver`, `tl.core.tensor`)."""
    tree = ast.parse(source)
    named, aliases = [], {}  # (line, dotted name); local name -> what it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                named.append((node.lineno, alias.name))
                local = alias.asname or alias.name.split(".")[0]
                aliases[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                named.append((node.lineno, f"{node.module}.{alias.name}"))
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        path = []
        while isinstance(node, ast.Attribute):
            path.insert(0, node.attr)
            node = node.value
        if path and isinstance(node, ast.Name) and node.id in aliases:
            named.append((node.lineno, ".".join([aliases[node.id], *path])))
    return sorted({f"line {line}: {name}" for line, name in named if _internal(name)})


def _internal(name: str) -> bool:
    parts = name.split(".")
    private = any(p.startswith("_") and not p.endswith("__") for p in parts)  # not __file__
    inside = any(name == m or name.startswith(m + ".") for m in TRITON_INTERNALS)
    return parts[0] == "triton" and (private or inside)


def test_only_the_adapter_reaches_into_tritons_internals():
    reached = {
        module: found
        for module, path in _modules().items()
        if module != TRITON_ADAPTER and (found := _triton_internals_reached(path.read_text()))
    }
    assert reached == {}, "import them from course_lib.triton_internals instead"


def test_the_search_for_tritons_internals_finds_them():
    # the check above can fail: each way in below is found, the public names are not
    source = (
        "import triton\n"
        "import triton.language as tl\n"
        "from triton import knobs\n"
        "from triton.runtime.jit import JITFunction\n"
        "import triton.compiler.errors as errors\n"
        "def f():\n"
        "    from triton._C.libtriton import ir\n"
        "    return triton.runtime.driver.active, tl.core.tensor\n"
        "public = triton.jit, triton.cdiv, tl.float32, tl.math.exp, triton.__file__\n"
    )
    assert _triton_internals_reached(source) == [
        "line 3: triton.knobs",
        "line 4: triton.runtime.jit.JITFunction",
        "line 5: triton.compiler.errors",
        "line 7: triton._C.libtriton.ir",
        "line 8: triton.language.core",
        "line 8: triton.language.core.tensor",
        "line 8: triton.runtime",
        "line 8: triton.runtime.driver",
        "line 8: triton.runtime.driver.active",
    ]
    # and the adapter is where they are
    assert len(_triton_internals_reached((ROOT / "triton_internals.py").read_text())) > 5
