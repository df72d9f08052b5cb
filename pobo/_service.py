"""What ``pobo.Curator`` and ``pobo.Modeler`` share: one typed client of a service, closed with them."""

from __future__ import annotations

from typing import ClassVar, Generic, Self, TypeVar

from shared.protocol.client.apiclient import ApiClient

C = TypeVar("C", bound=ApiClient)


class Service(Generic[C]):
    """A service at ``url``, reached with ``token`` through its typed client (``client``, for anything the
    SDK does not wrap). Use as a context manager, or call :meth:`close`."""

    #: How ``repr`` names the class (``pobo.Curator``); never the token.
    _label: ClassVar[str]
    client: C

    def __init__(self, client: C, url: str) -> None:
        self.client = client
        self.url = url.rstrip("/")

    def __repr__(self) -> str:  # never shows the token
        return f"{self._label}({self.url!r})"

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Service"]
