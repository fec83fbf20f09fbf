"""The worker's clock and timers: ticks that survive exceptions, stop and restart
cleanly, and run on a bare asyncio loop when Scrapy runs without Twisted's reactor."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from scrapy_redisspine._clock import Periodic


def _stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(get_crawler())


def test_periodic_ticks_every_interval_and_survives_what_its_function_raises() -> None:
    clock = Clock()
    calls: list[float] = []

    def work() -> None:
        calls.append(clock.seconds())
        if len(calls) == 2:
            raise ValueError("bad value in a key")

    stats = _stats()
    periodic = Periodic("sweep", work, 1.0, clock, stats)
    periodic.start()
    assert periodic.running
    clock.advance(0.5)
    assert calls == [], "the first tick comes one interval after start"
    clock.advance(0.5)
    for _ in range(3):
        clock.advance(1.0)
    assert calls == [1.0, 2.0, 3.0, 4.0]
    assert stats.get_value("redisspine/errors/sweep") == 1


def test_periodic_stopped_from_its_own_tick_stays_stopped_and_can_start_again() -> None:
    clock = Clock()
    calls: list[float] = []
    periodic: Periodic

    def work() -> None:
        calls.append(clock.seconds())
        periodic.stop()

    periodic = Periodic("heartbeat", work, 1.0, clock, _stats())
    periodic.start()
    periodic.start()  # twice: still one timer
    clock.advance(1.0)
    clock.advance(5.0)
    assert calls == [1.0]
    assert not periodic.running
    assert not clock.getDelayedCalls()
    periodic.start()
    clock.advance(1.0)
    assert calls == [1.0, 7.0]


def test_periodic_restarted_from_its_own_tick_keeps_one_timer() -> None:
    clock = Clock()
    periodic: Periodic

    def work() -> None:
        periodic.stop()
        periodic.start()

    periodic = Periodic("feed", work, 1.0, clock, _stats())
    periodic.start()
    clock.advance(1.0)
    assert len(clock.getDelayedCalls()) == 1


def test_crawl_clock_runs_on_a_bare_asyncio_loop_without_importing_the_reactor() -> None:
    # In a process of its own: this one has Twisted's reactor imported already.
    # Scrapy's reactorless mode forbids the import with a hook; so does this script.
    script = textwrap.dedent("""
        import asyncio, sys
        from scrapy.statscollectors import MemoryStatsCollector
        from scrapy.utils.reactorless import install_reactor_import_hook
        install_reactor_import_hook()
        from scrapy_redisspine._clock import CrawlClock, Periodic

        class Stats:
            def inc_value(self, key, count=1):
                print("error", key)

        async def main():
            clock = CrawlClock()
            fired = []
            call = clock.callLater(0.01, fired.append, "once")
            assert call.active()
            cancelled = clock.callLater(0.01, fired.append, "cancelled")
            cancelled.cancel()
            assert not cancelled.active()
            ticks = []
            periodic = Periodic("sweep", lambda: ticks.append(1) or 1 / (len(ticks) - 1),
                                0.01, clock, Stats())
            periodic.start()
            await asyncio.sleep(0.2)
            periodic.stop()
            assert fired == ["once"], fired
            assert not call.active()
            assert len(ticks) >= 3, ticks
            assert "twisted.internet.reactor" not in sys.modules
            print("ok", len(ticks))

        asyncio.run(main())
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "error redisspine/errors/sweep", lines  # the ZeroDivisionError
    assert lines[-1].startswith("ok "), lines
