"""Run the pinned MCP conformance suite (server mode) and judge it against
the baseline.

The suite (``@modelcontextprotocol/conformance`` 0.1.16) runs each server
scenario as a fresh MCP client against one URL and writes each scenario's
checks to ``<output>/server-<scenario>-<timestamp>/checks.json``. A scenario
*fails* when any check is ``FAILURE`` or ``WARNING`` (the suite's own rule for
``--expected-failures``). The baseline (``baseline.yml``) uses the suite's
expected-failures format: a ``server:`` list of scenario names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from .nodetools import NodeTools

__all__ = [
    "BASELINE",
    "SPEC_VERSION",
    "SUITE",
    "ScenarioResult",
    "SuiteReport",
    "load_baseline",
    "parse_baseline",
    "run_suite",
]

BASELINE = Path(__file__).with_name("baseline.yml")
#: Scenarios up to this spec version (cumulative); the bridge speaks the handshake era.
SPEC_VERSION = "2025-11-25"
#: "all" adds the pending scenarios (json-schema-2020-12, server-sse-polling) to "active".
SUITE = "all"
#: Limit for the whole suite run (seconds); it normally takes well under a minute.
RUN_TIMEOUT = 240.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


def parse_baseline(text: str) -> list[str]:
    """Scenario names listed under ``server:`` in the suite's
    expected-failures YAML (comments allowed; the subset the baseline
    uses: one top-level key, one ``- name`` item per line). Raises
    ValueError for anything else, so a typo cannot silently empty it."""
    names: list[str] = []
    section: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith((" ", "\t", "-")):
            key, sep, rest = line.partition(":")
            if not sep or rest.strip():
                raise ValueError(f"baseline line {number}: expected 'server:' or 'client:', got {raw!r}")
            section = key.strip()
            if section not in ("server", "client"):
                raise ValueError(f"baseline line {number}: unknown section {section!r}")
            continue
        item = line.strip()
        if not item.startswith("- ") or section is None:
            raise ValueError(f"baseline line {number}: expected '- <scenario>', got {raw!r}")
        name = item[2:].strip().strip("'\"")
        if not re.fullmatch(r"[a-z0-9][a-z0-9/_:.-]*", name):
            raise ValueError(f"baseline line {number}: bad scenario name {name!r}")
        if section == "server":
            if name in names:
                raise ValueError(f"baseline line {number}: {name!r} listed twice")
            names.append(name)
    return names


def load_baseline(path: Path = BASELINE) -> list[str]:
    return parse_baseline(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's checks, counted by status."""

    scenario: str
    passed: int
    failed: int
    warnings: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.warnings == 0


@dataclass
class SuiteReport:
    """The suite's verdicts compared with the baseline."""

    results: dict[str, ScenarioResult]
    baseline: list[str]
    exit_code: int
    output: str
    missing: list[str] = field(default_factory=list)

    @property
    def passing(self) -> list[str]:
        return [name for name, result in self.results.items() if result.ok]

    @property
    def failing(self) -> list[str]:
        return [name for name, result in self.results.items() if not result.ok]

    @property
    def new_failures(self) -> list[str]:
        """Failing scenarios the baseline does not list."""
        return [name for name in self.failing if name not in self.baseline]

    @property
    def stale(self) -> list[str]:
        """Baseline entries whose scenario now passes (or no longer runs)."""
        return [name for name in self.baseline if name not in self.failing]

    def table(self) -> str:
        """A plain-text results table plus the totals and baseline verdict."""
        width = max((len(name) for name in self.results), default=8)
        lines = [f"{'scenario':<{width}}  verdict   checks (pass/fail/warn)"]
        for name, result in self.results.items():
            if result.ok:
                verdict = "pass"
            elif name in self.baseline:
                verdict = "expected"
            else:
                verdict = "FAIL"
            counts = f"{result.passed}/{result.failed}/{result.warnings}"
            lines.append(f"{name:<{width}}  {verdict:<8}  {counts}")
        checks = sum(r.passed for r in self.results.values())
        lines.append("")
        lines.append(
            f"scenarios: {len(self.passing)} of {len(self.results)} pass; "
            f"{len(self.failing)} fail ({len(self.failing) - len(self.new_failures)} in the baseline); "
            f"checks passed: {checks}"
        )
        if self.new_failures:
            lines.append("NEW failures (not in baseline.yml):")
            for name in self.new_failures:
                lines.append(f"  {name}: " + "; ".join(self.results[name].problems))
        if self.stale:
            lines.append(
                "baseline entries that now pass (remove them from baseline.yml): " + ", ".join(self.stale)
            )
        if self.missing:
            lines.append("scenarios without results: " + ", ".join(self.missing))
        return "\n".join(lines)


