"""Who may see the dashboard.

A dashboard bound to a loopback address is open to this machine, and answers only requests
that name it by a loopback name (so a web page cannot reach it through a DNS name rebound to
127.0.0.1). A dashboard on any other address asks for the cluster token: once, through the
login form or a `?token=` in any URL, after which an HttpOnly cookie carries a value derived
from the token (never the token itself); scripts may send `Authorization: Bearer TOKEN`
instead. Tokens are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from aiohttp import web

__all__ = ["Guard", "is_loopback"]

_SESSION_LIFETIME_S = 7 * 24 * 3600


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an address or a name) names this machine only."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Guard:
    """The dashboard's access rule: open on loopback, the cluster token everywhere else.

    Args:
        token: the cluster token, or None for a dashboard that asks for none (loopback only).
    """

    def __init__(self, token: bytes | None) -> None:
        self.token = token
        if token is None:
            self._session = ""
            self.cookie_name = "parl_dashboard"
        else:
            self._session = hmac.new(token, b"parl dashboard session", hashlib.sha256).hexdigest()
            # Clusters with different tokens on one host keep apart (cookies ignore ports).
            tag = hashlib.sha256(self._session.encode()).hexdigest()[:8]
            self.cookie_name = f"parl_dashboard_{tag}"

    @property
    def required(self) -> bool:
        """Whether requests must prove they know the token."""
        return self.token is not None

    def token_ok(self, given: str) -> bool:
        """Whether `given` is the cluster token."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token)

    def allows(self, request: web.Request) -> bool:
        """Whether `request` carries the session cookie or the token as a bearer credential."""
        if self.token is None:
            return True
        cookie = request.cookies.get(self.cookie_name, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._session.encode()):
            return True
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(credential.strip())

    def grant(self, response: web.StreamResponse) -> None:
        """Give the browser the session cookie."""
        response.set_cookie(
            self.cookie_name,
            self._session,
            max_age=_SESSION_LIFETIME_S,
            path="/",
            httponly=True,
            samesite="Strict",
        )

    @staticmethod
    def same_origin(request: web.Request) -> bool:
        """Whether a browser's request comes from a page of this dashboard (or not a browser)."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        return origin.rstrip("/") == f"{request.scheme}://{request.host}"
