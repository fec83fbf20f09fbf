"""``redisspine metrics``: the fleet as Prometheus metrics, read from Redis per scrape.

Each scrape reads every crawl with :func:`status.read_status`, the same bounded reads
as ``redisspine status`` (so a scrape never blocks Redis on a large crawl, and the
numbers are those of ``status --json``), and turns them into metric families. Names
follow Prometheus conventions: a ``redisspine_`` prefix, the unit in the name,
``_total`` for counters (the fleet's Scrapy counters only ever grow). The docs'
Operations page (``docs/operations.md``) lists them; ``docs/grafana-dashboard.json`` charts them.

Needs ``prometheus_client`` (the ``metrics`` extra); served with the standard
library's WSGI server in the foreground, so Ctrl-C ends it.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine._serving import serve as serve_wsgi
from scrapy_redisspine._serving import wsgi_server
from scrapy_redisspine.status import list_crawls, read_status

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.registry import Collector

    from scrapy_redisspine.keys import CrawlKeys

logger = logging.getLogger(__name__)

#: At most this many crawls when none are named (each costs a status read per scrape).
MAX_CRAWLS = 100
_STATES = ("running", "paused", "draining", "idle", "waiting for workers", "finished")
_NO_HOST = "(no host)"

#: Fleet Scrapy stats with a label of their own: prefix -> (metric, label, help).
_LABELLED_COUNTERS = {
    "downloader/response_status_count/": (
        "redisspine_responses", "status", "Responses received by the fleet, by HTTP status"),
    "downloader/exception_type_count/": (
        "redisspine_download_errors", "type", "Download errors of the fleet, by exception"),
    "spider_exceptions/": (
        "redisspine_spider_errors", "type", "Exceptions raised by the fleet's callbacks"),
}
#: Fleet Scrapy stats as plain counters: stat -> (metric, help).
_COUNTERS = {
    "item_scraped_count": ("redisspine_items_scraped", "Items scraped by the fleet"),
    "item_dropped_count": ("redisspine_items_dropped", "Items dropped by the fleet's pipelines"),
    "downloader/request_count": ("redisspine_downloads", "Requests sent by the fleet's "
                                 "downloaders (retries included)"),
    "log_count/ERROR": ("redisspine_log_errors", "ERROR lines logged by the fleet's workers"),
}
#: Per-crawl gauges read straight from the status: key -> (metric, help).
_GAUGES = {
    "queued": ("redisspine_requests_queued", "Requests queued, fleet-wide"),
    "in_flight": ("redisspine_requests_in_flight", "Requests leased and not yet done"),
    "dead_letters": ("redisspine_dead_letters", "Requests in the dead letters"),
    "workers_alive": ("redisspine_workers_alive", "Workers with a fresh heartbeat"),
    "workers_total": ("redisspine_workers_known", "Workers with a heartbeat entry, "
                      "alive or not yet swept"),
    "workers_starting": ("redisspine_workers_starting", "Live workers whose spider still "
                         "produces start requests"),
    "workers_cut_short": ("redisspine_workers_cut_short", "Workers that stopped while "
                          "their spider still produced start requests"),
    "eta_seconds": ("redisspine_eta_seconds", "Time left, politeness included (absent "
                    "while paused, draining, idle, finished or without workers)"),
}


def _families(statuses: Mapping[str, dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    crawl = ["crawl"]
    gauges = {key: GaugeMetricFamily(name, text, labels=crawl)
              for key, (name, text) in _GAUGES.items()}
    done = CounterMetricFamily("redisspine_requests_done", "Requests done (acked), "
                               "fleet-wide", labels=crawl)
    rate = GaugeMetricFamily("redisspine_acks_per_second", "Acks per second over the "
                             "last minute (absent for a finished crawl)", labels=crawl)
    state = GaugeMetricFamily("redisspine_crawl_state", "1 for the crawl's state",
                              labels=["crawl", "state"])
    dedup_size = GaugeMetricFamily("redisspine_dedup_fingerprints", "Fingerprints in the "
                                   "dedup SET", labels=crawl)
    dedup_bytes = GaugeMetricFamily("redisspine_dedup_memory_bytes", "Memory of the dedup "
                                    "SET and Bloom filter", labels=crawl)
    dedup_mode = GaugeMetricFamily("redisspine_dedup_mode", "1 for the dedup mode",
                                   labels=["crawl", "mode"])
    backlog = GaugeMetricFamily("redisspine_lane_backlog_requests", "Requests queued on "
                                "each of the busiest lanes", labels=["crawl", "lane"])
    busy = GaugeMetricFamily("redisspine_lane_in_flight_requests", "Requests in flight on "
                             "each of the busiest lanes", labels=["crawl", "lane"])
    labelled = {prefix: CounterMetricFamily(name, text, labels=["crawl", label])
                for prefix, (name, label, text) in _LABELLED_COUNTERS.items()}
    counters = {stat: CounterMetricFamily(name, text, labels=crawl)
                for stat, (name, text) in _COUNTERS.items()}
    for name, status in statuses.items():
        for key, family in gauges.items():
            if status[key] is not None:
                family.add_metric([name], status[key])
        done.add_metric([name], status["done"])
        if status["rate_per_minute"] is not None:
            rate.add_metric([name], status["rate_per_minute"] / 60)
        for each in _STATES:
            state.add_metric([name, each], 1.0 if status["state"] == each else 0.0)
        dedup = status["dedup"]
        dedup_size.add_metric([name], dedup["set_size"])
        if dedup["memory_bytes"] is not None:
            dedup_bytes.add_metric([name], dedup["memory_bytes"])
        dedup_mode.add_metric([name, dedup["mode"]], 1.0)
        for host in status["hosts"]:
            backlog.add_metric([name, host["lane"] or _NO_HOST], host["backlog"])
            busy.add_metric([name, host["lane"] or _NO_HOST], host["busy"])
        fleet = status["fleet_stats"]
        for stat, counter in counters.items():
            counter.add_metric([name], fleet.get(stat, 0))
        for stat, value in fleet.items():
            for prefix, by_label in labelled.items():
                if stat.startswith(prefix):
                    by_label.add_metric([name, stat[len(prefix):]], value)
    yield from (*gauges.values(), done, rate, state, dedup_size, dedup_bytes, dedup_mode,
                backlog, busy, *labelled.values(), *counters.values())


def _memory_families(statuses: Mapping[str, dict[str, Any]]) -> Iterator[Any]:
    """The server's memory: one Redis, the same for every crawl on it."""
    from prometheus_client.core import GaugeMetricFamily

    memory = next(iter(statuses.values()))["redis_memory"] if statuses else {}
    for key, name, text in (
        ("used_bytes", "redisspine_redis_memory_used_bytes", "Memory Redis uses"),
        ("max_bytes", "redisspine_redis_maxmemory_bytes", "Redis maxmemory (absent: none)"),
        ("budget_bytes", "redisspine_redis_memory_budget_bytes", "The memory budget the "
         "workers hold Redis to: the smaller of maxmemory and "
         "REDISSPINE_MEMORY_BUDGET_BYTES (absent: none)"),
    ):
        if memory.get(key) is not None:
            yield GaugeMetricFamily(name, text, value=memory[key])


