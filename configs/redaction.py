"""Secrets out of what is shown: the credentials of a URL (`scheme://user:password@host/...`, an SQLAlchemy
URI or an HTTP URL alike) wherever one appears in a text. Every printed line, MLflow param and tag, and error
that may carry a tracking URI, a reward URL or a raw override goes through `redacted`; a child server is
given its backend URI through the environment, never on its command line."""

from __future__ import annotations

import re

# scheme://userinfo@ : a password after the user's name, or a user part alone (often a token)
CREDENTIALS = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/:@]*)(?P<password>:[^\s/@]*)?@")
HIDDEN = "***"


def redacted(text: str) -> str:
    """`text` with each URL's password replaced by `***` (`user:***@`), or its user part where it has no
    password (`***@`: a token given as the user)."""
    return CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user'] + ':' + HIDDEN if m['password'] else HIDDEN}@", text)


def logged(value: object, limit: int = 6000) -> str:
    """A value as an MLflow param or tag holds it: as text, redacted, cut to `limit` characters."""
    return redacted(str(value))[:limit]
