"""A fake OpenID Connect provider that follows the specifications the control plane
relies on: Discovery 1.0 (`/.well-known/openid-configuration`), a JWKS of RSA keys
(RFC 7517) that can be rotated, the authorization code flow (Core 1.0 §3.1) with a
sign-in form a browser fills, PKCE S256 (RFC 7636) and client_secret_basic at the token
endpoint, and RS256 ID tokens with `iss`, `sub`, `aud`, `exp`, `iat`, `nonce`.

Tests pick who signs in (the form's user name) and can make it misbehave as a broken or
hostile provider would: sign with a key it no longer publishes, name another issuer, or
hand out an expired token."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from harness import answer, control_plane_for_module, quiet_handler


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SigningKey:
    def __init__(self):
        self.kid = secrets.token_hex(8)
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self) -> dict:
        numbers = self.private.public_key().public_numbers()
        return {"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                "n": _b64(numbers.n), "e": _b64(numbers.e)}


class FakeOidcProvider:
    def __init__(self, client_id: str, client_secret: str, redirect_uri: str, users: dict[str, dict]):
        """`users`: user name → extra ID token claims (`email`, `org`, `role`, …)."""
        self.client_id = client_id
        self.client_secret = client_secret
        self.redirect_uri = redirect_uri
        self.users = users
        self.key = SigningKey()
        self.retired: list[SigningKey] = []
        # Misbehaviour for the next tokens: "retired_key", "other_issuer", "expired".
        self.misbehave: str | None = None
        self.codes: dict[str, dict] = {}
        self.token_requests = 0
        fake = self

        Handler = quiet_handler(GET=fake._get, POST=fake._post)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOidcProvider":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()

    def rotate(self) -> None:
        """A new signing key; the JWKS publishes only it from now on."""
        self.retired.append(self.key)
        self.key = SigningKey()

    # --- endpoints -----------------------------------------------------------------------

    def _get(self, request: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(request.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/.well-known/openid-configuration":
            return self._json(request, 200, {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "jwks_uri": f"{self.issuer}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            })
        if url.path == "/jwks":
            return self._json(request, 200, {"keys": [self.key.jwk()]})
        if url.path == "/authorize":
            problem = self._authorization_problem(query)
            if problem:
                return self._html(request, 400, f"<p>{html.escape(problem)}</p>")
            hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                             for k, v in query.items())
            return self._html(request, 200, f"""<!doctype html><title>Sign in to the fake provider</title>
                <form method="post" action="/authorize">{hidden}
                <label>User <input name="username" id="username"></label>
                <button type="submit" id="sign-in">Sign in</button></form>""")
        self._json(request, 404, {"error": "not_found"})

    def _authorization_problem(self, query: dict) -> str | None:
        if query.get("response_type") != "code":
            return "response_type must be code"
        if query.get("client_id") != self.client_id:
            return "unknown client"
        if query.get("redirect_uri") != self.redirect_uri:
            return "redirect_uri is not registered"
        if "openid" not in query.get("scope", "").split():
            return "scope must include openid"
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            return "PKCE S256 is required"
        if not query.get("state") or not query.get("nonce"):
            return "state and nonce are required"
        return None

    def _post(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        form = dict(urllib.parse.parse_qsl(request.rfile.read(length).decode()))
        path = urllib.parse.urlsplit(request.path).path
        if path == "/authorize":
            problem = self._authorization_problem(form)
            user = form.get("username", "")
            if problem or user not in self.users:
                return self._html(request, 400, f"<p>{html.escape(problem or 'unknown user')}</p>")
            code = secrets.token_urlsafe(24)
            self.codes[code] = {"user": user, "nonce": form["nonce"], "challenge": form["code_challenge"],
                                "redirect_uri": form["redirect_uri"], "at": time.time()}
            location = f"{form['redirect_uri']}?" + urllib.parse.urlencode({"code": code, "state": form["state"]})
            request.send_response(302)
            request.send_header("Location", location)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return None
        if path == "/token":
            return self._token(request, form)
        return self._json(request, 404, {"error": "not_found"})

    def _token(self, request: BaseHTTPRequestHandler, form: dict) -> None:
        self.token_requests += 1
        expected = "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return self._json(request, 401, {"error": "invalid_client"})
        grant = self.codes.pop(form.get("code", ""), None)  # a code works once
        if (form.get("grant_type") != "authorization_code" or grant is None
                or time.time() - grant["at"] > 60 or form.get("redirect_uri") != grant["redirect_uri"]):
            return self._json(request, 400, {"error": "invalid_grant"})
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if challenge != grant["challenge"]:
            return self._json(request, 400, {"error": "invalid_grant", "error_description": "PKCE verifier"})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": f"user-{grant['user']}", "aud": self.client_id,
                  "iat": now, "exp": now + 300, "nonce": grant["nonce"], **self.users[grant["user"]]}
        key = self.key
        if self.misbehave == "retired_key":
            key = self.retired[-1]
        elif self.misbehave == "other_issuer":
            claims["iss"] = "https://another-issuer.test"
        elif self.misbehave == "expired":
            claims["iat"], claims["exp"] = now - 3600, now - 1800
        id_token = jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid})
        self._json(request, 200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                                  "expires_in": 300, "id_token": id_token})

    @staticmethod
    def _json(request: BaseHTTPRequestHandler, status: int, body: dict) -> None:
        answer(request, status, "application/json", json.dumps(body), Cache_Control="no-store")

    @staticmethod
    def _html(request: BaseHTTPRequestHandler, status: int, body: str) -> None:
        answer(request, status, "text/html; charset=utf-8", body)


def control_plane_signing_in_with(provider: "FakeOidcProvider", tmp_path_factory):
    """A module's control plane whose people sign in with `provider` (told the callback
    address once the control plane has one). Yield from it in a module fixture."""
    for server in control_plane_for_module(tmp_path_factory, extra_args=[
            "--oidc-issuer", provider.issuer, "--oidc-client-id", provider.client_id,
            "--oidc-client-secret", provider.client_secret]):
        provider.redirect_uri = f"{server.base_url}/auth/oidc/callback"
        yield server


def signing_in_fixtures(client_id: str, client_secret: str, users: dict):
    """The module fixtures of a test where people sign in: `provider` (the fake, with
    `users`) and `control_plane` (its people signing in with it). Assign them to those
    names in the test module."""

    @pytest.fixture(scope="module")
    def provider():
        with FakeOidcProvider(client_id, client_secret, redirect_uri="", users=users) as fake:
            yield fake

    @pytest.fixture(scope="module")
    def control_plane(tmp_path_factory, provider):
        yield from control_plane_signing_in_with(provider, tmp_path_factory)

    return provider, control_plane
