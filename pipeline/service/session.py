"""Browser sessions for the jobs page: a signed cookie instead of the bearer header, and its CSRF token.

The page logs in with the service token once (a form) and then carries an HttpOnly, SameSite=Strict
cookie, so no script, not even the page's own, ever holds the token. The cookie is
`ISSUED.NONCE.MAC`, the MAC an HMAC-SHA256 under a key derived from the token: nothing is stored on
the server, a new token ends every session, and a session lasts `MAX_AGE_S`.

A cookie is sent by the browser whatever page started the request, so it must not be enough for a
request that changes something: POSTs authenticated by the cookie also need `X-CSRF-Token`, an HMAC of
the session the server writes into the pages it serves (a page on another site cannot read it, and
cannot send a custom header to this origin without a CORS preflight, which the service never allows).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Optional

COOKIE = "corpusmill_session"
CSRF_HEADER = "x-csrf-token"
MAX_AGE_S = 12 * 3600


class Sessions:
    """Issues and checks session cookies and their CSRF tokens for one service token."""

    def __init__(self, token: str):
        self._key = hashlib.sha256(b"corpusmill page session\0" + token.encode()).digest()

    def _mac(self, purpose: bytes, text: str) -> str:
        return hmac.new(self._key, purpose + b"\0" + text.encode(), hashlib.sha256).hexdigest()

    def issue(self, now: Optional[float] = None) -> str:
        """A new session cookie value."""
        body = f"{int(time.time() if now is None else now)}.{secrets.token_urlsafe(16)}"
        return f"{body}.{self._mac(b'session', body)}"

    def valid(self, cookie: Optional[str], now: Optional[float] = None) -> bool:
        """True for a cookie this service issued (under the current token) less than MAX_AGE_S ago."""
        if not cookie or len(cookie) > 200:
            return False
        body, _, mac = cookie.rpartition(".")
        issued = body.partition(".")[0]
        if not issued.isdigit() or not hmac.compare_digest(mac.encode(), self._mac(b"session", body).encode()):
            return False
        age = (time.time() if now is None else now) - int(issued)
        return -60 <= age <= MAX_AGE_S

    def csrf(self, cookie: str) -> str:
        """The CSRF token of a session (the pages carry it; POSTs with the cookie must send it back)."""
        return self._mac(b"csrf", cookie)

    def csrf_ok(self, cookie: str, given: Optional[str]) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf(cookie).encode())
