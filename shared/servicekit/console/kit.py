"""The browser console's frame, shared by both services: templates, assets, sign-in, sessions, CSRF, headers.

A service builds one :class:`Console` (its name, its templates folder, its navigation, its operator token),
adds its pages to ``console.router`` (an ``APIRouter`` whose routes render errors as HTML pages) and calls
:meth:`Console.install`. Pages are server-rendered Jinja2 templates that extend the kit's ``base.html``;
the only scripts are the vendored htmx (for polling fragments) and nothing inline, so the
Content-Security-Policy can forbid everything else. What a page needs from the signed-in operator:

* ``SignedIn`` (a dependency): the session of a signed-in browser; a GET without one is redirected to the
  sign-in page, anything else is a 403.
* ``FormPost`` (a dependency, for every POST): the session, plus a CSRF check (token, Origin,
  Sec-Fetch-Site); it returns the parsed form.

Who acted: :meth:`Console.actor_of` names the caller of a console request for a service's access log
(``<operator>@console:<session tag>``, the tag a digest of the session id, so that the actions of one
sign-in can be told apart; ``anonymous`` without a valid session). A successful sign-in names its new
session in the request's state, so that the sign-in itself is logged as the operator's.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import HTTPConnection

from shared.servicekit.app import AuthFailures
from shared.servicekit.console.auth import FLASH_SECONDS, SIGN_IN_FORM_SECONDS, ConsoleSession, SessionSigner
from shared.servicekit.exceptions import ServiceError

__all__ = ["Console", "ConsoleHeaders", "ConsoleRefusal", "FormPost", "SignedIn"]

log = logging.getLogger("pobo.console")

KIT_DIR = Path(__file__).parent
STATIC_DIR = KIT_DIR / "static"
#: Every asset the console loads (served from the package: no CDN, works air-gapped).
STATIC_FILES = {
    "console.css": "text/css",
    "htmx.min.js": "text/javascript",
    "upload.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
#: Methods of a console request that only reads (never written to an access log as an action).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Where a console request's state names the session a sign-in just opened (``Console.actor_of``).
ACTOR_STATE = "console_actor"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class ConsoleRefusal(Exception):
    """A console request refused with an HTML page (``status``, a message a person can act on)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _SignInRequired(Exception):
    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


class ConsoleHeaders:
    """Plain-ASGI: the console's security headers on every response under ``/console`` (pages, assets,
    redirects, errors): the CSP, no framing, no sniffing, a referrer only to itself, and ``no-store`` for
    all but the static assets."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == "/console" or path.startswith("/console/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith("/console/static/")

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                    (b"cross-origin-opener-policy", b"same-origin"),
                    (b"cross-origin-resource-policy", b"same-origin"),
                    (b"cache-control", b"private, max-age=3600" if static else b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class _ConsoleRoute(APIRoute):
    """A console route: service errors, refusals and invalid input become HTML pages, not JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            console: Console = request.app.state.console
            try:
                return await handler(request)
            except _SignInRequired as exc:
                return RedirectResponse(f"/console/sign-in?next={quote(exc.next_path)}", status_code=303)
            except ConsoleRefusal as exc:
                return console.error_page(request, exc.status, exc.message)
            except ServiceError as exc:
                return console.error_page(request, exc.status_code, exc.detail)
            except RequestValidationError as exc:
                fields = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'input'}: {e.get('msg')}"
                    for e in exc.errors()
                )
                return console.error_page(request, 422, f"invalid input ({fields})")
            except Exception as exc:
                status = console.library_status(exc)
                if status is None:
                    raise
                return console.error_page(request, status, str(exc))

        return route


def _signed_in(request: Request) -> ConsoleSession:
    console: Console = request.app.state.console
    session = console.signer.read(request.cookies.get(console.signer.cookie_name))
    if session is None:
        if request.method == "GET":
            raise _SignInRequired(request.url.path)
        raise ConsoleRefusal(403, "your console session has expired or is missing: sign in again")
    return session


SignedIn = Annotated[ConsoleSession, Depends(_signed_in)]


async def _form_post(request: Request, session: SignedIn) -> FormData:
    console: Console = request.app.state.console
    console.check_origin(request)
    form = await request.form()
    if not console.signer.csrf_matches(session.csrf, _text(form.get("csrf_token"))):
        raise ConsoleRefusal(403, "the form's CSRF token is missing or stale: reload the page and try again")
    return form


FormPost = Annotated[FormData, Depends(_form_post)]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _safe_next(value: str | None) -> str:
    """Only a path of this console (no scheme, no host, no ``//``): never an open redirect."""
    if value and value.startswith("/console") and not value.startswith("//") and "\\" not in value:
        parts = urlsplit(value)
        if not parts.scheme and not parts.netloc and parts.path.startswith("/console"):
            return parts.path
    return "/console"


