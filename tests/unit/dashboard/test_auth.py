"""The access rules of ``dashboard/auth.py`` and ``fsobs/cli/access.py``: the allow-list, the
token comparison, and a gate that lets nobody in when its settings are wrong (the logins in a
real browser: ``test_auth_browser.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.auth import tokens_match
from fsobs.cli.access import is_allowed, parse_allow
from tests.support.stores import APP, RUN_IDS

ALLOW = parse_allow("alice@example.com, @Team.Example.org  # the team\n# nobody else\nCAROL@x.io")


def test_the_allow_list_is_lower_case_entries_without_comments() -> None:
    assert ALLOW == ("alice@example.com", "@team.example.org", "carol@x.io")


@pytest.mark.parametrize(
    ("email", "allowed"),
    [
        ("alice@example.com", True),
        ("Alice@Example.COM", True),  # addresses are matched without case
        ("carol@x.io", True),
        ("bob@team.example.org", True),  # the domain's entry
        ("mallory@example.com", False),  # alice's domain is not on the list
        ("bob@sub.team.example.org", False),  # a sub-domain is another domain
        ("bob@team.example.org.evil.com", False),
        ("alice@example.com@evil.com", False),
        ("@team.example.org", False),  # no address
        ("", False),
        (None, False),
    ],
)
def test_is_allowed(email: str | None, allowed: bool) -> None:
    assert is_allowed(email, ALLOW) is allowed


def test_tokens_match_only_the_same_token() -> None:
    assert tokens_match("team-token-0123456789", "team-token-0123456789")
    assert tokens_match(" team-token-0123456789\n", "team-token-0123456789")  # pasted
    assert not tokens_match("team-token-012345678", "team-token-0123456789")
    assert not tokens_match("", "")  # no token configured: nobody


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"FSOBS_DASHBOARD_AUTH": "token"}, "Token mode without a token (FSOBS_DASHBOARD_TOKEN)"),
        ({"FSOBS_DASHBOARD_AUTH": "tokn"}, "Unknown FSOBS_DASHBOARD_AUTH 'tokn'"),
    ],
)
def test_a_misconfigured_gate_lets_nobody_in(
    shared_app_env: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], line: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FSOBS_DASHBOARD_TOKEN", "")
    at = AppTest.from_file(str(APP), default_timeout=30)
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.replace("\\", "").startswith(line)
    assert not at.dataframe and not at.get("file_uploader") and not at.text_input
    assert not [run_id for run_id in RUN_IDS if run_id in str(at)]


def test_a_read_only_local_store_lists_its_runs_and_offers_no_upload(
    shared_app_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSOBS_READ_ONLY", "1")
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert set(RUN_IDS) <= set(at.dataframe[0].value["run"])
    assert [i.value for i in at.info] == [
        "This dashboard serves its run store read-only: uploading runs is disabled."
    ]
    assert not at.get("file_uploader") and not at.button
