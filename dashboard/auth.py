"""Who may open the dashboard: the gate the entry script passes before it shows anything of the
store (:func:`gate`).

The settings come from the environment, which ``fsobs dashboard`` sets from its flags (so
``streamlit run dashboard/streamlit_app.py`` with the same variables behaves the same):

- ``FSOBS_DASHBOARD_AUTH``: ``none`` (the default), ``token`` or ``oidc``; any other value lets
  nobody in.
- ``token``: a shared token, ``FSOBS_DASHBOARD_TOKEN``. The viewer opens ``/?token=...`` or types
  it into a password field; once accepted it is kept in the session (``st.session_state``) and
  removed from the URL. Tokens are compared with :func:`hmac.compare_digest`.
- ``oidc``: Streamlit's own login (``st.login``, configured by the ``[auth]`` section of the
  ``secrets.toml`` that ``fsobs dashboard --auth-secrets`` names), and an allow-list,
  ``FSOBS_DASHBOARD_ALLOW``: comma-separated e-mail addresses and ``@domain`` patterns. A viewer
  not logged in sees a login button; one not on the list, one line and a logout button.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import streamlit as st

from dashboard.text import esc
from fsobs.cli import ALLOW_ENV, AUTH_ENV, TOKEN_ENV, is_allowed, parse_allow

TOKEN_PARAM = "token"
"""The query parameter that carries the token (``/?token=...``)."""
ACCEPTED_KEY = "auth_token_accepted"
TYPED_KEY = "auth_token_typed"
TITLE = "FreeScale"


@dataclass(kw_only=True, frozen=True)
class AuthSettings:
    """The gate's settings, as read from the environment (:meth:`from_env`)."""

    mode: str
    """``none``, ``token`` or ``oidc``; or what else the environment said (then nobody is let
    in)."""
    token: str = ""
    """The shared token (``token`` mode)."""
    allow: tuple[str, ...] = ()
    """E-mail addresses and ``@domain`` patterns, lower case (``oidc`` mode)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AuthSettings:
        return cls(
            mode=environ.get(AUTH_ENV, "").strip().lower() or "none",
            token=environ.get(TOKEN_ENV, "").strip(),
            allow=parse_allow(environ.get(ALLOW_ENV, "")),
        )


def tokens_match(given: str, expected: str) -> bool:
    """Whether the given token is the expected one (constant-time; an empty one never is)."""
    return bool(expected) and hmac.compare_digest(given.strip().encode(), expected.encode())


def gate() -> None:
    """Pass if the viewer may see the store; otherwise draw the login (or the refusal) and end
    the script run, before anything of the store is read."""
    settings = AuthSettings.from_env(os.environ)
    if settings.mode == "none":
        return
    if settings.mode == "token":
        _token_gate(settings.token)
    elif settings.mode == "oidc":
        _oidc_gate(settings.allow)
    else:
        _refuse(f"Unknown {AUTH_ENV} {settings.mode!r}: nobody is let in.")


def _title() -> None:
    st.set_page_config(page_title=TITLE, page_icon=":material/bubble_chart:")
    st.title(TITLE)


def _refuse(line: str) -> None:
    _title()
    st.error(esc(line))
    st.stop()


def _token_gate(expected: str) -> None:
    if not expected:
        _refuse(f"Token mode without a token ({TOKEN_ENV}): nobody is let in.")
    if st.session_state.get(ACCEPTED_KEY):
        return
    given = st.query_params.get(TOKEN_PARAM)
    if given is not None:
        del st.query_params[TOKEN_PARAM]  # never left in the address bar or in shared links
    else:
        given = st.session_state.get(TYPED_KEY) or None
    if given is not None and tokens_match(given, expected):
        st.session_state[ACCEPTED_KEY] = True
        st.session_state.pop(TYPED_KEY, None)
        return
    _title()
    st.text_input("Access token", type="password", key=TYPED_KEY)
    if given is not None:
        st.error("Wrong token.")
    st.stop()


def _oidc_gate(allow: Collection[str]) -> None:
    if not st.user.is_logged_in:
        _title()
        if st.button("Log in", type="primary"):
            st.login()
        st.stop()
    email = st.user.get("email")
    verified = st.user.get("email_verified") is not False
    if not (verified and is_allowed(str(email) if email else None, allow)):
        who = str(email) if email else "This account"
        _title()
        st.error(esc(f"{who} may not open this dashboard."))
        if st.button("Log out"):
            st.logout()
        st.stop()
    st.sidebar.caption(esc(f"Logged in as {email}"))
    if st.sidebar.button("Log out"):
        st.logout()
