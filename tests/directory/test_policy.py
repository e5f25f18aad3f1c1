"""``brmcpdir.json`` (brmcp/directory/model/_policy.py): Go's keys and defaults,
zero or absent selecting the default, one-line errors naming the file, the
key, the value and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brmcp.directory.model import Policy, PolicyError, load_policy, policy_template


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "brmcpdir.json"
    path.write_text(text)
    return path


def test_defaults() -> None:
    p = Policy()
    assert (p.listing_fee_atoms, p.snapshot_price_atoms, p.search_price_atoms) == (100_000, 10_000, 0)
    assert (p.expiry_days, p.calls_per_minute, p.test_budget_max_atoms) == (30, 30, 10_000_000)
    assert (p.recrawl_hours, p.name, p.admin_uids) == (24, "brmcpdir", ())


def test_template_loads_as_defaults(tmp_path: Path) -> None:
    text = policy_template()
    assert list(json.loads(text)) == [
        "admin_uids",
        "listing_fee_atoms",
        "snapshot_price_atoms",
        "search_price_atoms",
        "expiry_days",
        "calls_per_minute",
        "test_budget_max_atoms",
        "recrawl_hours",
        "name",
    ]
    assert load_policy(write(tmp_path, text)) == Policy()


def test_values_zero_negative_and_case_insensitive_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"ADMIN_UIDS": ["' + "a" * 64 + '"], "listing_fee_atoms": 5, "snapshot_price_atoms": -1, '
        '"search_price_atoms": 7, "expiry_days": 0, "name": null, "unknown": true}',
    )
    p = load_policy(path)
    assert p.admin_uids == ("a" * 64,)
    assert p.is_admin("a" * 64)
    assert not p.is_admin("b" * 64)
    assert (p.listing_fee_atoms, p.snapshot_price_atoms, p.search_price_atoms) == (5, 10_000, 7)
    assert (p.expiry_days, p.name) == (30, "brmcpdir")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"listing_fee_atoms": "lots"}', 'key "listing_fee_atoms": value "lots"'),
        ('{"expiry_days": 1.5}', 'key "expiry_days": value 1.5'),
        ('{"admin_uids": "aa"}', 'key "admin_uids": value "aa"'),
        ('{"name": 3}', 'key "name": value 3'),
        ("[1, 2]", "allowed: a JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_errors_are_one_line_naming_file_key_value(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert needle in message
    if "key" in needle:
        assert "allowed:" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "nope.json")
