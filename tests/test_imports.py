"""The library's import graph, read from its source: no circle, and no arrow from a lower
layer up to a higher one (the finished kernels import neither the benchmark nor the
checkers, the grader or the builder)."""

import ast
from pathlib import Path

import course_lib

ROOT = Path(course_lib.__file__).parent

# the layers, lowest first: a module may import its own layer's and those below
LAYERS = [
    ("course_lib.runtime", "course_lib.interpreter_guard", "course_lib.gpu_rules",
     "course_lib.gpu_timer", "course_lib.references", "course_lib.recordings"),
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
