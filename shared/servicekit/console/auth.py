"""The console's session cookie and CSRF tokens (both services; no FastAPI here).

* **Session**: after the operator signs in with the service's own token, the browser holds a cookie with a
  random session id and its issue time, signed with ``itsdangerous`` (HMAC-SHA1 over a key derived from the
  operator token, never the token itself) and refused after ``max_age`` seconds. The cookie is HttpOnly,
  SameSite=Strict, Path=/, Secure when the service serves TLS (then named with the ``__Host-``
  prefix, which browsers accept only from a secure origin). Rotating the operator token ends every session.
* **CSRF**: every form carries ``csrf_token`` = HMAC-SHA256(key, session id). A POST is accepted only with
  the session cookie (SameSite=Strict: a cross-site form post does not carry it), the matching token, and,
  when the browser sends them, an ``Origin`` equal to the service's own and a ``Sec-Fetch-Site`` that is not
  ``cross-site``. The sign-in form has its own pre-session cookie and token, so it is covered too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from itsdangerous import BadSignature, URLSafeTimedSerializer

from shared.servicekit.tokens import is_token

__all__ = ["ConsoleSession", "SessionSigner"]

#: Lifetime of the sign-in form's pre-session cookie (seconds).
SIGN_IN_FORM_SECONDS = 15 * 60
#: Lifetime of a flash: what a form's answer shows once, after its redirect (seconds).
FLASH_SECONDS = 120


@dataclass(frozen=True)
class ConsoleSession:
    """A signed-in browser: its session id and the CSRF token its forms carry."""

    sid: str
    csrf: str


class SessionSigner:
    """Issues and reads session cookies and CSRF tokens for one service (its own key and cookie name)."""

    def __init__(self, *, service: str, operator_token: str, max_age_seconds: int, secure: bool) -> None:
        # A key of its own, derived from the operator token (a cookie never reveals the token).
        self._key = hashlib.sha256(f"pobo-console\0{service}\0{operator_token}".encode()).digest()
        self._serializer = URLSafeTimedSerializer(self._key, salt=f"pobo-console-session-{service}")
        self._pre = URLSafeTimedSerializer(self._key, salt=f"pobo-console-sign-in-{service}")
        self._is_operator = is_token(operator_token)
        self.max_age = max_age_seconds
        self.secure = secure
        prefix = "__Host-" if secure else ""
        # One name per service: cookies are not isolated by port, and both services may share a host.
        self.cookie_name = f"{prefix}pobo_{service}_console"
        self.pre_cookie_name = f"{prefix}pobo_{service}_sign_in"
        self.flash_cookie_name = f"{prefix}pobo_{service}_flash"
        flash_key = hashlib.sha256(self._key + b"\0flash").digest()
        self._flash = Fernet(base64.urlsafe_b64encode(flash_key))

    # ----------------------------------------------------------------------------------- the operator token

    def is_operator_token(self, token: str) -> bool:
        """Constant-time: digests compared, so the length of a wrong token tells nothing."""
        return self._is_operator(token)

    # ----------------------------------------------------------------------------------------- the session

    def new_session(self) -> tuple[str, ConsoleSession]:
        """A new session: (cookie value, session)."""
        sid = secrets.token_urlsafe(24)
        return self._serializer.dumps({"sid": sid}), ConsoleSession(sid, self.csrf_for(sid))

    def read(self, cookie: str | None) -> ConsoleSession | None:
        """The session of a cookie, or None if it is missing, forged or older than ``max_age``."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.max_age)
        except BadSignature:  # (SignatureExpired is one)
            return None
        sid = data.get("sid") if isinstance(data, dict) else None
        if not isinstance(sid, str) or not sid:
            return None
        return ConsoleSession(sid, self.csrf_for(sid))

    # -------------------------------------------------------------------------------------------- CSRF

    def csrf_for(self, sid: str) -> str:
        return hmac.new(self._key, f"csrf\0{sid}".encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def csrf_matches(expected: str, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(expected.encode(), str(sent).encode())

    # -------------------------------------------------------------------------------------------- flash

    def seal(self, sid: str, data: dict[str, Any]) -> str:
        """``data`` for one later page of session ``sid``, encrypted and authenticated (Fernet): what a
        form's answer shows after its redirect (post/redirect/get), e.g. a new token shown once."""
        return self._flash.encrypt(json.dumps({"sid": sid, "data": data}).encode()).decode("ascii")

    def unseal(self, sid: str, value: str | None) -> dict[str, Any] | None:
        """The data sealed for session ``sid`` (None: none, another session's, forged or expired)."""
        if not value:
            return None
        try:
            payload = json.loads(self._flash.decrypt(value.encode("ascii"), ttl=FLASH_SECONDS))
        except (InvalidToken, ValueError):
            return None
        if (
            not isinstance(payload, dict)
            or payload.get("sid") != sid
            or not isinstance(payload.get("data"), dict)
        ):
            return None
        data: dict[str, Any] = payload["data"]
        return data

    def new_sign_in_form(self) -> tuple[str, str]:
        """The sign-in form's pre-session: (cookie value, the form's CSRF token)."""
        nonce = secrets.token_urlsafe(24)
        return self._pre.dumps({"nonce": nonce}), self.csrf_for("sign-in\0" + nonce)

    def sign_in_csrf(self, cookie: str | None) -> str | None:
        """The CSRF token the sign-in form must carry, from its pre-session cookie (None: none or expired)."""
        if not cookie:
            return None
        try:
            data = self._pre.loads(cookie, max_age=SIGN_IN_FORM_SECONDS)
        except BadSignature:
            return None
        nonce = data.get("nonce") if isinstance(data, dict) else None
        return self.csrf_for("sign-in\0" + nonce) if isinstance(nonce, str) and nonce else None
