"""Scrapy's request fingerprints, at a fraction of their cost where the bytes are sure.

Every request a worker enqueues is fingerprinted once, and Scrapy's default
fingerprinter spends most of its ~20 µs on ``w3lib.url.canonicalize_url`` parsing a URL
that, for most links of a crawl, is already canonical, then on ``json.dumps`` and a
weak-keyed cache (benchmarks/RESULTS.md, session 16). :class:`SameFingerprinter`
computes the very same SHA1 for requests whose URL is of a shape ``canonicalize_url``
is known to leave as it is (or only to sort the query of), and hands every other
request to Scrapy's fingerprinter. The bytes must be identical: a fleet whose workers
fingerprinted a URL two ways would crawl it twice, and a fingerprint is also what
Scrapy's HTTP cache and a user's own code key by.

Three guards keep them identical:

- only Scrapy's own :class:`~scrapy.utils.request.RequestFingerprinter`, using Scrapy's
  own ``fingerprint`` function, is short-cut; any other fingerprinter is called as is;
- when one is built, a probe set of requests is fingerprinted both ways, and any
  difference (another Scrapy or w3lib version computing otherwise) turns the short
  cut off for good, with a log line;
- per request, the short cut takes only a plain shape: ``http``/``https``, a lowercase
  host of letters, digits, dots and hyphens (or a dotted-quad IPv4 address), perhaps
  a port, a path of unreserved characters, ``/`` and upper-case escapes of non-ASCII
  bytes or spaces with no dot segment, and perhaps a query of ``name=value`` pairs of
  unreserved characters; no fragment, no ``verbatim_url`` meta.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.utils import request as scrapy_request

if TYPE_CHECKING:
    from scrapy.utils.request import RequestFingerprinterProtocol

logger = logging.getLogger(__name__)

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#: A host name whose last label holds a letter, or an IPv4 address as four decimal
#: numbers: other numeric spellings ("127.1", "0x7f.1") are ones URL parsers
#: normalise differently, so they take the long way.
_HOST = rf"(?:(?:{_LABEL}\.)*(?=[a-z0-9-]*[a-z]){_LABEL}|(?:{_OCTET}\.){{3}}{_OCTET})"
_UNRESERVED = r"A-Za-z0-9._~\-"
#: Percent escapes canonicalize_url writes back as they are: upper-case hex of a byte
#: it always escapes (non-ASCII, e.g. UTF-8 text, or a space). Others it may decode
#: ("%41" is "A"), or treat apart ("%2F", "%25"), as its versions differ.
_ESCAPE = r"%(?:[89A-F][0-9A-F]|20)"
#: A URL the short cut may take: group 1 is everything up to the path's end, group 2
#: the port (if any), group 3 the query (if any).
_PLAIN_URL = re.compile(
    rf"(https?://{_HOST}(?::([1-9][0-9]{{0,4}}))?"
    rf"/(?:[{_UNRESERVED}/]|{_ESCAPE})*)(?:\?([{_UNRESERVED}=&]*))?"
)
_PAIR = re.compile(rf"[{_UNRESERVED}]+=[{_UNRESERVED}]*")
#: Methods JSON writes as they are (Scrapy upper-cases a request's method).
_METHODS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: Requests fingerprinted both ways when a :class:`SameFingerprinter` is built.
_PROBES = (
    ("GET", "http://example.com/", b""),
    ("GET", "https://h1.example:8080/p/12/a-b_c.d~e", b""),
    ("GET", "http://example.com:80/", b""),
    ("GET", "http://127.0.0.2:8080/p/1", b""),
    ("GET", "http://example.com/caf%C3%A9/a%20b", b""),
    ("POST", "http://shop.example/cart/add", b'{"id": 7}'),
    ("GET", "http://shop.example/list?page=2&cat=shoes&sort=", b""),
    ("GET", "http://shop.example/list?b=2&a=1&a=0", b""),
)


def _canonical_plain_url(url: str) -> str | None:
    """``url`` as ``canonicalize_url`` writes it, when it has the plain shape; else None."""
    match = _PLAIN_URL.fullmatch(url)
    if match is None or "/." in url:
        return None
    port, query = match.group(2, 3)
    if port is not None and int(port) > 65535:
        return None
    if query is None:
        return url
    pairs = query.split("&")
    if not all(_PAIR.fullmatch(pair) for pair in pairs):
        return None
    if len(pairs) > 1:
        # canonicalize_url sorts (name, value) pairs; by the pair string, "a=1"
        # would sort after "a-b=0" though name "a" sorts first.
        pairs = ["=".join(pair) for pair in sorted(pair.split("=", 1) for pair in pairs)]
    return f"{match.group(1)}?{'&'.join(pairs)}"


def _short_fingerprint(method: str, url: str, body: bytes) -> bytes | None:
    if method not in _METHODS:
        return None
    canonical = _canonical_plain_url(url)
    if canonical is None:
        return None
    # json.dumps(..., sort_keys=True) of Scrapy's fingerprint data: none of these
    # values holds a character JSON escapes.
    data = (f'{{"body": "{body.hex()}", "headers": {{}}, '
            f'"method": "{method}", "url": "{canonical}"}}')
    return hashlib.sha1(data.encode()).digest()


class SameFingerprinter:
    """The fingerprints of ``inner``, computed without it for plain requests.

    Implements Scrapy's ``RequestFingerprinterProtocol``. ``short_cuts`` counts the
    requests fingerprinted without ``inner`` (read by tests and benchmarks).
    """

    def __init__(self, inner: RequestFingerprinterProtocol) -> None:
        self.inner = inner
        self.short_cuts = 0
        self.enabled = _is_scrapys_default(inner) and _probes_agree(inner)

    def fingerprint(self, request: Request) -> bytes:
        if self.enabled and not request.meta.get("verbatim_url"):
            short = _short_fingerprint(request.method, request.url, request.body)
            if short is not None:
                self.short_cuts += 1
                return short
        return bytes(self.inner.fingerprint(request))


def same_fingerprinter(inner: RequestFingerprinterProtocol) -> RequestFingerprinterProtocol:
    """``inner`` wrapped in a :class:`SameFingerprinter` (once: a wrapped one is kept)."""
    return inner if isinstance(inner, SameFingerprinter) else SameFingerprinter(inner)


def _is_scrapys_default(fingerprinter: RequestFingerprinterProtocol) -> bool:
    return (type(fingerprinter) is scrapy_request.RequestFingerprinter
            and getattr(fingerprinter, "_fingerprint", None) is scrapy_request.fingerprint)


def _probes_agree(fingerprinter: RequestFingerprinterProtocol) -> bool:
    for method, url, body in _PROBES:
        request = Request(url, method=method, body=body)
        if _short_fingerprint(request.method, request.url, request.body) != bytes(
            fingerprinter.fingerprint(request)
        ):
            logger.info("redisspine: Scrapy's fingerprints of plain URLs differ from this "
                        "version's expectation (%s); every request takes Scrapy's own "
                        "fingerprinter", url)
            return False
    return True
