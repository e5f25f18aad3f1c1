"""The ``store`` URL (brmcp/server/store/url.py): the forms it accepts,
one-line errors naming them, and a password that never leaves redacted,
whatever it holds."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp.server.store.url import DEFAULT_STORE, StoreURL, parse_store_url, redact_url

_SECRETS = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=20
).map(lambda s: "Zq9" + s)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("sqlite:", "sqlite"),
        (" sqlite: ", "sqlite"),
        ("postgresql://bot@db.example:5432/brmcp", "postgresql"),
        ("postgres:///brmcp?host=/run/postgresql", "postgresql"),
        ("POSTGRESQL://bot@db/brmcp", "postgresql"),
    ],
)
def test_accepted_forms(value: str, kind: str) -> None:
    url = parse_store_url(value)
    assert url.kind == kind
    assert (url.conninfo == "") == (kind == "sqlite")
    assert parse_store_url(DEFAULT_STORE) == StoreURL("sqlite")


@pytest.mark.parametrize(
    "value",
    [
        "",
        "sqlite:/tmp/x.db",
        "mysql://u@h/db",
        "postgresql:/db",
        "file:///x",
        "postgresql://h:99999999/db",
        7,
        None,
    ],
)
def test_refused_forms_name_the_allowed_ones(value: object) -> None:
    with pytest.raises(ValueError, match='use "sqlite:"') as info:
        parse_store_url(value)
    assert "\n" not in str(info.value)


@given(secret=_SECRETS, in_query=st.booleans())
def test_a_password_is_never_shown(secret: str, in_query: bool) -> None:
    encoded = quote(secret, safe="")
    if in_query:
        text = f"postgresql://bot@db.example/brmcp?sslmode=require&password={encoded}&host=/s"
    else:
        text = f"postgresql://bot:{encoded}@db.example:5432/brmcp?sslmode=require"
    url = parse_store_url(text)
    for shown in (url.redacted(), repr(url), redact_url(text)):
        assert encoded not in shown
        assert "[redacted]" in shown
        assert "db.example" in shown
    assert url.password == secret
    assert url.scrub(f"login failed for {secret} at db") == "login failed for [redacted] at db"
    assert url.scrub(f"login failed for {encoded} at db") == "login failed for [redacted] at db"
    with pytest.raises(ValueError) as info:
        parse_store_url(text.replace("postgresql", "mysql", 1))
    assert encoded not in str(info.value)


@given(secret=st.text(st.sampled_from("ab/@:%"), min_size=1, max_size=12).map(lambda s: "Zq9" + s))
def test_a_raw_password_with_url_characters_is_redacted_whole(secret: str) -> None:
    shown = redact_url(f"postgresql://bot:{secret}@db.example/brmcp")
    assert shown == "postgresql://bot:[redacted]@db.example/brmcp"
