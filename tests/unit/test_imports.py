"""No import cycles among the package's modules and the checkout's scripts, read from their source (ast).

Counted: every import that runs, at the top of a module or inside a function: moving an import into a
function is how a cycle is usually hidden, not broken, and the two modules still need each other. Not
counted: imports under `if TYPE_CHECKING:`, which never run, and imports of modules outside the package and
the scripts. `from package import name` counts as importing package.name when that is a module here, else
as importing the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

SCRIPTS = ("run_qa.py", "trainer_qa.py", "utils_qa.py", "score_squad.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Module name -> file, for every module of qa_hpc/ and the scripts."""
    files = sorted((REPO / "qa_hpc").rglob("*.py")) + [REPO / script for script in SCRIPTS]
    return {module_name(path): path for path in files}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_that_run(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those in the body of `if TYPE_CHECKING:`."""
    found = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in imports_that_run(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in known else base)
    return targets & known


def import_graph() -> dict[str, set[str]]:
    modules = sources()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (Tarjan's strongly connected
    components), as the path a -> b -> ... -> a."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                lowlink[module] = min(lowlink[module], lowlink[target])
            elif target in on_stack:
                lowlink[module] = min(lowlink[module], index[target])
        if lowlink[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [path_around(group, graph) for group in groups]


def path_around(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest way from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module] & group):
                if target == start:
                    return paths[module] + [start]
                if target not in paths:
                    paths[target] = paths[module] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no way around {sorted(group)}")


def test_imports_are_read_at_any_depth_but_not_under_type_checking(tmp_path: Path) -> None:
    module = tmp_path / "mod.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "from pkg import sub, function\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    import pkg.hidden\n"
        "else:\n"
        "    import pkg.shown\n"
        "def later():\n"
        "    import pkg.late\n"
    )
    known = {"pkg", "pkg.sub", "pkg.sibling", "pkg.hidden", "pkg.shown", "pkg.late"}
    imported = imported_modules("pkg.mod", module, known)
    assert imported == {"pkg.sub", "pkg", "pkg.sibling", "pkg.shown", "pkg.late"}


def test_the_graph_holds_the_package_and_the_scripts() -> None:
    graph = import_graph()
    scripts = {Path(script).stem for script in SCRIPTS}
    assert {"qa_hpc", "qa_hpc.tools.report", "qa_hpc.metric.squad", *scripts} <= set(graph)
    # inside a function: features.py loads qa_hpc.model only to read a hub dataset
    assert "qa_hpc.model" in graph["qa_hpc.features"]
    # features.py names qa_hpc.flags under `if TYPE_CHECKING:` only
    assert "qa_hpc.flags" not in graph["qa_hpc.features"]


def test_a_cycle_is_found_and_named() -> None:
    # e names itself: no cycle between modules
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    named = "; ".join(" -> ".join(cycle) for cycle in found)
    assert not found, f"import cycles: {named}"
