"""Who may open the dashboard, end to end (issue 35, point 1): ``fsobs dashboard --auth token``
and ``--auth oidc`` (against the localhost provider of ``oidc_provider.py``) in a real headless
Chromium. Nothing of the store (run ids, the runs table, the uploader, the store's path) may be
in the page before the viewer is let in. One server per mode (module-scoped fixtures)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.dashboard.test_browser import RUNS_TABLE_JS
from tests.support.cdp import Browser, free_port
from tests.support.launcher import FsobsDashboard
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider
from tests.support.stores import RUN_IDS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "team-token-0123456789abcdef"
IDLE_JS = (
    "(document.querySelector('[data-testid=\"stApp\"]') || {}).dataset?.testScriptState"
    " === 'notRunning'"
)
"""The script run has finished (what the page shows is complete)."""
TOKEN_FIELD_JS = f"{IDLE_JS} && !!document.querySelector('input[type=password]')"
ALERTS_JS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stAlert\"]'))"
    ".map((a) => a.innerText.trim().replaceAll('\\u200b', ''))"  # esc() breaks bare links
)
BUTTONS_JS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stMain\"] button'))"
    ".map((b) => b.innerText.trim())"
)


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    with Browser(chromium) as opened:
        yield opened


def _nothing_of_the_store(browser: Browser, store: Path) -> None:
    """No run id, no table, no uploader and not the store's path in the page."""
    text = str(browser.evaluate("document.body.innerText"))
    assert not [run_id for run_id in RUN_IDS if run_id in text], text
    assert str(store) not in text and "Upload a run" not in text, text
    found = browser.evaluate(
        'document.querySelectorAll(\'input[type=file], [data-testid="stDataFrame"],'
        ' [data-testid="stSidebarNav"], a[href*="bubbles"]\').length'
    )
    assert found == 0, text


def _runs_listed(browser: Browser) -> list[str]:
    """The run ids of the Runs page's table, once it lists them all."""
    browser.wait_for(f"{RUNS_TABLE_JS}.length >= {len(RUN_IDS)}", timeout_s=60)
    return [row[0] for row in browser.evaluate(RUNS_TABLE_JS)]


# -- token mode --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_dashboard(
    shared_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FsobsDashboard]:
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")  # the line end is not part of it
    with FsobsDashboard(shared_store, "--auth", "token", "--token-file", str(token_file)) as app:
        yield app


def test_without_the_token_nothing_of_the_store_is_shown(
    browser: Browser, token_dashboard: FsobsDashboard, shared_store: Path
) -> None:
    for path in ("/", "/bubbles?run=sim/control", "/compare?control=sim/control&test=sim/test"):
        browser.navigate(token_dashboard.url + path)
        browser.wait_for(TOKEN_FIELD_JS, timeout_s=30)
        assert browser.evaluate(ALERTS_JS) == []
        _nothing_of_the_store(browser, shared_store)


def test_a_wrong_token_gets_one_line_and_nothing_else(
    browser: Browser, token_dashboard: FsobsDashboard, shared_store: Path
) -> None:
    browser.navigate(f"{token_dashboard.url}/?token={TOKEN[:-1]}")
    browser.wait_for(f"{TOKEN_FIELD_JS} && {ALERTS_JS}.length > 0", timeout_s=30)
    assert browser.evaluate(ALERTS_JS) == ["Wrong token."]
    assert "token" not in str(browser.evaluate("location.search"))  # taken out of the URL
    _nothing_of_the_store(browser, shared_store)


def test_the_token_in_the_url_opens_the_store_and_leaves_the_url(
    browser: Browser, token_dashboard: FsobsDashboard
) -> None:
    browser.navigate(f"{token_dashboard.url}/?token={TOKEN}")
    assert set(RUN_IDS) <= set(_runs_listed(browser))
    assert "token" not in str(browser.evaluate("location.search"))
    assert browser.evaluate("!!document.querySelector('input[type=file]')")  # uploads allowed


def test_a_typed_token_opens_the_store(browser: Browser, token_dashboard: FsobsDashboard) -> None:
    browser.navigate(token_dashboard.url + "/")
    browser.wait_for(TOKEN_FIELD_JS, timeout_s=30)
    browser.evaluate("document.querySelector('input[type=password]').focus()")
    browser.call("Input.insertText", text=TOKEN)
    for kind in ("keyDown", "keyUp"):  # Enter submits the field
        browser.call(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            text="\r" if kind == "keyDown" else "",
        )
    assert set(RUN_IDS) <= set(_runs_listed(browser))


