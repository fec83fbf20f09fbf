"""When a crawl will be done, as ``redisspine status`` says it: politeness included.

The fleet's rate alone lies when the work left sits on a few slow lanes: 110 requests
queued at 500 a minute look like 13 s, but if 92 of them wait on a host with a 1 s
Crawl-delay, the crawl needs at least 92 s. So the ETA is the longer of the two: the
queue at the fleet's rate, and the slowest lane's backlog at its own pace (its delay
per request, over its concurrency). There is none while the fleet is paused or
draining, when nothing is queued or no worker runs, and none for a finished crawl.

Keys read: host_delay, lane_limits (HMGET of the lanes the backlog scan found).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.politeness import NO_HOST_LANE

if TYPE_CHECKING:
    from collections.abc import Mapping

    import redis

    from scrapy_redisspine.keys import CrawlKeys


@dataclass(frozen=True)
class LanePace:
    """What the workers' settings say about each lane's pace (the Redis side adds
    Crawl-delays and lane limits): from the project's settings when the command runs
    inside the project, else Scrapy's defaults (no delay, one at a time)."""

    default_delay_seconds: float = 0.0
    lane_delays: Mapping[str, float] = field(default_factory=dict)
    concurrency: int = 1

    def seconds_per_request(self, lane: str, crawl_delay: float | None, limit: int) -> float:
        if lane == NO_HOST_LANE:
            return 0.0
        delay = max(self.lane_delays.get(lane, self.default_delay_seconds), crawl_delay or 0.0)
        return delay / max(1, limit or self.concurrency)


def _float(value: bytes | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def slowest_lane(
    client: redis.Redis, keys: CrawlKeys, backlog: Mapping[str, int], pace: LanePace
) -> dict[str, Any] | None:
    """The lane whose backlog takes longest at its own pace, or None (no lane rests)."""
    lanes = [lane for lane, queued in backlog.items() if queued > 0]
    if not lanes:
        return None
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.host_delay, lanes)
    pipe.hmget(keys.lane_limits, lanes)
    delays, limits = pipe.execute()
    slowest: dict[str, Any] | None = None
    for lane, crawl_delay, limit in zip(lanes, delays, limits, strict=True):
        per_request = pace.seconds_per_request(lane, _float(crawl_delay),
                                               int(_float(limit) or 0))
        seconds = backlog[lane] * per_request
        if seconds > 0 and (slowest is None or seconds > slowest["seconds"]):
            slowest = {"lane": lane, "backlog": backlog[lane],
                       "seconds_per_request": round(per_request, 3), "seconds": round(seconds)}
    return slowest


def eta(
    status: Mapping[str, Any], rate_per_minute: float | None, slowest: dict[str, Any] | None
) -> tuple[int | None, str | None]:
    """(seconds, what bounds them: ``rate`` or ``politeness``), or (None, None) when
    there is no honest answer: finished, paused, draining, nothing queued, no worker."""
    if (status["state"] in ("finished", "paused", "draining") or not status["queued"]
            or not status["workers_alive"]):
        return None, None
    by_rate = round(status["queued"] * 60 / rate_per_minute) if rate_per_minute else None
    by_lane = slowest["seconds"] if slowest else None
    if by_lane is not None and (by_rate is None or by_lane > by_rate):
        return int(by_lane), "politeness"
    return by_rate, "rate" if by_rate is not None else None
