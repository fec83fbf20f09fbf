"""The scheduler's life in the fleet: heartbeats, orders, fencing, fleet counts.

Timers keep a worker known to the fleet (heartbeat) and awake when it has nothing
to do (idle poll); the heartbeat also reads the fleet's pause/drain orders and
learns when a sweep took this worker for dead (fencing).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from twisted.internet import task

from scrapy_redisspine._sched_outbox import OutboxMixin
from scrapy_redisspine._sched_state import logger
from scrapy_redisspine.control import close_spider, read_orders


class FleetMixin(OutboxMixin):
    """The fleet part of ``scheduler.Scheduler``."""

    def _release_orphans(self) -> None:
        assert self.frontier is not None
        known = [key for _, (key, _) in self._ready]
        known += [key for key, _ in self._handed_out.values()]
        known += [ack[0] for ack in self._acks]
        released = self.frontier.release_orphans(known)
        self._reconcile_leases = False
        if released:
            logger.warning(
                "redisspine: returned %d lease(s) this worker did not hold (a lease reply "
                "or an ack lost in the outage)",
                released,
            )

    def _refresh_fleet_counts(self) -> None:
        assert self.frontier is not None
        if (self._outbox or self._acks) and not self._try_flush():
            return
        if not self.health.available():
            return
        try:
            queued, inflight = self.frontier.counts()
        except redis.RedisError as exc:
            self._redis_failed("count", exc)
            return
        self.health.succeeded()
        self._set_fleet_counts(queued, inflight, time.monotonic())

    def _set_fleet_counts(self, queued: int, inflight: int, now: float) -> None:
        self._fleet_pending = queued + inflight > 0
        self._fleet_checked_at = now

    def _start_timer(self, function: Any, interval: float) -> None:
        timer = task.LoopingCall(function)
        timer.start(interval, now=False)
        self._timers.append(timer)

    def _on_heartbeat(self) -> None:
        assert self.frontier is not None
        if not self.health.available():
            return
        try:
            known = self.frontier.heartbeat(int(self.config.worker_timeout_seconds * 1000))
        except redis.RedisError as exc:
            self._redis_failed("heartbeat", exc)
            return
        self.health.succeeded()
        if not known:
            self._fenced()
        self._follow_orders()

    def _follow_orders(self) -> None:
        assert self.frontier is not None
        try:
            orders = read_orders(self.frontier.client, self.frontier.keys)
        except redis.RedisError as exc:
            self._redis_failed("control", exc)
            return
        if orders != self.orders:
            logger.info("redisspine: fleet orders now %s", orders)
            if not orders.stop_leasing:
                self.wake()
        self.orders = orders
        idle = not self._handed_out and not self._drain_closing
        if orders.drain and idle and self.crawler is not None:
            self._drain_closing = True
            logger.info("redisspine: draining: nothing in progress, closing")
            close_spider(self.crawler, "drained")

    def _fenced(self) -> None:
        """Another worker's sweep took this one for dead and requeued its leases."""
        self.stats.inc_value("redisspine/scheduler/presumed_dead")
        logger.warning(
            "redisspine: this worker was presumed dead (no heartbeat for over %.0f s) and "
            "its leases were requeued; dropping %d unstarted lease(s), acks of the "
            "requests in progress will be refused", self.config.worker_timeout_seconds,
            len(self._ready),
        )
        # Leases taken after the sweep are still valid: hand them back (release is
        # fenced, so the ones the sweep already requeued are refused).
        handles = [handle for _, handle in self._ready]
        self._ready.clear()
        for key, _ in handles:
            self._lanes.pop(key, None)
        if handles and self.frontier is not None:
            try:
                self.frontier.release(handles)
            except redis.RedisError as exc:
                self._redis_failed("release", exc)

    def wake(self) -> None:
        """New work may be in Redis (e.g. requeued by a sweep): lease soon."""
        self._last_empty_lease = 0.0
        if self._hooks is not None:
            self._hooks.wake()

    def _on_idle_poll(self) -> None:
        if self._outbox or self._acks:
            self._try_flush()
        if not self._ready and self._hooks is not None:
            self._hooks.wake()
