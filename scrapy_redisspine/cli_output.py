"""Human-readable output of the ``redisspine`` command (the JSON needs none)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redisspine.compact import loads_request
from scrapy_redisspine.connection import PACKED_ENTRIES_MAX
from scrapy_redisspine.serialization import SerializationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy_redisspine.frontier import DeadLetter

_FLEET_TOTALS = ("response_received_count", "item_scraped_count", "log_count/ERROR")


def describe_payload(payload: bytes) -> str:
    """``METHOD URL`` of a stored request, or what is wrong with it."""
    try:
        data = loads_request(payload)
    except SerializationError:
        return f"<{len(payload)} undecodable bytes>"
    return f"{data.get('method', 'GET')} {data.get('url')}"


def print_dead_letters(letters: Sequence[DeadLetter]) -> None:
    if not letters:
        print("no dead letters")
    for letter in letters:
        print(f"{letter.field}\tlane={letter.lane or '-'}\t{describe_payload(letter.payload)}"
              f"\t{letter.reason}")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in cells]


_STATES = {
    "finished": "finished",
    "draining": "DRAINING",
    "paused": "PAUSED",
    "idle": "idle: nothing queued or in flight",
    "running": "running",
    "waiting for workers": "waiting for workers",
}


def _state(status: dict[str, Any]) -> str:
    state = _STATES.get(status["state"], str(status["state"]))
    if status["state"] == "idle" and not status["workers_alive"]:
        state += ", no worker alive"
    return state


def _eta(status: dict[str, Any]) -> str:
    if status["state"] == "finished":
        return "finished"
    if status["eta_seconds"] is None:
        return "-"
    text = _duration(status["eta_seconds"])
    slowest = status.get("slowest_lane")
    if status.get("eta_bound") == "politeness" and slowest:
        text += (f" (politeness: {slowest['lane']}, {slowest['backlog']} queued at "
                 f"{slowest['seconds_per_request']} s each)")
    return text


def _worker_state(worker: dict[str, Any]) -> str:
    if worker["state"] == "dead":
        return f"dead: last pushed totals, {worker['totals_age_seconds']}s old"
    if worker["state"] == "silent":
        return "NO (silent)"
    return "closed" if worker["state"] == "closed" else "yes"


def _workers_table(workers: Sequence[dict[str, Any]]) -> list[str]:
    def totals(worker: dict[str, Any], name: str) -> Any:
        return "-" if worker["totals"] is None else worker["totals"].get(name, 0)

    return _table(
        ["worker", "alive", "heartbeat age", "acks/min", "pages", "items", "errors"],
        [[w["id"], _worker_state(w),
          "-" if w["heartbeat_age_seconds"] is None else f"{w['heartbeat_age_seconds']}s",
          "-" if w["acks_per_minute"] is None else w["acks_per_minute"],
          totals(w, "response_received_count"), totals(w, "item_scraped_count"),
          totals(w, "log_count/ERROR")]
         for w in workers],
    )


def _evicting_line(memory: dict[str, Any]) -> list[str]:
    """A warning when the server may evict the crawl's keys (status.py's
    ``evicting_policy``): workers refuse to run on it."""
    policy = memory.get("evicting_policy")
    if not policy:
        return []
    return [f"  warning: Redis's maxmemory-policy is {policy} with a maxmemory set: it may "
            f"evict this crawl's keys, so workers refuse to run on it. Set "
            f"maxmemory-policy noeviction (or a volatile-* policy)"]


def _memory(memory: dict[str, Any]) -> str:
    used, budget = memory["used_bytes"], memory["budget_bytes"]
    if used is None:
        return "? (INFO is switched off)"
    if budget is None:
        return f"{used} bytes used, no budget (no maxmemory)"
    return f"{used} bytes used of a {budget} byte budget ({100 * used / budget:.0f} %)"


def _items_line(items: dict[str, int]) -> list[str]:
    """One line about the items stream, when the crawl stores items."""
    if not (items["in_stream"] or items["stored"] or items["shed"]):
        return []
    return [f"  items: {items['in_stream']} in the stream   stored {items['stored']}   "
            f"shed {items['shed']}   fenced {items['fenced']}"]


def _losses_and_feed(counters: dict[str, int | float]) -> list[str]:
    """What never reached the queue (shed for lack of memory: the crawl is then not
    finished) and what the feed brought, when there is any: counted in ``stats``, so
    a user reading ``status`` sees it without ``--json``."""
    lines = []
    shed = int(counters.get("shed", 0))
    if shed:
        lines.append(f"  shed {shed} request(s) for lack of Redis memory: the crawl "
                     f"will not close as finished (FAQ, \"Redis memory fills up\")")
    fed, dead = int(counters.get("fed", 0)), int(counters.get("feed_dead_lettered", 0))
    if fed or dead:
        lines.append(f"  feed: {fed} entry(ies) enqueued, {dead} dead-lettered")
    return lines


def _packed_line(packed: list[dict[str, Any]] | None) -> list[str]:
    """A hint when Redis keeps frontier keys packed past ``PACKED_ENTRIES_MAX`` entries
    (status.py's ``_packed_keys``): the settings that end it, and where the docs
    explain them. A key packed in several shards is named once, with its largest."""
    if not packed:
        return []
    largest: dict[str, int] = {}
    for key in packed:
        largest[key["key"]] = max(largest.get(key["key"], 0), key["entries"])
    names = ", ".join(f"{name} ({entries})" for name, entries in largest.items())
    return [f"  hint: Redis keeps {names} as packed lists, scanned entry by entry on every "
            f"lease and ack; hash-max-listpack-entries {PACKED_ENTRIES_MAX} and "
            f"zset-max-listpack-entries {PACKED_ENTRIES_MAX} make the frontier cheaper "
            f"(Operations, \"Redis settings that make the frontier cheaper\")"]


def _starting_line(status: dict[str, Any]) -> list[str]:
    """Workers still producing start requests, and those that stopped while they were:
    shown only when there are any."""
    producing, cut_short = status.get("workers_starting", 0), status.get("workers_cut_short", 0)
    parts = [f"{producing} still producing start requests"] if producing else []
    if cut_short:
        parts.append(f"{cut_short} stopped before noting theirs done (any not queued are "
                     f"not in the crawl: run them again if their start() differs)")
    return [f"  {'; '.join(parts)}"] if parts else []


def render_status(status: dict[str, Any]) -> str:
    """The readable status; a section with nothing to show is left out, not printed
    as an empty table."""
    rate = status["rate_per_minute"]
    fleet = status["fleet_stats"]
    dedup = status["dedup"]
    rate_text = "" if status["state"] == "finished" else (
        f"rate {'-' if rate is None else f'{rate:.1f}/min'}   ")
    lines = [
        f"crawl {status['crawl']}: {_state(status)}",
        f"  queued {status['queued']}   in flight {status['in_flight']}   done "
        f"{status['done']}   dead letters {status['dead_letters']}",
        f"  {rate_text}ETA {_eta(status)}",
        "  fleet totals: " + ", ".join(f"{name} {fleet.get(name, 0)}" for name in _FLEET_TOTALS),
        f"  dedup {dedup['mode']}: {dedup['set_size']} fingerprints in the SET, "
        f"{dedup['memory_bytes'] if dedup['memory_bytes'] is not None else '?'} bytes",
        f"  Redis memory: {_memory(status['redis_memory'])}",
        *_evicting_line(status["redis_memory"]),
        *_packed_line(status.get("packed_keys")),
        *_items_line(status["items"]),
        *_losses_and_feed(status["counters"]),
        *([f"  fleet limit reached: every worker closes ({status['close_reason']})"]
          if status.get("close_reason") else []),
        "",
        f"workers: {status['workers_alive']} alive of {status['workers_total']}",
        *_starting_line(status),
    ]
    if status["workers"]:
        lines += _workers_table(status["workers"])
    if status["hosts"]:
        lines += ["", "top hosts by backlog:"]
        lines += _table(
            ["lane", "backlog", "busy", "group busy", "next due", "crawl-delay",
             "autothrottle"],
            [[h["lane"] or "(no host)", h["backlog"], h["busy"], h["group_busy"],
              f"{h['next_due_in_seconds']}s",
              "-" if h["crawl_delay_seconds"] is None else f"{h['crawl_delay_seconds']}s",
              "-" if h["autothrottle_delay_seconds"] is None
              else f"{h['autothrottle_delay_seconds']}s"]
             for h in status["hosts"]],
        )
    if status["errors"]:
        lines += ["", "errors:"]
        lines += [f"  {name}: {value}" for name, value in status["errors"].items()]
    return "\n".join(lines)
