"""docs/architecture.md's layer table is the import rule: every module of a
package imports only brmcp packages its row allows (lazy imports inside
functions too), and nothing in brmcp/ imports examples/ or tests/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.kit.paths import REPO

DOC = REPO / "docs" / "architecture.md"
LIBRARY = REPO / "brmcp"


def _allowed() -> dict[str, set[str]]:
    """``{package: packages it may import}`` from the table under "## Layers"."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`brmcp"):
            continue
        package = re.findall(r"`([\w.]+)`", cells[0])[0].removeprefix("brmcp").removeprefix(".")
        allowed = set(re.findall(r"`([\w.]+)`", cells[2]))
        rows[package or "(root)"] = {a.removeprefix("brmcp.") for a in allowed}
    return rows


def _package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__", "_compat", "__version__"):
        return "(root)"
    return parts[1]


def _imports(path: Path) -> set[str]:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        base = parts
    else:
        base = parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(anchor + ([node.module] if node.module else []))
                found.update([target] if node.module else [f"{target}.{a.name}" for a in node.names])
            elif node.module:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _modules() -> list[Path]:
    return [p for p in LIBRARY.rglob("*.py") if "gosrc" not in p.parts]


def test_the_table_names_every_package() -> None:
    allowed = _allowed()
    packages = {p.name for p in LIBRARY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages | {"(root)"} <= set(allowed), sorted(packages - set(allowed))


def test_every_import_follows_the_layer_table() -> None:
    allowed = _allowed()
    wrong: list[str] = []
    for path in _modules():
        rel = ".".join(path.relative_to(REPO).with_suffix("").parts)
        mine = _package_of(rel.removesuffix(".__init__"))
        for target in _imports(path):
            if not target.startswith("brmcp") or target == "brmcp.__version__":
                continue  # the version string is everyone's
            theirs = _package_of(target)
            if theirs != mine and theirs not in allowed.get(mine, set()):
                wrong.append(f"{path.relative_to(REPO)} imports {target} ({mine} may not import {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_library_never_imports_examples_or_tests() -> None:
    for path in _modules():
        for target in _imports(path):
            top = target.split(".")[0]
            assert top not in {"examples", "tests", "brmcp_serve"}, f"{path} imports {target}"