# -- OIDC --------------------------------------------------------------------------------

ALLOWED = "alice@example.com"
ALLOWED_BY_DOMAIN = "bob@team.example.org"
NOT_ALLOWED = "mallory@example.com"  # alice's domain, but only alice is on the list


@pytest.fixture(scope="module")
def oidc(
    shared_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OidcProvider, FsobsDashboard]]:
    """The provider, and a read-only dashboard that logs in there: ``--allow`` one address,
    ``--allow-file`` one domain."""
    folder = tmp_path_factory.mktemp("oidc")
    port = free_port()
    with OidcProvider(f"http://127.0.0.1:{port}/oauth2callback") as provider:
        toml = folder / "secrets.toml"
        toml.write_text(
            "[auth]\n"
            f'redirect_uri = "{provider.redirect_uri}"\n'
            f'cookie_secret = "{secrets.token_hex(16)}"\n'
            f'client_id = "{CLIENT_ID}"\n'
            f'client_secret = "{CLIENT_SECRET}"\n'
            f'server_metadata_url = "{provider.metadata_url}"\n'
        )
        allow_file = folder / "allow.txt"
        allow_file.write_text("# the team\n@Team.Example.org\n")
        args = ("--auth", "oidc", "--auth-secrets", str(toml), "--allow", ALLOWED)
        with FsobsDashboard(
            shared_store, *args, "--allow-file", str(allow_file), "--read-only", port=port
        ) as app:
            yield provider, app


def _log_in(browser: Browser, app: FsobsDashboard) -> None:
    browser.navigate(app.url + "/")
    browser.wait_for(f"{IDLE_JS} && {BUTTONS_JS}.includes('Log in')", timeout_s=30)
    browser.click("button", "Log in")


def test_logged_out_there_is_only_the_login_button(
    chromium: str, oidc: tuple[OidcProvider, FsobsDashboard], shared_store: Path
) -> None:
    _, app = oidc
    with Browser(chromium) as fresh:
        fresh.navigate(app.url + "/bubbles?run=sim/control")
        fresh.wait_for(f"{IDLE_JS} && {BUTTONS_JS}.length > 0", timeout_s=30)
        assert fresh.evaluate(BUTTONS_JS) == ["Log in"]
        _nothing_of_the_store(fresh, shared_store)


def test_a_user_of_an_allowed_domain_sees_the_runs_and_no_uploader(
    chromium: str, oidc: tuple[OidcProvider, FsobsDashboard]
) -> None:
    provider, app = oidc
    provider.user = ALLOWED_BY_DOMAIN
    with Browser(chromium) as fresh:
        _log_in(fresh, app)
        assert set(RUN_IDS) <= set(_runs_listed(fresh))
        fresh.wait_for(IDLE_JS)
        text = str(fresh.evaluate("document.body.innerText")).replace("\u200b", "")
        assert f"Logged in as {ALLOWED_BY_DOMAIN}" in text
        assert "uploading runs is disabled" in text  # --read-only
        assert not fresh.evaluate("!!document.querySelector('input[type=file]')")


def test_a_user_not_on_the_list_is_refused_and_can_log_out(
    chromium: str, oidc: tuple[OidcProvider, FsobsDashboard], shared_store: Path
) -> None:
    provider, app = oidc
    provider.user = NOT_ALLOWED
    with Browser(chromium) as fresh:
        _log_in(fresh, app)
        fresh.wait_for(f"{IDLE_JS} && {BUTTONS_JS}.includes('Log out')", timeout_s=30)
        assert fresh.evaluate(ALERTS_JS) == [f"{NOT_ALLOWED} may not open this dashboard."]
        assert fresh.evaluate(BUTTONS_JS) == ["Log out"]
        _nothing_of_the_store(fresh, shared_store)
        fresh.click("button", "Log out")
        fresh.wait_for(
            f"{IDLE_JS} && {json.dumps(['Log in'])}.join() === {BUTTONS_JS}.join()", timeout_s=30
        )
        _nothing_of_the_store(fresh, shared_store)
