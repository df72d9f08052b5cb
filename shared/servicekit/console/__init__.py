"""The browser console's frame both services share (templates, assets, sign-in, session, CSRF, charts)."""

from shared.servicekit.console.kit import Console, ConsoleHeaders, ConsoleRefusal, FormPost, SignedIn

__all__ = ["Console", "ConsoleHeaders", "ConsoleRefusal", "FormPost", "SignedIn"]
