"""A website with a login form, for the tests of managed auth (auth connections) and of
the console's auth connection page."""

from __future__ import annotations

import http.server
import secrets
import urllib.parse

import httpx

from harness import send_html, serve

USERNAME = "alice"
PASSWORD = "correct-horse-battery-staple-7351"

LOGIN_PAGE = """<!doctype html><html><head><title>Sign in</title></head><body>
<h1>Sign in to Example</h1>{error}
<form method="post" action="/login">
  <label for="username">Username</label> <input id="username" name="username" autocomplete="username" required>
  <label for="password">Password</label> <input id="password" name="password" type="password" required>
  <button type="submit">Sign in</button>
</form></body></html>"""

HOME_PAGE = """<!doctype html><html><head><title>Home</title></head><body>
<h1 id="welcome">Welcome {user}</h1><form action="/search"><input name="q" placeholder="Search"></form>
</body></html>"""


class LoginSite:
    """A website with a login form, a session cookie and server-side sessions that the
    test can expire."""

    def __init__(self):
        self.sessions: dict[str, str] = {}
        self.successful_logins = 0
        self.requests = 0
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status, body="", headers=()):
                send_html(self, status, body, headers)

            def _user(self):
                for part in self.headers.get("cookie", "").split(";"):
                    name, _, value = part.strip().partition("=")
                    if name == "sid" and value in site.sessions:
                        return site.sessions[value]
                return None

            def do_GET(self):
                site.requests += 1
                if self.path.startswith("/login"):
                    self._send(200, LOGIN_PAGE.format(error=""))
                elif (user := self._user()) is not None:
                    self._send(200, HOME_PAGE.format(user=user))
                else:
                    self._send(303, headers=[("location", "/login")])

            def do_POST(self):
                site.requests += 1
                length = int(self.headers.get("content-length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                if self.path == "/admin/expire":
                    site.sessions.clear()
                    return self._send(204)
                if form.get("username") == [USERNAME] and form.get("password") == [PASSWORD]:
                    sid = secrets.token_hex(16)
                    site.sessions[sid] = USERNAME
                    site.successful_logins += 1
                    return self._send(303, headers=[
                        ("location", "/"), ("set-cookie", f"sid={sid}; Max-Age=86400; Path=/; HttpOnly")])
                error = '<p class="error" role="alert">Invalid username or password.</p>'
                self._send(401, LOGIN_PAGE.format(error=error))

            def log_message(self, *args):
                pass

        self.server = serve(Handler)
        self.domain = f"127.0.0.1:{self.server.server_address[1]}"
        self.base = f"http://{self.domain}"
        self.login_url = f"{self.base}/login"

    def expire_sessions(self):
        httpx.post(f"{self.base}/admin/expire")
