"""Citations name documents that are in the repository.

The project cites its own documents (WIRE.md, BRIDGE.md, README.md,
SECURITY.md, docs/interop.md, docs/clientrpc.md) or public sources by name
(the Go reference, karamble/brmcp, e.g. ``server/harness.go``; bisonrelay's
``clientrpc`` package; the MCP Python SDK), never the reference fact sheets
kept outside the repository. These tests read every tracked text file and
fail naming each offending ``path:line``, and check that ``<doc> §Section``
citations name a heading that exists.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

from tests.kit.paths import REPO

ROOT = REPO

#: The out-of-repository fact sheets, spelled in pieces so that this file
#: does not cite them itself. ``docs/clientrpc.md`` is the repository's own
#: document and is not one of them.
REFERENCE_SHEETS: tuple[str, ...] = tuple(
    name + ".md"
    for name in ("go-brmcp", "clientrpc", "mcp-python-sdk-2", "peers", "real-bison-relay", "tooling-notes")
)
#: A sheet's name, alone or at the end of a path, but not inside a longer file
#: name and not the repository's own ``docs/`` document of the same name.
_SHEET = re.compile(
    r"(?<![\w.-])(?<!docs/)(" + "|".join(re.escape(name) for name in REFERENCE_SHEETS) + r")(?!\w)"
)

#: Files whose citations are being replaced by the engineers working on them
#: (a path, or a folder ending in "/"). The lead empties this list once those
#: edits have landed; nothing else may cite a sheet.
ALLOWED: tuple[str, ...] = ()

#: Folders never scanned when the tree is walked without git.
_SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    ".tools",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "dist",
}

#: Documents whose sections are cited as ``<name> §Section``.
_DOCUMENTS = {
    "WIRE.md": "WIRE.md",
    "BRIDGE.md": "BRIDGE.md",
    "SECURITY.md": "SECURITY.md",
    "README.md": "README.md",
    "README": "README.md",
    "docs/interop.md": "docs/interop.md",
    "docs/clientrpc.md": "docs/clientrpc.md",
}
_CITATION = re.compile(
    r"(?<![\w/])(WIRE\.md|BRIDGE\.md|SECURITY\.md|README\.md|README|docs/interop\.md|docs/clientrpc\.md)"
    r"[ \t]+(§[^,;)\n\"]+(?:,[ \t]*§[^,;)\n\"]+)*)"
)


def _tracked_files() -> list[str]:
    """Paths relative to ROOT: git's tracked files, or (outside a git
    checkout) every file under ROOT except caches and virtualenvs."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8", "surrogateescape")
        return [name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        found = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
        return found


def _text_files() -> Iterator[tuple[str, str]]:
    """(path, text) of every tracked regular file that is text (no NUL byte)."""
    for name in _tracked_files():
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        yield name.replace(os.sep, "/"), data.decode("utf-8", "replace")


def _allowed(name: str) -> bool:
    return any(name.startswith(entry) if entry.endswith("/") else name == entry for entry in ALLOWED)


def _headings(document: str) -> list[str]:
    text = (ROOT / document).read_text(encoding="utf-8")
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,4} ", line)]


def _names_a_heading(cited: str, headings: list[str]) -> bool:
    """``§Payments``, ``§Settings`` (for "Settings: `mcpclient.json`"),
    ``§Parsing rule 7``, ``§5`` (for "5. A crash") and ``§callKey, across
    restarts`` all name a heading: the cited text starts with a heading (or
    the part of one before a colon), or a heading starts with it."""
    for heading in headings:
        short = heading.split(":")[0]
        for prefix in (heading, short):
            if cited == prefix or cited.startswith((prefix + " ", prefix + ":")):
                return True
        if heading.startswith(cited):
            return True
    return False


def _sheet_citations(text: str) -> list[str]:
    """The out-of-repository sheets ``text`` names, in order."""
    return [match.group(1) for match in _SHEET.finditer(text)]


def test_no_file_cites_the_out_of_repository_reference_sheets() -> None:
    offending = [
        f"{name}:{number}: {line.strip()}"
        for name, text in _text_files()
        if not _allowed(name)
        for number, line in enumerate(text.splitlines(), start=1)
        if _sheet_citations(line)
    ]
    assert not offending, (
        f"{len(offending)} citation(s) of {', '.join(REFERENCE_SHEETS)}, which are not in the "
        "repository; cite WIRE.md, BRIDGE.md, README.md, SECURITY.md, docs/interop.md, "
        "docs/clientrpc.md or a public source by name (karamble/brmcp `path/file.go`, bisonrelay's "
        "`clientrpc` package, the MCP Python SDK) instead:\n" + "\n".join(offending)
    )


def test_the_sheet_pattern_tells_sheets_from_our_documents() -> None:
    """Each sheet is caught, bare, after a path or in a sentence; our
    ``docs/clientrpc.md`` and longer names that merely end like a sheet are not."""
    for sheet in REFERENCE_SHEETS:
        assert _sheet_citations(f"(see {sheet} §4.4)") == [sheet]
        assert _sheet_citations(f"../shared/reference/{sheet}") == [sheet]
        assert _sheet_citations(f"my-{sheet}, x{sheet}, {sheet[:-3]}.mdx") == []
    clientrpc = REFERENCE_SHEETS[1]
    assert _sheet_citations(f"(docs/{clientrpc} §Streams)") == []
    assert _sheet_citations(f"docs/{clientrpc} and {clientrpc}") == [clientrpc]


def test_the_scan_sees_the_files_that_cite_documents() -> None:
    """The scan reads the code, tests and documents (a broken file listing
    would make the test above pass vacuously)."""
    names = {name for name, _ in _text_files()}
    assert {"WIRE.md", "BRIDGE.md", "brmcp/protocol/payment.py", "tests/conftest.py"} <= names


def test_section_citations_name_existing_headings() -> None:
    headings = {document: _headings(path) for document, path in _DOCUMENTS.items()}
    unknown = []
    for name, text in _text_files():
        for match in _CITATION.finditer(text):
            if text[max(0, match.start() - 2) : match.start()] == "``":
                continue  # a literal example of the citation form, not a citation
            for ref in re.split(r",[ \t]*", match.group(2)):
                cited = ref.lstrip("§").strip().strip("`").rstrip(".: ")
                if not _names_a_heading(cited, headings[match.group(1)]):
                    number = text.count("\n", 0, match.start()) + 1
                    unknown.append(f"{name}:{number}: {match.group(1)} §{cited}")
    assert not unknown, "citations of sections that do not exist:\n" + "\n".join(unknown)
