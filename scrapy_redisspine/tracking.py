"""Tracking parameters out, canonical form in: the URL a request is fingerprinted by.

``https://Shop.example:443/item?utm_source=mail&id=7&gclid=x#reviews`` and
``https://shop.example/item?id=7`` are one page to a crawl, so with
``REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS`` both are fingerprinted as the second. Only
the fingerprint changes: the request still fetches the URL it was given. The query
is split and sorted as raw text (never decoded and re-encoded), so a parameter's
encoding is kept exactly as the site wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

#: Stripped by default. A name ending in ``*`` is a prefix.
DEFAULT_TRACKING_PARAMS: tuple[str, ...] = (
    "utm_*",      # Google Analytics campaign tags
    "gclid",      # Google Ads click id
    "gbraid",
    "wbraid",
    "dclid",      # DoubleClick click id
    "fbclid",     # Facebook click id
    "msclkid",    # Microsoft Ads click id
    "yclid",      # Yandex click id
    "mc_cid",     # Mailchimp campaign / member ids
    "mc_eid",
    "igshid",     # Instagram share id
)

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


@dataclass(frozen=True)
class TrackingParams:
    """Which query parameters to drop: exact names and prefixes, case-insensitive."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def from_list(cls, entries: tuple[str, ...] | list[str]) -> TrackingParams:
        names = {entry.lower() for entry in entries if not entry.endswith("*")}
        prefixes = tuple(entry[:-1].lower() for entry in entries if entry.endswith("*"))
        return cls(frozenset(names), prefixes)

    def matches(self, name: str) -> bool:
        lowered = name.lower()
        return lowered in self.names or lowered.startswith(self.prefixes)


def tracking_params(extra: tuple[str, ...] = ()) -> TrackingParams:
    """The default list plus the user's ``REDISSPINE_DEDUP_EXTRA_TRACKING_PARAMS``."""
    return TrackingParams.from_list(DEFAULT_TRACKING_PARAMS + tuple(extra))


#: URLs already in canonical form, which :func:`canonical_url` returns as they are:
#: lowercase scheme and ASCII host, no userinfo, no port, a path, no query, no
#: fragment, nothing urlsplit would strip (controls, spaces). Most links of a crawl
#: look so, and parsing one costs about as much as Scrapy's fingerprint of it.
_CANONICAL = re.compile(r"[a-z][a-z0-9+.-]*://[a-z0-9._-]+/[^?#\x00-\x20\x7f]*")


def canonical_url(url: str, strip: TrackingParams) -> str:
    """``url`` without tracking parameters, fragment and default port; host lowercase,
    query sorted. URLs this cannot parse are returned unchanged."""
    if _CANONICAL.fullmatch(url):
        return url
    return _canonical_url(url, strip)


def _canonical_url(url: str, strip: TrackingParams) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url
    scheme = parts.scheme.lower()
    netloc = (parts.hostname or "").lower()
    if parts.hostname and ":" in parts.hostname:
        netloc = f"[{netloc}]"  # IPv6 literal
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    if parts.username is not None or parts.password is not None:
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{netloc}"
    pairs = [pair for pair in parts.query.split("&") if pair]
    kept = sorted(pair for pair in pairs if not strip.matches(unquote(pair.split("=", 1)[0])))
    return urlunsplit((scheme, netloc, parts.path or "/", "&".join(kept), ""))
