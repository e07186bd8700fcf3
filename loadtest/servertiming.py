"""Parsing the ``Server-Timing`` response header (W3C Server Timing)."""

from __future__ import annotations


def _split_unquoted(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` where it is not inside a double-quoted string."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def _duration(params: list[str]) -> float | None:
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "dur":
            try:
                return float(value.strip().strip('"'))
            except ValueError:
                return None
    return None


def parse_server_timing(header: str) -> dict[str, float]:
    """Phase name -> duration in milliseconds, for every metric that carries ``dur``.

    ``tokenize;dur=0.41, infer;dur=3.20, total;dur=3.90`` gives
    ``{"tokenize": 0.41, "infer": 3.2, "total": 3.9}``. Metrics without a numeric ``dur`` are
    left out; a repeated name keeps its first value, as the spec says. Quoted ``desc`` values
    may contain commas and semicolons.
    """
    phases: dict[str, float] = {}
    for metric in _split_unquoted(header, ","):
        name, *params = _split_unquoted(metric, ";")
        name = name.strip()
        dur = _duration(params)
        if name and dur is not None and name not in phases:
            phases[name] = dur
    return phases