class Console:
    """The console of one service. ``templates``: the service's templates folder (its pages extend
    ``base.html``); ``nav``: (label, path) of the navigation bar; ``library_errors``: other exception
    classes shown with ``str(exc)`` at the given status (as the API answers them)."""

    def __init__(
        self,
        *,
        service: str,
        title: str,
        templates: Path,
        nav: Sequence[tuple[str, str]],
        operator_token: str,
        session_minutes: int,
        secure: bool,
        who: str,
        operator: str = "operator",
        library_errors: Mapping[type[Exception], int] | None = None,
    ) -> None:
        self.service = service
        self.operator = operator  # how an access log names the operator (the curator's "admin")
        self.title = title
        self.nav = list(nav)
        self.who = who
        self.library_errors = dict(library_errors or {})
        self.signer = SessionSigner(
            service=service,
            operator_token=operator_token,
            max_age_seconds=session_minutes * 60,
            secure=secure,
        )
        self.env = Environment(
            loader=ChoiceLoader([FileSystemLoader(templates), FileSystemLoader(KIT_DIR / "templates")]),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["num"] = _num
        self.router = APIRouter(prefix="/console", route_class=_ConsoleRoute, include_in_schema=False)
        self._add_kit_routes()

    # --------------------------------------------------------------------------------------------- pages

    def library_status(self, exc: Exception) -> int | None:
        matches = [(cls, status) for cls, status in self.library_errors.items() if isinstance(exc, cls)]
        if not matches:
            return None
        return max(matches, key=lambda m: len(m[0].__mro__))[1]  # the most specific class wins

    def render(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any] | None = None,
        *,
        session: ConsoleSession | None = None,
        status_code: int = 200,
    ) -> HTMLResponse:
        """A page (or an htmx fragment): the template with the frame's variables."""
        if session is None:
            session = self.signer.read(request.cookies.get(self.signer.cookie_name))
        frame: dict[str, Any] = {
            "console": self,
            "request": request,
            "path": request.url.path,
            "signed_in": session is not None,
            "csrf_token": session.csrf if session else "",
        }
        frame.update(context or {})  # (the sign-in page brings its own pre-session CSRF token)
        return HTMLResponse(self.env.get_template(template).render(**frame), status_code=status_code)

    def redirect_with_flash(self, url: str, session: ConsoleSession, data: dict[str, Any]) -> Response:
        """Post/redirect/get: a 303 to ``url`` carrying ``data`` for that page alone (``take_flash``), so a
        reload of the page it shows repeats nothing."""
        response = RedirectResponse(url, status_code=303)
        self._set_cookie(
            response, self.signer.flash_cookie_name, self.signer.seal(session.sid, data), FLASH_SECONDS
        )
        return response

    def flash(self, request: Request, session: ConsoleSession) -> dict[str, Any] | None:
        """The data a redirect carried to this page (``redirect_with_flash``); ``forget_flash`` the answer."""
        return self.signer.unseal(session.sid, request.cookies.get(self.signer.flash_cookie_name))

    def forget_flash(self, response: Response) -> Response:
        """The page answers once: the browser drops the flash, and keeps no copy of the page."""
        response.delete_cookie(
            self.signer.flash_cookie_name,
            path="/",
            secure=self.signer.secure,
            httponly=True,
            samesite="strict",
        )
        response.headers["Cache-Control"] = "no-store"
        return response

    def error_page(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", {"status": status, "message": message}, status_code=status)

    def check_origin(self, request: Request) -> None:
        """A state-changing request must come from this console: refuse a cross-site ``Sec-Fetch-Site`` and
        an ``Origin`` other than the service's own (browsers send both on form posts)."""
        # (the pages' Referrer-Policy is same-origin, so the browser sends the real Origin, never "null")
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise ConsoleRefusal(403, "cross-site form posts are refused: use the console's own pages")
        origin = request.headers.get("origin")
        if origin is not None:
            host = request.headers.get("host", "")
            parts = urlsplit(origin)
            if parts.netloc != host:
                raise ConsoleRefusal(403, "cross-site form posts are refused: use the console's own pages")

    # ------------------------------------------------------------------------------------- who acted

    @staticmethod
    def is_action(scope: Mapping[str, Any]) -> bool:
        """A console request that may change something (any method but GET, HEAD, OPTIONS)."""
        path = str(scope.get("path", ""))
        return (
            scope.get("type") == "http"
            and (path == "/console" or path.startswith("/console/"))
            and str(scope.get("method", "GET")).upper() not in READ_METHODS
        )

    def session_actor(self, session: ConsoleSession) -> str:
        """``<operator>@console:<tag>``: the tag is the first 8 hex digits of sha256(session id), the same
        for every request of one sign-in (the id itself, part of what a cookie signs, is never logged)."""
        tag = hashlib.sha256(session.sid.encode("utf-8")).hexdigest()[:8]
        return f"{self.operator}@console:{tag}"

    def actor_of(self, scope: Mapping[str, Any]) -> str:
        """Who made a console request (read after it was answered): the session a sign-in opened, else the
        session of the request's cookie, else ``anonymous`` (no session, a forged or expired one)."""
        state = scope.get("state")
        named = state.get(ACTOR_STATE) if isinstance(state, Mapping) else None
        if isinstance(named, str):
            return named
        cookie = HTTPConnection(dict(scope)).cookies.get(self.signer.cookie_name)
        session = self.signer.read(cookie)
        return "anonymous" if session is None else self.session_actor(session)

    # ---------------------------------------------------------------------------------- sign in and out

    def _add_kit_routes(self) -> None:
        router = self.router

        @router.get("/static/{name}")
        def static(name: str) -> FileResponse:
            if name not in STATIC_FILES:
                raise ConsoleRefusal(404, f"no console asset named {name!r}")
            return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name])

        @router.get("/sign-in")
        def sign_in_form(request: Request, next: str | None = None) -> Response:  # noqa: A002
            if self.signer.read(request.cookies.get(self.signer.cookie_name)) is not None:
                return RedirectResponse(_safe_next(next), status_code=303)
            return self._sign_in_page(request, next, status=200, error=None)

        @router.post("/sign-in")
        async def sign_in(request: Request) -> Response:
            self.check_origin(request)
            form = await request.form()
            next_path = _safe_next(_text(form.get("next")))
            expected = self.signer.sign_in_csrf(request.cookies.get(self.signer.pre_cookie_name))
            if expected is None or not self.signer.csrf_matches(expected, _text(form.get("csrf_token"))):
                return self._sign_in_page(
                    request, next_path, status=403, error="the sign-in form expired: enter the token again"
                )
            token = (_text(form.get("token")) or "").strip()
            failures: AuthFailures = request.app.state.auth_failures
            client = _client(request)
            if token and self.signer.is_operator_token(token):  # the operator is never locked out
                cookie, session = self.signer.new_session()
                request.scope.setdefault("state", {})[ACTOR_STATE] = self.session_actor(session)
                response = RedirectResponse(next_path, status_code=303)
                self._set_cookie(response, self.signer.cookie_name, cookie, self.signer.max_age)
                response.delete_cookie(self.signer.pre_cookie_name, path="/")
                log.info("console: signed in from %s", client)
                return response
            wait = failures.locked_for(client)
            if wait > 0:
                page = self._sign_in_page(
                    request,
                    next_path,
                    status=429,
                    error=f"too many invalid tokens from this address: try again in {int(wait) + 1} s",
                )
                page.headers["Retry-After"] = str(int(wait) + 1)
                return page
            failures.record(client)
            log.warning("console: a sign-in with an invalid token from %s", client)
            return self._sign_in_page(
                request, next_path, status=401, error=f"that is not the {self.who} token: sign-in refused"
            )

        @router.post("/sign-out")
        async def sign_out(request: Request, form: FormPost) -> Response:
            response = RedirectResponse("/console/sign-in", status_code=303)
            response.delete_cookie(self.signer.cookie_name, path="/")
            return response

    def _sign_in_page(
        self, request: Request, next_path: str | None, *, status: int, error: str | None
    ) -> Response:
        cookie, csrf = self.signer.new_sign_in_form()
        context = {"signed_in": False, "csrf_token": csrf, "next": _safe_next(next_path), "error": error}
        page = self.render(request, "sign_in.html", context, status_code=status)
        self._set_cookie(page, self.signer.pre_cookie_name, cookie, SIGN_IN_FORM_SECONDS)
        return page

    def _set_cookie(self, response: Response, name: str, value: str, max_age: int) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path="/",
            secure=self.signer.secure,
            httponly=True,
            samesite="strict",
        )

    # ------------------------------------------------------------------------------------------- install

    def install(self, app: FastAPI) -> None:
        """Mount the console's routes and its security headers on ``app`` (after the service's own pages
        were added to ``self.router``)."""
        app.state.console = self
        app.include_router(self.router)
        app.add_middleware(ConsoleHeaders)


def _num(value: Any, digits: int = 4) -> str:
    """A number for a table: integers as is, floats to ``digits`` significant digits, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)
