"""Typed errors raised by the pure library; the services map them to HTTP in one place each.

Messages state what was expected and what was got (``"epsilon must be > 0, got -1.0"``) and never quote a
raw data value of a dataset row.
"""

from __future__ import annotations


class PoboError(Exception):
    """Base class of every error pobo raises on purpose."""


class InputDataError(PoboError, ValueError):
    """Input data (an array, a CSV, a parameter) is malformed: wrong shape, non-finite, out of range."""


class PrivacyBudgetExceeded(PoboError):
    """A release would push a dataset past its (epsilon, delta) budget under basic composition."""


class StrategyError(PoboError, RuntimeError):
    """The optimization strategy cannot proceed (e.g. every candidate has been queried)."""
