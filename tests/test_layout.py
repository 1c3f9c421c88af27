"""The house's structure, checked: no import cycles (an import inside a function or under
TYPE_CHECKING counts: it only hides the cycle), arrows one way between the packages, argparse
only in the command-line layers, modules of a few hundred lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("microbench", "calibration", "pdlsim")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)  # a package's own __init__ is not an edge from inside it
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "package, never",
    [("microbench", ("calibration", "pdlsim")), ("calibration", ("pdlsim",))],
)
def test_arrows_go_one_way(package, never):
    """microbench runs on a cluster alone; calibration never imports the simulator."""
    bad = {
        (name, target)
        for name, targets in _graph().items()
        if name.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in never
    }
    assert bad == set()


def _imports_argparse(path: Path) -> bool:
    return any(
        isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_argparse_only_in_the_command_line_layers():
    # microbench.options: the argparse actions both command lines register
    allowed = ("pdlsim.cli", "microbench.cli", "microbench.commands", "microbench.__main__",
               "microbench.options")  # fmt: skip
    users = {name for name, path in _modules().items() if _imports_argparse(path)}
    assert {n for n in users if not n.startswith(allowed)} == set()
