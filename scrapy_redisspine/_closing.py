"""Closing a worker: what it holds goes back to the fleet, or is said to be lost.

On close the worker sends what waits in its outbox, returns its unstarted leases to
the queue (as they were: priority, position), buries the leases of requests it held
in memory only (they cannot be handed back: the dead letters say so), notes in the
crawl record that the crawl finished (or deletes the crawl, persistence off), and
leaves. A short outage is retried; a long one is said, with what stays in Redis for
the other workers' sweeps.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine._local import LocalQueue
    from scrapy_redisspine._outbox import Outbox
    from scrapy_redisspine.settings import SpineConfig
    from scrapy_redisspine.sharded import AnyFrontier

logger = logging.getLogger("scrapy_redisspine.scheduler")

_CLOSE_ATTEMPTS = 5
_LOCAL_LOST = ("this worker closed before it fetched the request it held in memory (it "
               "could not be stored)")


class HandBack:
    """Hands a closing worker's buffers and leases back to the fleet."""

    def __init__(
        self, *, frontier: AnyFrontier, outbox: Outbox, book: LeaseBook, local: LocalQueue,
        guard: RedisGuard, stats: StatsCollector, config: SpineConfig,
    ) -> None:
        self._frontier = frontier
        self._outbox = outbox
        self._book = book
        self._local = local
        self._guard = guard
        self._stats = stats
        self._config = config

    def hand_back(self, reason: str, *, start_done: bool = False) -> None:
        """Send what is buffered, return unstarted leases, leave; retry a short outage.
        A full Redis is not a down one: new discoveries are shed (counted, logged) and
        the rest goes at once, since what is left needs no room (the scripts write a
        non-"denyoom" command first).

        ``start_done``: the spider's start requests were all produced. The worker then
        stops holding the fleet open as "starting" (it may close before its first
        heartbeat noted it, e.g. at a page budget): else the next workers of the crawl
        would wait for its entry to age past the worker timeout before they finish. A
        worker whose start was cut short keeps its entry until then, as before."""
        cause = "unreachable"
        for attempt in range(_CLOSE_ATTEMPTS):
            try:
                self._outbox.flush()
                self._release_unstarted()
                if reason == "finished":
                    self._note_finished()
                if start_done:
                    self._frontier.done_starting()
                self._frontier.leave()
                return
            except redis.exceptions.OutOfMemoryError as exc:
                cause = "full (out of memory)"
                self._outbox.shed_buffered()  # what is left needs no room
                self._guard.failed("close", exc)
            except redis.RedisError as exc:
                cause = "unreachable"
                self._guard.failed("close", exc)
                time.sleep(0.2 * 2**attempt)
        logger.error(
            "redisspine: Redis %s while closing: %d unsent request(s) of this "
            "worker are lost; its %d lease(s) stay in Redis and will be requeued by the "
            "other workers' sweeps", cause, len(self._outbox),
            self._book.ready + self._book.handed_out,
        )

    def _note_finished(self) -> None:
        """The crawl is done fleet-wide: say so in its record, or delete it."""
        if self._config.persist:
            self._frontier.mark_finished()
        elif self._frontier.upkeep.purge_if_done(self._frontier.epoch,
                                                 self._config.worker_timeout_ms):
            logger.info("redisspine: crawl finished; its keys deleted (persist off)")

    def _release_unstarted(self) -> None:
        handles = self._book.take_all()
        local = [handle for handle in handles if handle[0] in self._local.keys]
        lost = self._local.lost() + len(local)
        if lost:
            logger.error(
                "redisspine: %d request(s) that could not be stored in Redis are lost with "
                "this worker (they lived in its memory only)", lost,
            )
            self._stats.inc_value("redisspine/scheduler/local_lost", lost)
        for handle in local:  # their markers go to the dead letters, with the reason
            self._frontier.bury(handle, _LOCAL_LOST)
        handles = [handle for handle in handles if handle[0] not in self._local.keys]
        if handles:
            released = self._frontier.release(handles)
            self._guard.repaired("release", released.repairs)
            self._stats.inc_value("redisspine/scheduler/released", released)
            logger.info("redisspine: returned %d unstarted lease(s) to the queue", released)
