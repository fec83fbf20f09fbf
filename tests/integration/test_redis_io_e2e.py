"""A worker's Redis calls run off the crawl's loop (issue 14): a Redis that stops
answering for longer than the call timeout never stops a download in progress, both
ways the worker can do that: calls parked on the loop in greenlets (the default, issue
19) and calls on threads of their own (``REDISSPINE_REDIS_GREENLETS = False``).

Real ``scrapy crawl`` workers, a real redis-server frozen with SIGSTOP. The test
project's ``LoopLag`` extension logs each response as it reaches the engine (wall
clock) and, at close, the longest the crawl's loop went without running a timer.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.testing.redis_server import RedisServer, free_port
from tests.integration.crawlproc import (
    assert_exactly_once,
    assert_finished,
    wait_for,
    wait_workers,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

CALL_TIMEOUT = 2.0
FREEZE = 5.0
SLOW = 3.0  # the start pages take this long: their downloads span the freeze
_RECEIVED = re.compile(r"testproject: response (\S+) received at ([0-9.]+)")
_LAG = re.compile(r"testproject: loop lag max ([0-9.]+) s")


def _crawl(fleet: Fleet, site_factory: SiteFactory, calls: str, *,
           tls_dir: Path | None = None, **extra: Any) -> tuple[
        dict[str, float], float, tuple[float, float], Any]:
    """One worker on a site whose start pages are slow; Redis frozen for FREEZE s
    from just after the worker started fetching them; its Redis calls made as
    ``calls`` says (the stat ``redisspine/redis/calls``); with ``tls_dir``, over TLS
    (a self-signed certificate made there). (response url -> time it reached the
    engine, the loop's worst lag, the freeze's (start, end), the site)."""
    site = site_factory(hosts=2, pages_per_host=6, slow_paths=["/p/0"], slow_latency=SLOW)
    server, url = _server(tls_dir)
    with server:
        settings = fleet.crawling(
            site, REDISSPINE_REDIS_URL=url(), LINKS_REPORT_LOOP_LAG=True,
            REDISSPINE_REDIS_TIMEOUT_SECONDS=CALL_TIMEOUT, **extra)
        [worker] = fleet.start(1, settings)
        wait_for(lambda: "joined crawl" in worker.log_text(), 60, "the worker to join")
        time.sleep(0.5)  # its start pages are leased and on their way
        assert server.pid is not None
        frozen_at = time.time()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        thawed_at = time.time()
        [result] = wait_workers([worker], timeout=120)
    assert_finished([result])
    assert_exactly_once(site)
    assert result.stats.get("redisspine/redis/calls") == calls, result.stats
    # calls timed out in the freeze (Redis ran them after the thaw, replies unread):
    # reconciled, since every page was fetched once and the crawl finished
    timed_out = {name: n for name, n in result.stats.items()
                 if name.startswith("redisspine/redis_errors/")}
    assert timed_out, sorted(result.stats)
    received = {url: float(at) for url, at in _RECEIVED.findall(result.log)}
    lag = _LAG.search(result.log)
    assert lag is not None, result.log[-3000:]
    return received, float(lag.group(1)), (frozen_at, thawed_at), site


def _server(tls_dir: Path | None) -> tuple[RedisServer, Callable[[], str]]:
    """A throwaway redis-server and its URL (asked once it runs); with ``tls_dir``,
    its TLS port (``rediss://``, the client checks the server's certificate)."""
    if tls_dir is None:
        plain = RedisServer()
        return plain, lambda: plain.url
    cert, key = tls_dir / "server.crt", tls_dir / "server.key"
    _self_signed(cert, key)
    tls_port = free_port()
    server = RedisServer(extra_args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file",
        str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"])
    return server, lambda: f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"


def _self_signed(cert: Path, key: Path) -> None:
    """A certificate for 127.0.0.1 that signs itself (the client trusts it as its CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


@pytest.mark.parametrize("greenlets", [True, False], ids=["greenlets", "threads"])
def test_a_download_in_progress_completes_while_redis_is_frozen(
    fleet: Fleet, site_factory: SiteFactory, greenlets: bool
) -> None:
    received, lag, (frozen_at, thawed_at), site = _crawl(
        fleet, site_factory, "greenlets" if greenlets else "threads",
        REDISSPINE_REDIS_GREENLETS=greenlets)
    starts = site.start_urls()
    served = {record["page"]: record["end"] for record in site.requests() if record.get("page")}
    for url in starts:
        # the site answered during the freeze, and the worker took the response in
        # at once (its loop was not waiting on Redis)
        assert frozen_at < served[url] < thawed_at, (url, served[url], frozen_at, thawed_at)
        assert frozen_at < received[url] < thawed_at, (url, received[url], frozen_at)
        assert received[url] - served[url] < 1.0, (url, received[url] - served[url])
    # no call held the loop for its timeout (CALL_TIMEOUT s) while Redis was frozen
    assert lag < CALL_TIMEOUT / 2, lag


def test_over_tls_a_frozen_redis_stops_no_download_either(
    fleet: Fleet, site_factory: SiteFactory, tmp_path: Path
) -> None:
    # A TLS socket parks as a plain one does (its reads want more bytes, its
    # handshake runs on the connect's thread): the same freeze, over rediss://.
    received, lag, (frozen_at, thawed_at), site = _crawl(
        fleet, site_factory, "greenlets", tls_dir=tmp_path)
    for url in site.start_urls():
        assert frozen_at < received[url] < thawed_at, (url, received[url], frozen_at)
    assert lag < CALL_TIMEOUT / 2, lag


def test_on_the_loop_a_frozen_redis_holds_every_download_for_the_call_timeout(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    # The control: with REDISSPINE_REDIS_THREAD = False the same freeze stops the
    # loop for a whole call timeout at least once (what the thread is for).
    _, lag, _, _ = _crawl(fleet, site_factory, "inline", REDISSPINE_REDIS_THREAD=False)
    assert lag >= CALL_TIMEOUT * 0.9, lag


def test_under_a_reactor_without_asyncio_the_calls_keep_their_threads(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    # Greenlets park on asyncio's loop; Twisted's epoll reactor has none, so the
    # worker falls back to its Redis threads and crawls as before.
    site = site_factory(hosts=2, pages_per_host=8)
    with RedisServer() as server:
        settings = fleet.crawling(
            site, REDISSPINE_REDIS_URL=server.url,
            TWISTED_REACTOR="twisted.internet.epollreactor.EPollReactor")
        results = fleet.run(1, settings, timeout=120)
    assert_finished(results)
    assert_exactly_once(site)
    assert results[0].stats.get("redisspine/redis/calls") == "threads", results[0].stats