def _load_results(output_dir: Path) -> dict[str, ScenarioResult]:
    results: dict[str, ScenarioResult] = {}
    for path in sorted(output_dir.glob("*/checks.json")):
        match = _DIR.match(path.parent.name)
        if match is None:
            continue
        checks = json.loads(path.read_text(encoding="utf-8"))
        statuses = [str(check.get("status")) for check in checks]
        problems = tuple(
            f"{check.get('id')}: {check.get('errorMessage') or check.get('description')}"
            for check in checks
            if check.get("status") in ("FAILURE", "WARNING")
        )
        scenario = match.group("scenario")
        results[scenario] = ScenarioResult(
            scenario=scenario,
            passed=statuses.count("SUCCESS"),
            failed=statuses.count("FAILURE"),
            warnings=statuses.count("WARNING"),
            problems=problems,
        )
    return results


async def _scenario_names(tools: NodeTools) -> list[str]:
    assert tools.conformance is not None
    done = await anyio.run_process(
        [str(tools.node), str(tools.conformance), "list", "--server", "--spec-version", SPEC_VERSION],
        check=True,
    )
    names = re.findall(r"^\s+- (\S+)", done.stdout.decode(), flags=re.MULTILINE)
    if not names:
        raise RuntimeError("the conformance suite listed no server scenarios")
    return names


async def run_suite(
    tools: NodeTools,
    url: str,
    output_dir: Path,
    *,
    baseline_path: Path = BASELINE,
    scenario: str | None = None,
    limit: float = RUN_TIMEOUT,
) -> SuiteReport:
    """Run the suite against ``url`` (all server scenarios up to
    :data:`SPEC_VERSION`, or one ``scenario``) and compare with the
    baseline. Raises TimeoutError after ``limit`` seconds (the suite is
    killed) and RuntimeError when the suite could not run at all."""
    if tools.conformance is None:
        raise RuntimeError("the conformance suite is not installed")
    baseline = load_baseline(baseline_path)
    expected = [scenario] if scenario else await _scenario_names(tools)
    await anyio.Path(output_dir).mkdir(parents=True, exist_ok=True)
    command = [str(tools.node), str(tools.conformance), "server", "--url", url, "-o", str(output_dir)]
    if scenario:
        command += ["--scenario", scenario]
    else:
        command += ["--suite", SUITE, "--spec-version", SPEC_VERSION]
    if baseline:  # the suite cannot read an empty expected-failures file
        command += ["--expected-failures", str(baseline_path)]
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    with anyio.fail_after(limit):  # run_process kills the suite when cancelled
        done = await anyio.run_process(command, env=env, stderr=subprocess.STDOUT, check=False)
    exit_code = done.returncode
    output = _ANSI.sub("", done.stdout.decode("utf-8", "replace"))
    results = _load_results(output_dir)
    if not results:
        raise RuntimeError(f"the conformance suite produced no results (exit {exit_code}):\n{output[-4000:]}")
    ordered = {name: results[name] for name in expected if name in results}
    ordered.update({name: result for name, result in results.items() if name not in ordered})
    missing = [name for name in expected if name not in results]
    if scenario:
        baseline = [name for name in baseline if name == scenario]
    return SuiteReport(
        results=ordered, baseline=baseline, exit_code=exit_code, output=output, missing=missing
    )
