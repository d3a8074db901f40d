"""Who may open ``fsobs dashboard``: its flags checked and turned into the environment that the
app's gate reads (``dashboard/auth.py``), and the allow-list rule both sides use.

Three modes (``--auth``):

- ``none``: anyone who can reach the port;
- ``token``: a shared token, from ``--token-file`` or ``FSOBS_DASHBOARD_TOKEN`` (without either,
  ``fsobs dashboard`` generates one and prints it once);
- ``oidc``: Streamlit's login with the ``[auth]`` section of the ``secrets.toml`` that
  ``--auth-secrets`` names, for the users of ``--allow`` / ``--allow-file`` (an address, or
  ``@domain`` for every address of a domain).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

from fsobs.errors import FsobsError

if sys.version_info >= (3, 11):  # Streamlit's login needs 3.11 too
    import tomllib

AUTH_ENV = "FSOBS_DASHBOARD_AUTH"
TOKEN_ENV = "FSOBS_DASHBOARD_TOKEN"
ALLOW_ENV = "FSOBS_DASHBOARD_ALLOW"
READ_ONLY_ENV = "FSOBS_READ_ONLY"
MODES = ("none", "token", "oidc")
MIN_TOKEN_CHARS = 16
OIDC_KEYS = ("redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url")
"""What the ``[auth]`` section needs for ``st.login()`` with its default provider."""
CALLBACK = "/oauth2callback"


def add_access_flags(cmd: argparse.ArgumentParser) -> None:
    """``--auth``, ``--token-file``, ``--auth-secrets``, ``--allow``, ``--allow-file``,
    ``--read-only``."""
    cmd.add_argument(
        "--auth", choices=MODES, default="none", help="who may open it (default: %(default)s)"
    )
    cmd.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"--auth token: the shared token (else ${TOKEN_ENV}, else one is generated)",
    )
    cmd.add_argument(
        "--auth-secrets",
        type=Path,
        metavar="PATH",
        help="--auth oidc: a secrets.toml whose [auth] section has " + ", ".join(OIDC_KEYS),
    )
    cmd.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="EMAIL",
        help="--auth oidc: a user who may log in, or @domain (repeatable)",
    )
    cmd.add_argument(
        "--allow-file",
        type=Path,
        metavar="PATH",
        help="--auth oidc: the allow-list, one entry a line, # comments",
    )
    cmd.add_argument("--read-only", action="store_true", help="no uploads, no capture requests")


def parse_allow(text: str) -> tuple[str, ...]:
    """The entries of an allow-list: separated by commas, spaces or lines, ``#`` starts a
    comment, lower-cased."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return tuple(entry.lower() for line in lines for entry in line.replace(",", " ").split())


def is_allowed(email: str | None, allow: Collection[str]) -> bool:
    """Whether ``email`` is on the allow-list: the address itself, or ``@`` and its domain."""
    name, at, domain = (email or "").strip().lower().partition("@")
    if not (name and at and domain) or "@" in domain:
        return False
    return f"{name}@{domain}" in allow or f"@{domain}" in allow


def access_env(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The app's access settings from the flags (FsobsError, one line, for a bad one). In token
    mode, ``TOKEN_ENV`` is empty when neither ``--token-file`` nor the environment gives one."""
    _check_combination(args)
    env = {AUTH_ENV: args.auth, READ_ONLY_ENV: "1" if args.read_only else "0", TOKEN_ENV: ""}
    env[ALLOW_ENV] = ""
    if args.auth == "token":
        env[TOKEN_ENV] = _token(args.token_file, environ)
    elif args.auth == "oidc":
        check_oidc_secrets(args.auth_secrets)
        env[ALLOW_ENV] = ",".join(_allow_list(args.allow, args.allow_file))
    return env


def _check_combination(args: argparse.Namespace) -> None:
    if args.token_file is not None and args.auth != "token":
        raise FsobsError("--token-file needs --auth token")
    for flag, value in (
        ("--auth-secrets", args.auth_secrets),
        ("--allow", args.allow),
        ("--allow-file", args.allow_file),
    ):
        if value and args.auth != "oidc":
            raise FsobsError(f"{flag} needs --auth oidc")
    if args.auth == "oidc" and args.auth_secrets is None:
        raise FsobsError("--auth oidc needs --auth-secrets SECRETS_TOML (its [auth] section)")
    if args.auth == "oidc" and not (args.allow or args.allow_file):
        raise FsobsError("--auth oidc needs --allow EMAIL or --allow-file (who may log in)")


def _token(path: Path | None, environ: Mapping[str, str]) -> str:
    """The shared token: the file's, else the environment's, else empty."""
    if path is not None:
        token = _read(path, "token file").strip()
        where: object = path
    elif environ.get(TOKEN_ENV, "").strip():
        token, where = environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        return ""
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise FsobsError(
            f"the token must be at least {MIN_TOKEN_CHARS} characters, without spaces", path=where
        )
    return token


def check_oidc_secrets(path: Path) -> None:
    """That ``path`` is a TOML file whose ``[auth]`` section ``st.login()`` can use."""
    auth = _toml(path).get("auth")
    if not isinstance(auth, dict):
        raise FsobsError("no [auth] section", path=path)
    for key in OIDC_KEYS:
        if not isinstance(auth.get(key), str) or not auth[key].strip():
            raise FsobsError("missing in the [auth] section", path=path, field=key)
    if not auth["redirect_uri"].rstrip().endswith(CALLBACK):
        raise FsobsError(f"must end with {CALLBACK}", path=path, field="redirect_uri")


def _toml(path: Path) -> dict[str, object]:
    if sys.version_info < (3, 11):
        raise FsobsError("--auth oidc needs Python 3.11 or later (Streamlit's login does)")
    else:
        try:
            return tomllib.loads(_read(path, "secrets file"))
        except tomllib.TOMLDecodeError as exc:
            raise FsobsError(f"not TOML: {exc}", path=path) from exc


def _allow_list(entries: list[str], path: Path | None) -> tuple[str, ...]:
    found: list[tuple[str, Path | None]] = [(e, None) for e in parse_allow(",".join(entries))]
    if path is not None:
        found += [(entry, path) for entry in parse_allow(_read(path, "allow-list"))]
    for entry, where in found:
        domain = entry.rpartition("@")[2]
        if entry.count("@") != 1 or "." not in domain.strip("."):
            raise FsobsError(f"not an e-mail address or @domain: {entry!r}", path=where)
    if not found:
        raise FsobsError("the allow-list is empty", path=path)
    return tuple(entry for entry, _ in found)


def _read(path: Path, what: str) -> str:
    """The text of a small settings file (one line naming it if it cannot be read)."""
    if not path.is_file():
        raise FsobsError(f"no such {what} (or not a regular file)", path=path)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise FsobsError(f"cannot read the {what} ({reason})", path=path) from exc
