"""The project's import graph: no cycles, and harness/ has a floor and a roof.

Every module of oracle/, cases/, harness/ and backends/ is parsed with `ast`; each `import`
and `from ... import` in it, at module level or inside a function, that names a project
module is an edge.  `import a.b.c` (or `from a.b import c`) also runs the packages a and a.b
first, so it is an edge to each of them too, except to the importing module's own enclosing
packages, which are always loaded before it runs.  An explicit import of an enclosing
package (`import cases` in cases/registry.py) is a real edge.  Imports done by name at run
time (importlib, entry points: the registries' discovery of ops and backends) are plugins,
not edges.

The layers of harness/ (LAYERS): a module may import modules of its own layer or below,
never above.  Core (the floor: registries, dtypes, tensors, comparison, frameworks,
statuses, result rows) imports nothing else of the project but the oracle's JAX setup; the
drivers (the roof: run, bench, isolate, sanitize, many GPUs, the CLIs, reports) sit on top.
A new harness module must be given a layer here.

    python tests/test_import_graph.py      prints the graph's cycles and layer breaches
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oracle", "cases", "harness", "backends")

CORE, MIDDLE, DRIVER = 0, 1, 2
LAYERS = {
    # the floor: registries, dtypes, host tensors, comparison, frameworks, statuses, result rows
    "harness": CORE, "harness.registry": CORE, "harness.dtypes": CORE, "harness.tensors": CORE,
    "harness.compare": CORE, "harness.frameworks": CORE, "harness.status": CORE, "harness.results": CORE,
    # checking and measuring one call: argument rules, guards, timing, preparation, selection, the runner,
    # the exact-arithmetic input set
    "harness.argcheck": MIDDLE, "harness.guards": MIDDLE, "harness.cuda_errors": MIDDLE, "harness.timing": MIDDLE,
    "harness.ceilings": MIDDLE, "harness.prepared": MIDDLE, "harness.stress": MIDDLE, "harness.prepare": MIDDLE,
    "harness.selection": MIDDLE, "harness.runner": MIDDLE, "harness.fuzz": MIDDLE, "harness.exact": MIDDLE,
    # the roof: the commands and the drivers behind them
    "harness.__main__": DRIVER, "harness.cli": DRIVER, "harness.bench": DRIVER, "harness.bench_cli": DRIVER,
    "harness.isolate": DRIVER, "harness.sanitize": DRIVER, "harness.profile": DRIVER, "harness.mutate": DRIVER,
    "harness.describe": DRIVER, "harness.merge": DRIVER, "harness.run_report": DRIVER,
}
PACKAGE_LAYERS = {"harness.report": DRIVER, "harness.multi_gpu": DRIVER}  # every module of the package
# Outside harness/, what core may reach: the oracle's JAX import (x64 on, no GPU memory grabbed), and
# the roots of the packages whose modules the registries discover and import by name.
CORE_MAY_IMPORT = {"oracle", "oracle.jax_setup", "backends"}


def layer(module: str) -> int | None:
    """The layer of a harness module (LAYERS, or the package in PACKAGE_LAYERS it belongs to); None: none given."""
    if module in LAYERS:
        return LAYERS[module]
    return next((v for pkg, v in PACKAGE_LAYERS.items() if module == pkg or module.startswith(pkg + ".")), None)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the project's packages (a package as its __init__)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict) -> bool:
    return modules[name].name == "__init__.py"


def _targets(node, module: str, modules: dict) -> list[str]:
    """The project modules one import statement names (the deepest existing module of each name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against the importing module's package
            pkg = module.split(".") if _is_package(module, modules) else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for name in names:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts:
            found.append(".".join(parts))
    return found


def edges(modules: dict | None = None) -> dict[str, set[str]]:
    """module -> the project modules it imports (module level and inside functions)."""
    modules = project_modules() if modules is None else modules
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        own = {".".join(module.split(".")[:k]) for k in range(1, module.count(".") + 1)}  # enclosing packages
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, modules):
                if target != module:
                    graph[module].add(target)  # explicit, even when it is an enclosing package
                parts = target.split(".")
                for k in range(1, len(parts)):  # the packages `import a.b.c` runs first
                    parent = ".".join(parts[:k])
                    if parent not in own and parent != module and parent in modules:
                        graph[module].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_path(graph: dict, component: list[str]) -> list[str]:
    """One cycle through the component's first module, for the message: [a, b, ..., a]."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component


def layer_breaches(graph: dict) -> list[str]:
    """Each harness import that goes up a layer, core imports outside CORE_MAY_IMPORT, unlayered modules."""
    out = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("harness"):
            continue
        mine = layer(module)
        if mine is None:
            out.append(f"{module} has no layer in tests/test_import_graph.py LAYERS")
            continue
        for t in sorted(targets):
            theirs = layer(t) if t.startswith("harness") else None
            if theirs is not None and theirs > mine:
                out.append(f"{module} (layer {mine}) imports {t} (layer {theirs})")
            elif mine == CORE and not t.startswith("harness") and t not in CORE_MAY_IMPORT:
                out.append(f"{module} (core) imports {t}, outside harness/")
    return out


# ----------------------------------------------------------------------------- the tests


def test_every_project_module_parses_and_is_in_the_graph():
    graph = edges()
    assert {"harness.registry", "harness.cli", "oracle.binary_backward", "cases.registry"} <= set(graph)
    assert "harness.registry" in graph["oracle.binary_backward"]  # a module-level edge is seen


def test_function_level_and_relative_imports_are_edges(tmp_path):
    """The parser finds imports inside functions, resolves relative ones, and adds the packages
    a dotted import runs first; an edge into the importer's own package is not added."""
    pkg = tmp_path / "harness"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from harness import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("import harness.a\n")
    for other in PACKAGES[:-1]:
        if other != "harness":
            (tmp_path / other).mkdir()
    (tmp_path / "backends").mkdir()
    modules = project_modules(tmp_path)
    graph = edges(modules)
    assert graph["harness.a"] == {"harness.b"} and graph["harness.b"] == {"harness.c"}
    assert graph["harness.c"] == {"harness.a"}
    assert cycles(graph) == [["harness.a", "harness.b", "harness.c"]]


def test_no_import_cycles():
    graph = edges()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle_path(graph, c)) for c in found)


def test_harness_layers_floor_and_roof():
    breaches = layer_breaches(edges())
    assert not breaches, "harness layers broken:\n" + "\n".join(breaches)


if __name__ == "__main__":
    g = edges()
    for c in cycles(g):
        print("cycle:", " -> ".join(cycle_path(g, c)), f"({len(c)} modules: {', '.join(c)})")
    for b in layer_breaches(g):
        print("layer:", b)
    sys.exit(0)
