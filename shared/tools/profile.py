"""Where the ``pobo curator ...`` and ``pobo study ...`` commands find a service's URL and token: the
environment (``POBO_CURATOR_URL`` / ``POBO_CURATOR_TOKEN``, ``POBO_MODELER_URL`` / ``POBO_MODELER_TOKEN``),
else a profile file, never the command line (a token in an argument ends up in the shell's history and in
``ps``).

The profile is TOML at ``$POBO_PROFILE``, else ``$XDG_CONFIG_HOME/pobo/profile.toml`` (``~/.config`` when
``XDG_CONFIG_HOME`` is unset)::

    [curator]
    url = "https://curator.example.org:8001"
    token = "<admin token>"

    [modeler]
    url = "https://modeler.example.org:8002"
    token = "<modeler token>"
    partner_token = "<the curator's partner token, for `pobo study create`>"

It holds tokens, so it must be readable by its owner alone (mode 0600): any other mode is refused, with the
``chmod`` that fixes it. A value in the environment wins over the profile's.
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import PoboError

__all__ = ["Endpoint", "ProfileError", "endpoint", "partner_token", "profile_path"]

#: The environment variables of each side: (URL, token).
ENV = {
    "curator": ("POBO_CURATOR_URL", "POBO_CURATOR_TOKEN"),
    "modeler": ("POBO_MODELER_URL", "POBO_MODELER_TOKEN"),
}
PARTNER_ENV = "POBO_PARTNER_TOKEN"


class ProfileError(PoboError):
    """A URL or token is missing, or the profile file is unsafe or unreadable."""


@dataclass(frozen=True)
class Endpoint:
    """A service's URL and token (the token never in ``repr``)."""

    url: str
    token: str

    def __repr__(self) -> str:
        return f"Endpoint(url={self.url!r})"


def profile_path() -> Path:
    """``$POBO_PROFILE``, else ``$XDG_CONFIG_HOME/pobo/profile.toml`` (default ``~/.config``)."""
    explicit = os.environ.get("POBO_PROFILE")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "pobo" / "profile.toml"


def _read_profile() -> tuple[Path, dict[str, Any]]:
    path = profile_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        if os.environ.get("POBO_PROFILE"):
            raise ProfileError(f"POBO_PROFILE names {path}, which does not exist") from None
        return path, {}
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ProfileError(
            f"the profile {path} holds tokens but is readable by others (mode {mode:04o}); "
            f"make it private with: chmod 600 {path}"
        )
    try:
        return path, tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"cannot read the profile {path}: {exc}") from None


def endpoint(side: str) -> Endpoint:
    """The URL and token of ``side`` (``"curator"`` or ``"modeler"``): the environment, else the profile."""
    url_var, token_var = ENV[side]
    url, token = os.environ.get(url_var), os.environ.get(token_var)
    path = profile_path()
    if not (url and token):
        path, profile = _read_profile()
        section = profile.get(side, {})
        url, token = url or section.get("url"), token or section.get("token")
    if not (url and token):
        raise ProfileError(
            f"no {side} URL and token: set {url_var} and {token_var}, or write them as url and token under "
            f"[{side}] in {path} (mode 0600)"
        )
    return Endpoint(str(url).rstrip("/"), str(token))


def partner_token() -> str | None:
    """The partner token a new study gives its curator: ``$POBO_PARTNER_TOKEN``, else the profile's
    ``[modeler] partner_token``, else None (the command then asks for it without echo)."""
    token = os.environ.get(PARTNER_ENV)
    if token:
        return token
    _, profile = _read_profile()
    value = profile.get("modeler", {}).get("partner_token")
    return str(value) if value else None