class FleetCollector:
    """A prometheus_client collector: every scrape reads the crawls anew.

    ``crawls``: the crawl ids to show (empty: every crawl in the registry, at most
    ``MAX_CRAWLS``). A Redis that fails mid-scrape gives ``redisspine_up 0`` (and one
    log line), not an HTTP error, so Prometheus records the outage."""

    def __init__(
        self, client: redis.Redis, keys_of: Callable[[str], CrawlKeys], crawls: Sequence[str],
        read: Callable[[CrawlKeys], dict[str, Any]],
    ) -> None:
        self.client = client
        self.keys_of = keys_of
        self.crawls = list(crawls)
        self.read = read

    def describe(self) -> list[Any]:
        return []  # nothing is read at registration

    def statuses(self) -> dict[str, dict[str, Any]]:
        crawls = self.crawls or list_crawls(self.client, self.keys_of("_").crawls, MAX_CRAWLS)
        return {crawl: self.read(self.keys_of(crawl)) for crawl in crawls}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            statuses = self.statuses()
        except redis.RedisError as exc:
            print(f"redisspine metrics: reading Redis failed: {type(exc).__name__}: "
                  f"{' '.join(str(exc).split())}", file=sys.stderr)
            yield GaugeMetricFamily("redisspine_up", "1 when the last scrape read Redis", 0.0)
            return
        yield GaugeMetricFamily("redisspine_up", "1 when the last scrape read Redis", 1.0)
        yield from _families(statuses)
        yield from _memory_families(statuses)


def make_server(collector: Collector, host: str, port: int) -> WSGIServer:
    """A WSGI server of ``collector`` on ``host:port`` (0: a free port), not started."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return wsgi_server(make_wsgi_app(registry), host, port)


def serve(collector: Collector, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve ``/metrics`` (any path, in fact) until interrupted."""
    serve_wsgi(make_server(collector, host, port), "/metrics", announce)


def read_for(client: redis.Redis, *, timeout_ms: int, top_lanes: int,
             **options: Any) -> Callable[[CrawlKeys], dict[str, Any]]:
    """The status read of one crawl, as ``redisspine status`` would make it (in the
    crawl's layout: a sharded crawl's shards summed)."""
    from scrapy_redisspine.sharded import stored_shards

    def read(keys: CrawlKeys) -> dict[str, Any]:
        keys = replace(keys, shards=stored_shards(client, keys))
        return read_status(client, keys, timeout_ms=timeout_ms, top_hosts=top_lanes, **options)

    return read
