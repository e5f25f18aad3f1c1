"""Our wire vectors through the Go reference's codec (``brmcp-goref vectors``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.kit.paths import VECTORS

pytestmark = pytest.mark.interop

WIRE_V1 = VECTORS / "wire-v1.json"


def test_every_vector_agrees_with_the_reference(goref_binary: Path) -> None:
    data = json.loads(WIRE_V1.read_text())
    expected = len(data["parse"]) + len(data["encode"])
    proc = subprocess.run(
        [str(goref_binary), "vectors", str(WIRE_V1)], capture_output=True, text=True, timeout=60, check=False
    )
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr
    assert lines[-1] == f"{expected} passed, 0 failed", proc.stdout
    assert proc.returncode == 0
    assert len(lines) == 1


def test_a_wrong_vector_is_reported_and_fails(goref_binary: Path, tmp_path: Path) -> None:
    data = json.loads(WIRE_V1.read_text())
    accepted = next(v for v in data["parse"] if v["expect"] is not None)
    wrong_parse = {**accepted, "name": "tampered-parse", "expect": {**accepted["expect"], "seq": 9}}
    rejected = next(v for v in data["parse"] if v["expect"] is None)
    wrong_reject = {**rejected, "name": "tampered-reject", "expect": accepted["expect"]}
    enc = data["encode"][0]
    wrong_encode = {**enc, "name": "tampered-encode", "mid": "ffffffffffffffff"}
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps({"parse": [accepted, wrong_parse, wrong_reject], "encode": [enc, wrong_encode]})
    )
    proc = subprocess.run(
        [str(goref_binary), "vectors", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1
    assert lines[-1] == "2 passed, 3 failed"
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "parse tampered-parse",
        "parse tampered-reject",
        "encode tampered-encode",
    ]
