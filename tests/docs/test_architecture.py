"""docs/architecture.md's tables are the import rules, checked on the code.

* the layer table ("## Layers"): every module of a package imports only brmcp
  packages its row allows, and every edge a row allows is one the code has
  (the table is the graph, not a superset of it);
* the room table ("## Rooms of the bridge"): a room of ``brmcp.bridge``
  imports only rooms of a lower rank;
* no import circle among brmcp's modules;
* no module over :data:`MAX_LINES` lines, no folder of more than
  :data:`MAX_MODULES` modules;
* no module imports a ``_name`` of another module;
* nothing in brmcp/ imports examples/ or tests/.

Imports inside functions and ``TYPE_CHECKING`` blocks count: they are
dependencies all the same, only later.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.kit.paths import REPO

DOC = REPO / "docs" / "architecture.md"
LIBRARY = REPO / "brmcp"
#: The longest a module may be (lines), and the most modules one folder may hold.
MAX_LINES = 600
MAX_MODULES = 20


@dataclass(frozen=True)
class Import:
    """One imported name: ``module`` is the brmcp (or other) module it resolves
    to, ``name`` the name taken from it (None for ``import x`` or a submodule)."""

    module: str
    name: str | None
    line: int


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _table(title: str) -> list[list[str]]:
    """The rows of the first table under ``## title``, each a list of cells."""
    rows = []
    for line in _section(title).splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]  # the header


def _allowed() -> dict[str, set[str]]:
    """``{package: packages it may import}`` from the table under "## Layers"."""
    rows: dict[str, set[str]] = {}
    for cells in _table("Layers"):
        if len(cells) < 3 or not cells[0].startswith("`brmcp"):
            continue
        package = re.findall(r"`([\w.]+)`", cells[0])[0].removeprefix("brmcp").removeprefix(".")
        allowed = set(re.findall(r"`([\w.]+)`", cells[2]))
        rows[package or "(root)"] = {a.removeprefix("brmcp.") for a in allowed}
    return rows


def _ranks() -> dict[str, int]:
    """``{room: rank}`` from the table under "## Rooms of the bridge" (rank 1 lowest)."""
    ranks: dict[str, int] = {}
    for cells in _table("Rooms of the bridge"):
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        for room in re.findall(r"`([\w.]+)`", cells[1]):
            ranks[room.removeprefix("brmcp.bridge.").removesuffix(".py")] = int(cells[0])
    return ranks


@cache
def _modules() -> dict[str, Path]:
    """``{dotted module name: file}`` of brmcp (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in LIBRARY.rglob("*.py"):
        if "gosrc" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def _imports(module: str) -> tuple[Import, ...]:
    """What ``module`` imports, anywhere in it; ``from pkg import sub`` resolves to
    the submodule when ``sub`` is one."""
    modules = _modules()
    path = modules[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    found.append(Import(sub, None, node.lineno))
                else:
                    found.append(Import(base, alias.name, node.lineno))
    return tuple(found)


def _owner(target: str) -> str | None:
    """The brmcp module a dotted import names (its longest known prefix), or None."""
    modules = _modules()
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in _modules():
        edges = {_owner(i.module) for i in _imports(module) if i.module.startswith("brmcp")}
        graph[module] = {e for e in edges if e and e != module}
    return graph


def _package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__", "_compat", "__version__"):
        return "(root)"
    return parts[1]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_the_table_names_every_package() -> None:
    allowed = _allowed()
    packages = {p.name for p in LIBRARY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages | {"(root)"} <= set(allowed), sorted(packages - set(allowed))


def _package_edges() -> dict[tuple[str, str], str]:
    """``{(importer package, imported package): one example}`` across brmcp."""
    edges: dict[tuple[str, str], str] = {}
    for module in _modules():
        mine = _package_of(module)
        for imp in _imports(module):
            if not imp.module.startswith("brmcp") or imp.module == "brmcp.__version__":
                continue  # the version string is everyone's
            if imp.module == "brmcp" and imp.name == "__version__":
                continue
            theirs = _package_of(imp.module)
            if theirs != mine:
                edges.setdefault((mine, theirs), f"{module}:{imp.line} imports {imp.module}")
    return edges


def test_every_import_follows_the_layer_table() -> None:
    allowed = _allowed()
    wrong = [
        f"{example} ({mine} may not import {theirs})"
        for (mine, theirs), example in _package_edges().items()
        if theirs not in allowed.get(mine, set())
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_layer_table_allows_only_edges_the_code_has() -> None:
    """A row allowing what no module imports would let a new arrow in unseen."""
    edges = set(_package_edges())
    stale = [
        f"{mine} -> {theirs}"
        for mine, theirs_all in _allowed().items()
        for theirs in theirs_all
        if (mine, theirs) not in edges
    ]
    assert not stale, "remove from docs/architecture.md ## Layers:\n" + "\n".join(sorted(stale))


def test_no_import_circle() -> None:
    circles = _circles(_graph())
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def _room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["brmcp", "bridge"] or len(parts) == 2:
        return None  # the package's own surface re-exports every room
    if len(parts) == 3 and parts[2] == "__main__":
        return "cli"  # ``python -m brmcp.bridge`` is the command
    return parts[2] if len(parts) > 3 or (LIBRARY / "bridge" / parts[2]).is_dir() else "_bridge"


def test_the_rooms_of_the_bridge_import_only_downward() -> None:
    ranks = _ranks()
    rooms = {p.name for p in (LIBRARY / "bridge").iterdir() if (p / "__init__.py").exists()}
    assert rooms | {"_bridge"} <= set(ranks), sorted(rooms - set(ranks))
    wrong = []
    for module, targets in _graph().items():
        mine = _room_of(module)
        if mine is None:
            continue
        for target in targets:
            theirs = _room_of(target)
            if theirs is None and target == "brmcp.bridge":
                wrong.append(f"{module} imports brmcp.bridge (a room imports rooms, not the surface)")
            elif theirs is not None and theirs != mine and ranks[theirs] >= ranks[mine]:
                wrong.append(f"{module} ({mine}, rank {ranks[mine]}) imports {target} (rank {ranks[theirs]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_is_too_long() -> None:
    long = []
    for path in _modules().values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not long, f"over {MAX_LINES} lines:\n" + "\n".join(sorted(long))


def test_no_folder_is_too_full() -> None:
    full = []
    for folder in {p.parent for p in _modules().values()}:
        count = len(list(folder.glob("*.py")))
        if count > MAX_MODULES:
            full.append(f"{folder.relative_to(REPO)}: {count} modules")
    assert not full, f"more than {MAX_MODULES} modules:\n" + "\n".join(sorted(full))


def test_no_module_imports_another_modules_private_names() -> None:
    """A ``_name`` is its module's own; a package's surface is what its ``__init__`` exports."""
    wrong = []
    for module in _modules():
        for imp in _imports(module):
            name = imp.name
            if name is None or not name.startswith("_") or name.startswith("__"):
                continue
            if imp.module.startswith("brmcp"):
                wrong.append(f"{module}:{imp.line} imports {name} from {imp.module}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_library_never_imports_examples_or_tests() -> None:
    for module in _modules():
        for imp in _imports(module):
            top = imp.module.split(".")[0]
            assert top not in {"examples", "tests", "brmcp_serve"}, f"{module} imports {imp.module}"
