"""A minimal OpenID Connect provider on localhost, for the dashboard's login tests.

It serves what Authlib (behind Streamlit's ``st.login``) asks of a provider, for one client:

- ``/.well-known/openid-configuration``: the discovery document;
- ``/authorize``: no login form; it sends the browser back to the client's ``redirect_uri``
  with a one-time code for :attr:`OidcProvider.user` (the test picks who logs in);
- ``/token``: the code (and the client's secret, Basic or in the form) for an access token and
  an RS256-signed ``id_token`` carrying the e-mail and the login's ``nonce``;
- ``/jwks``: the public key.

Use it as a context manager: it serves from a thread of the test process.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import RSAKey

CLIENT_ID = "fsobs-dashboard"
CLIENT_SECRET = "client-secret-for-tests-only"


class OidcProvider:
    """The provider, for one client whose callback is ``redirect_uri``."""

    def __init__(self, redirect_uri: str) -> None:
        self.redirect_uri = redirect_uri
        self.user = "nobody@example.com"
        """The e-mail address of whoever logs in next."""
        self._key = RSAKey.generate_key(2048, parameters={"kid": "test", "use": "sig"})
        self._codes: dict[str, tuple[str, str]] = {}  # code -> (email, nonce)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def metadata_url(self) -> str:
        return f"{self.url}/.well-known/openid-configuration"

    def __enter__(self) -> OidcProvider:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _discovery(self) -> dict[str, object]:
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "email", "profile"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        }

    def _authorize(self, query: dict[str, str]) -> str:
        """Where ``/authorize`` sends the browser: back to the client, with a code."""
        if query.get("client_id") != CLIENT_ID or query.get("redirect_uri") != self.redirect_uri:
            raise ValueError(f"unknown client or redirect_uri: {query}")
        code = secrets.token_urlsafe(16)
        self._codes[code] = (self.user, query.get("nonce", ""))
        return f"{self.redirect_uri}?{urlencode({'code': code, 'state': query['state']})}"

    def _token(self, form: dict[str, str], authorization: str | None) -> dict[str, object]:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.startswith("Basic "):
            client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
        if (client_id, secret) != (CLIENT_ID, CLIENT_SECRET):
            raise ValueError("bad client credentials")
        email, nonce = self._codes.pop(form.get("code", ""))  # one use
        now = int(time.time())
        claims = {
            "iss": self.url,
            "sub": email,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            "email": email,
            "email_verified": True,
        }
        id_token = jwt.encode({"alg": "RS256", "kid": "test"}, claims, self._key)
        return {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                "expires_in": 300, "id_token": id_token}  # fmt: skip

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _json(self, body: object, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/.well-known/openid-configuration":
                    self._json(provider._discovery())
                elif url.path == "/jwks":
                    self._json({"keys": [provider._key.as_dict(private=False)]})
                elif url.path == "/authorize":
                    try:
                        location = provider._authorize(query)
                    except (KeyError, ValueError) as exc:
                        self._json({"error": str(exc)}, 400)
                        return
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.end_headers()
                else:
                    self._json({"error": "not found"}, 404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if urlsplit(self.path).path != "/token":
                    self._json({"error": "not found"}, 404)
                    return
                try:
                    self._json(provider._token(form, self.headers.get("Authorization")))
                except (KeyError, ValueError) as exc:
                    self._json({"error": "invalid_grant", "error_description": str(exc)}, 400)

        return Handler
