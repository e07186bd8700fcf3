"""Which URLs the load generator may send to: loopback only.

A load test here must never leave the machine, so every target (the QA endpoint and the
metrics endpoint) is checked before the first byte is sent. Host names are not resolved:
only the literal ``localhost``, an IPv4 address in 127.0.0.0/8, or ``::1`` pass.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost"})


class TargetNotAllowed(ValueError):
    """The URL is malformed or names a host outside the loopback range."""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` written literally."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(url: str) -> str:
    """``url`` unchanged if it is an http(s) URL on a loopback host; else TargetNotAllowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetNotAllowed(f"only http(s) URLs are allowed, got {url!r}")
    host = parts.hostname
    if not host:
        raise TargetNotAllowed(f"no host in {url!r}")
    if not is_loopback_host(host):
        raise TargetNotAllowed(
            f"refusing to load-test {host!r}: only 127.0.0.0/8, localhost and ::1 are allowed"
        )
    return url
