"""Every Redis key of a crawl, built in one place.

All keys of one crawl share the hash tag ``{crawl id}``. A lane's politeness budget
(its rest and its in-flight count fleet-wide) is shared by every crawl of one
politeness group (``REDISSPINE_POLITENESS_GROUP``): those few keys carry the group's
own hash tag ``{g:group}``, so on one Redis a script that leases or acks touches two
tags, the crawl's and its group's. Redis Cluster runs a script on one slot only, so
there a crawl lives in its group's slot (``colocated``: ``P:{g:G}:C/<name>``; shard i
of a sharded crawl ``P:{g:G/i}:C/<name>``, beside the group's keys of its lanes,
``P:{g:G/i}:<name>``): placement.py decides, and finds crawls laid out before in
their own slot. Scripts never build key names: they receive these through ``KEYS``.

Key map (``P`` is the prefix, ``C`` the crawl id, ``G`` the politeness group):

=========================  ======  ==============================  =====================
key                        type    written by                      lifetime
=========================  ======  ==============================  =====================
``P:{C}:queue``            ZSET    enqueue, release (scripts)      until leased
``P:{C}:queue:<entry>``    LIST    enqueue, lease (scripts)        until leased
``P:{C}:queue#n``          HASH    enqueue, lease (scripts)        whole crawl
``P:{C}:hosts``            ZSET    enqueue, lease, ack (scripts)   while a lane has work
``P:{C}:busy``             HASH    lease, ack, release (scripts)   while a lane has leases
``P:{C}:backlog``          HASH    enqueue, lease (scripts)        while a lane has work
``P:{g:G}:group_busy``     HASH    lease, ack, release (scripts)   while a lane has leases
``P:{g:G}:host_next``      HASH    ack (script)                    the group's life
``P:{g:G}:host_delay``     HASH    workers (robots.txt)            the group's life
``P:{C}:inflight``         HASH    lease, ack, release (scripts)   lease -> ack/release
``P:{C}:leases``           ZSET    lease, ack, release (scripts)   same as ``inflight``
``P:{C}:owned``            ZSET    lease, ack, release (scripts)   same as ``inflight``
``P:{C}:requeues``         HASH    requeue_stale, ack (scripts)    until acked/dead
``P:{C}:seq``              STRING  enqueue (script)                whole crawl
``P:{C}:seen``             SET     enqueue (script), dupefilter    whole crawl
``P:{C}:starts``           SET     enqueue (script)                whole crawl
``P:{C}:dedup``            HASH    dedup mode switch               whole crawl
``P:{C}:bloom``            STRING  enqueue (script), migration     whole crawl
``P:{C}:dead``             HASH    bury (script)                   until re-injected
``P:{C}:workers``          ZSET    register, heartbeat, leave      whole crawl
``P:{C}:stats``            HASH    enqueue, lease, ack (scripts)   whole crawl
``P:{C}:control``          HASH    ``redisspine`` CLI              until resumed/purged
``P:{C}:fleet_stats``      HASH    workers (FleetTotals)           whole crawl
``P:{C}:worker_stats``     HASH    workers (FleetTotals)           whole crawl
``P:{C}:progress``         ZSET    workers (Recovery extension)    last 5 minutes
``P:{C}:record``           HASH    register, mark_finished, purge  whole crawl
``P:{C}:starting``         ZSET    register, heartbeat             while start() runs
``P:{g:G}:lane_limits``    HASH    workers (DOWNLOAD_SLOTS)        the group's life
``P:{g:G}:lane_throttle``  HASH    ack (enqueue script)            the group's life
``P:{C}:lane_pages``       HASH    lease (script)                  whole crawl
``P:{C}:items``            STREAM  enqueue (script, with acks)     whole crawl
``P:{C}:page_holds``       HASH    take_pages (script)             whole crawl (sharded)
``P:crawls``               SET     register (script)               until purged
``P:{g:G}:crawls``         SET     register (worker)               until purged
``P:{g:G}:shards``         STRING  join (worker, cluster only)     the group's life
``P:crawl_groups``         HASH    join, push (cluster only)       kept (placement.py)
=========================  ======  ==============================  =====================

- ``queue``: score 0; member = lane, NUL, 5-character priority key (10 digits in
  members queued by earlier versions, still read: ``members.py``), 15-digit order key,
  serialized request (``compact.py``: its URL, then its callback and a map of the
  rest). A lex range holds one lane's requests: highest priority first, then FIFO (or
  LIFO, with complemented order keys). From a lane's 4th queued request on, new
  requests do not become members: they wait in a LIST per lane, priority and order
  (``queue:<entry>``, payloads only, in arrival order), and the queue holds the
  list's index entry, ``lane \\0 pk ~`` (FIFO: sorted after the members of its
  priority, which are older or put back) or ``lane \\0 pk !`` (LIFO: before them).
  A request gets its order key and its member when it is leased
  (``scripts/lib/lists.lua``): a queued request costs its payload and 2-3 bytes
  instead of a ZSET member's ~95 bytes of structure, and the lane and priority once
  per list (issue 19); a lane of one to three requests keeps members, cheaper than a
  key of its own. These lists' names and ``queue#n`` (fields ``requests`` in lists,
  ``lists``, so queued = ZCARD - lists + requests) are the two names derived from
  another key: in ``lists.lua`` and here only (:meth:`CrawlKeys.queue_list`),
  because a lease cannot know a lane's lists before it picks the lane. They carry
  the queue's hash tag, so they live in its slot.
- ``hosts``: lane -> time (ms) it may next be leased; holds the lanes with queued
  requests and a free slot of this crawl's own. The time may be early: another crawl
  of the group may have fetched the lane since, or hold its slots; the lease checks
  the group's keys and moves the lane to its real time (or re-checks it shortly).
  ``busy``: lane -> this crawl's requests in flight, fleet-wide.
  ``group_busy``: lane -> the whole group's requests in flight (the sum of its crawls'
  ``busy``); the lease never takes a slot past the lane's concurrency in it.
  ``backlog``: lane -> requests queued. ``host_next``: lane -> end of its last fetch
  (by any crawl of the group) plus its delay (or a Retry-After block).
  ``host_delay``: lane -> robots.txt Crawl-delay (seconds), learned once by any worker.
- ``inflight``: field = order key; value = ``owner \\n token \\n queue member``, i.e.
  everything needed to put the request back exactly as it was, and the fencing token
  an ack must present.
- ``leases``: field = order key; score = lease time in milliseconds. Lets a sweep find
  old leases in O(stale) instead of scanning ``inflight``.
- ``owned``: score 0, member = ``owner \\n order key``; a lex range gives one worker's
  leases, so requeuing a dead worker's work costs O(its leases).
- ``requeues``: how often a request was requeued after its worker died; past
  ``REDISSPINE_MAX_REQUEUES`` it becomes a dead letter.
- ``seen``: the first 14 bytes of each 20-byte request fingerprint (Scrapy's
  fingerprinter; 14 bytes fit Redis's 16-byte allocation class); drained into
  ``bloom`` when the crawl switches to the Bloom filter.
- ``dedup``: the dedup mode (SET, migrating, Bloom) and the Bloom filter's parameters.
- ``bloom``: the Bloom filter's bitmap when the server has no RedisBloom module (with
  it, the same key holds a RedisBloom filter).
- ``starts``: raw fingerprints of start requests, so that each start request enters the
  frontier once per crawl however many workers start, even with ``dont_filter``.
- ``dead``: dead letters; field = order key, value = ``reason \\n queue member``.
- ``workers``: worker id -> last heartbeat (ms).
- ``stats``: fleet-wide counters (``enqueued``, ``filtered``, ``leased``, ``acked`` ...).
- ``control``: fleet-wide orders read by every worker once per heartbeat:
  ``paused`` = 1 (stop leasing, keep what is held), ``drain`` = 1 (stop leasing,
  finish what is held, exit with reason ``drained``).
- ``fleet_stats``: the sum of every worker's numeric Scrapy stats (each worker adds
  its deltas periodically and at close), so tools show totals for the whole fleet.
- ``worker_stats``: worker id -> ``pushed ms \n running|closed \n JSON`` of that
  worker's own totals at its last push (pages, items, errors, acks); ``closed`` once
  it pushed as it closed. Kept after the worker is gone, so a killed worker's last
  totals stay visible (``status`` marks them); one field per worker process.
- ``progress``: samples for rates; score = Redis time (ms), member =
  ``ms:worker id:worker acks:fleet acks``; each sweep adds one and trims what is
  older than five minutes.
- ``record``: the crawl's identity: ``epoch`` (random, written by the worker that
  created the crawl), ``spider`` (its spider's name), ``created_ms``, and
  ``finished_ms`` once a worker closed it finished; with an idle close,
  ``idle_since_ms`` and ``idle_mark`` (fleet_counts.lua). Every worker presents the epoch
  at each heartbeat, so a crawl whose state vanished (Redis restarted empty,
  flushed) is noticed. ``redisspine purge`` leaves only ``purged_ms`` (a tombstone),
  so running workers learn that it was a purge. ``purging_ms``: a sharded crawl on a
  cluster whose last worker is deleting it (persistence off; purge_if_done.lua), its
  shards one by one; a worker registering meanwhile finishes that first. Once such
  a crawl is deleted its record keeps only ``shards`` (where its items streams are).
- ``starting``: worker id -> last heartbeat (ms) of each worker whose spider still
  produces start requests; the crawl is not finished while a live one is listed.
- ``lane_limits``: lane -> the most requests of that lane in flight group-wide, for
  lanes with a limit of their own (Scrapy's ``DOWNLOAD_SLOTS`` concurrency); others
  take ``REDISSPINE_HOST_CONCURRENCY``.
- ``lane_pages``: lane -> requests it leased in all, written by ``lease`` only with
  ``REDISSPINE_HOST_PAGE_LIMIT``; a lane at the limit has its queued requests
  dropped (counted in ``stats`` as ``host_page_limited``).
- ``items``: the crawl's items (``REDISSPINE_ITEMS``), one entry per item that
  reached the end of a worker's item pipelines, written by ``enqueue`` in the same
  step as the ack of the request whose callback produced it (only for an ack that
  passes the fencing check); fields ``class`` (dotted path, ``dict`` for a plain
  dict), ``url`` (of that request's response) and ``item`` (the serialized item).
  Read by ``redisspine export`` and by the user's own consumers (XREADGROUP). A
  sharded crawl has one per shard (below), each holding the items of the acks its
  shard took; ``export`` merges them (cli_export.py).
- The feed key (``REDISSPINE_FEED_KEY``, by default scrapy-redis's
  ``<spider>:start_urls``): a LIST or ZSET the user writes and every worker drains
  (``feed_done`` removes what a worker enqueued). Named by the user, so it carries
  no prefix and, unless the name includes ``{crawl id}``, not the crawl's hash tag
  (:func:`feed_key`). On Redis Cluster it must include it: ``feed_done`` touches it
  with the crawl's keys (a feed key in another slot is left undrained, see feed.py).
- ``lane_throttle``: lane -> its AutoThrottle delay (ms), with Scrapy's
  ``AUTOTHROTTLE_ENABLED``: moved by every ack that carries a download latency
  (lib/throttle.lua), by the workers of every crawl of the group; each ack rests its
  lane at least this long.
- The group keys (``group_busy``, ``host_next``, ``host_delay``, ``lane_limits``,
  ``lane_throttle``) belong
  to no crawl: a purge or flush of one crawl takes its own in-flight counts out of
  ``group_busy`` and leaves the rest to the group's other crawls.
- ``P:{g:G}:crawls``: the crawl ids of the group, so that the workers of one crawl
  can sweep the dead workers of another (whose leases hold the group's lane slots);
  written beside ``P:crawls`` and removed with it.
- ``P:crawls`` is the other key outside a crawl's hash tag: the set of crawl ids on this
  Redis, so tools can list crawls without ``KEYS``. Only ``register`` writes it, as a
  separate command (never inside a multi-key script); ``purge`` removes an id the same
  way. On Redis Cluster it lives in a slot of its own, so ``redisspine list`` names
  the crawls of every master with one SSCAN.

Shards (``shards`` > 1, :mod:`scrapy_redisspine.sharded`). A crawl's lanes are spread
over N hash tags ``{C/0}`` ... ``{C/N-1}`` by :func:`shard_of` (CRC-32 of the lane's
UTF-8 bytes, mod N: the same in every process). Key by key:

- Per shard, ``P:{C/i}:<name>`` (:data:`SHARD_KEY_NAMES`): the frontier of the lanes
  the shard owns (queue, hosts, busy, backlog, inflight, leases, owned, requeues,
  seq, dead, lane_pages), its dedup (seen, dedup, bloom, starts: a URL's lane decides
  its shard, so dedup within the shard is exact; a request whose lane is not its
  host's, by ``download_slot`` meta or ``DOWNLOAD_SLOTS``, is deduplicated within its
  lane's shard, so the same URL in two lanes may be fetched once per lane), its
  counters (stats: the crawl's totals are the sum over its shards) and its items.
- ``page_holds`` (sharded crawls with a fleet-wide ``CLOSESPIDER_PAGECOUNT`` only):
  worker id -> pages it took from the budget for the lease under way and has not
  settled yet; the budget's count is ``pages_taken`` in the crawl-wide ``stats``
  (scripts/take_pages.lua).
- Crawl-wide, ``P:{C}:<name>``: workers, record (which also keeps ``shards``: the N the
  crawl was created with; a record without it means 1, and a worker with another N
  is refused at register), control, fleet_stats, worker_stats, progress, starting,
  page_holds (and stats, for the counts of count_limits, add_shed and take_pages); the
  registries. The crawl-wide view's frontier keys exist in name only (never
  written in a sharded crawl).
- Group keys: on one server they keep ``{g:G}``; on Redis Cluster a colocated crawl's
  shard i and the group's keys of its lanes share ``{g:G/i}``; a crawl laid out there
  by an earlier version keeps its shards' tags (``P:{C/i}:g:<name>``).
- On Redis Cluster each shard also keeps ``P:{C/i}:record`` (a copy of the epoch, and
  a purge's tombstone), ``P:{C/i}:control`` (the lease's close order) and
  ``P:{C/i}:workers`` (the heartbeats its sweep reads, copied before each sweep):
  :data:`CLUSTER_SHARD_COPIES`, so every script stays in the shard's slot.
- With N = 1 (the default) every name is as it always was.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

from scrapy_redisspine.members import index_entry

_FORBIDDEN_IN_ID = "{}"
#: The politeness group of every crawl that names none: all crawls under one prefix
#: share each lane's budget (REDISSPINE_POLITENESS_GROUP).
DEFAULT_GROUP = "default"
#: The names of the group keys among CrawlKeys' properties (they carry ``{g:group}``).
GROUP_KEY_NAMES = ("group_busy", "host_next", "host_delay", "lane_limits", "lane_throttle")
#: The registries among CrawlKeys' properties: what tools and workers look crawls up
#: in (sets of crawl ids; on Redis Cluster, each colocated crawl's group and each
#: group's number of slots), no crawl's own.
REGISTRY_KEY_NAMES = ("crawls", "group_crawls", "group_shards", "crawl_groups")
#: The keys each shard of a sharded crawl has a copy of (``REDISSPINE_SHARDS``): the
#: frontier of the lanes the shard owns, and the dedup of their URLs (a URL's lane
#: decides its shard, so dedup per shard is exact). Every other key of a crawl is
#: crawl-wide and keeps the crawl's own tag.
SHARD_KEY_NAMES = (
    "queue", "queue_counts", "hosts", "busy", "backlog", "inflight", "leases", "owned",
    "requeues", "seq", "seen", "starts", "dedup", "bloom", "dead", "stats", "lane_pages", "items",
)

#: On Redis Cluster, a shard's scripts cannot read the crawl-wide keys (another
#: slot): each shard keeps its own copy of these, under its tag. ``record``: the
#: crawl's epoch (and a purge's tombstone), checked by every writing script;
#: ``control``: the lease's close order; ``workers``: the heartbeats a sweep of the
#: shard reads, copied from the crawl's just before (sharded.py). On one server a
#: shard uses the crawl's own.
CLUSTER_SHARD_COPIES = ("record", "control", "workers")


def shard_of(lane: str, shards: int) -> int:
    """The shard that owns ``lane`` among ``shards``: CRC-32 of its UTF-8 bytes.

    Every worker of every machine and version must agree, for all time, on where a
    lane lives (its requests, its dedup): so a fixed checksum, never Python's
    ``hash()``, which is salted per process.
    """
    if shards < 1:
        raise ValueError(f"a crawl has at least 1 shard, got {shards}")
    return zlib.crc32(lane.encode("utf-8", "surrogatepass")) % shards


@dataclass(frozen=True)
class CrawlKeys:
    """Names of all Redis keys of one crawl, and of its politeness group's."""

    prefix: str
    crawl_id: str
    group: str = DEFAULT_GROUP
    #: On Redis Cluster every script must stay within one slot. A crawl laid out before
    #: groups were shared there (``colocated`` False) keeps the group's keys under its
    #: own hash tag: politeness per crawl, exact and atomic, not shared.
    cluster: bool = False
    #: How many hash tags the crawl's frontier is spread over (REDISSPINE_SHARDS).
    #: 1: one tag, ``{C}``, the layout of every crawl before shards existed.
    shards: int = 1
    #: Which shard's frontier keys this view names (``{C/shard}``); None: the
    #: crawl-wide view, whose frontier keys (SHARD_KEY_NAMES) are the one shard's of
    #: an unsharded crawl and stay unused in a sharded one. Built by :meth:`shard`.
    shard: int | None = None
    #: Redis Cluster only: the crawl lives in its politeness group's slots, so that
    #: every crawl of the group leases a lane in the slot that holds the lane's budget
    #: (one script, atomic, as on one server). Unsharded: every key of the crawl
    #: under the group's tag, ``P:{g:G}:C/<name>``, the group's keys ``P:{g:G}:<name>``.
    #: Sharded: shard i's keys ``P:{g:G/i}:C/<name>`` beside the group's keys of the
    #: lanes it owns, ``P:{g:G/i}:<name>``; the crawl-wide keys keep ``{C}``.
    colocated: bool = False

    def __post_init__(self) -> None:
        if self.colocated and not self.cluster:
            raise ValueError("only a crawl on Redis Cluster lives in its group's slots")
        if self.shards < 1:
            raise ValueError(f"a crawl has at least 1 shard, got {self.shards}")
        if self.shard is not None and not 0 <= self.shard < self.shards:
            raise ValueError(f"shard {self.shard} is not one of the crawl's {self.shards}")
        if not self.crawl_id:
            raise ValueError("crawl id must not be empty")
        if not self.group:
            raise ValueError("politeness group must not be empty")
        for char in _FORBIDDEN_IN_ID:
            if char in self.crawl_id or char in self.prefix or char in self.group:
                raise ValueError(
                    f"crawl id {self.crawl_id!r}, prefix {self.prefix!r} and politeness "
                    f"group {self.group!r} must not contain {char!r}: braces delimit the "
                    "Redis Cluster hash tag"
                )
        if "/" in self.crawl_id:
            raise ValueError(
                f"crawl id {self.crawl_id!r} must not contain '/': a sharded crawl's "
                "hash tags are '{crawl id/shard}', which another crawl's id with a '/' "
                "could equal"
            )

    def tag(self) -> str:
        """The hash tag of this view's frontier keys (the crawl id, or ``C/shard``;
        colocated: ``g:G``, or ``g:G/shard``)."""
        if self.colocated and self.shards == 1:
            return self.group_tag()
        if self.shard is None or self.shards == 1:
            return self.crawl_id
        if self.colocated:
            return f"{self.group_tag()}/{self.shard}"
        return f"{self.crawl_id}/{self.shard}"

    def group_tag(self) -> str:
        """The politeness group's own hash tag (``g:`` keeps it apart from a crawl id
        spelled like the group)."""
        return f"g:{self.group}"

    def _key(self, name: str) -> str:
        in_shard = name in SHARD_KEY_NAMES or (self.cluster and name in CLUSTER_SHARD_COPIES)
        if self.colocated and (self.shards == 1 or (in_shard and self.shard is not None)):
            # A crawl id has no '/', a group key's name none: the two never meet.
            return f"{self.prefix}:{{{self.tag()}}}:{self.crawl_id}/{name}"
        if in_shard:
            return f"{self.prefix}:{{{self.tag()}}}:{name}"
        return f"{self.prefix}:{{{self.crawl_id}}}:{name}"

    def shard_view(self, index: int) -> CrawlKeys:
        """The keys of shard ``index``: its frontier keys under ``{C/index}``, the
        crawl-wide keys as they are. With one shard, the same names as this view."""
        return replace(self, shard=index)

    def shard_views(self) -> tuple[CrawlKeys, ...]:
        """Every shard's view, shard 0 first."""
        return tuple(self.shard_view(index) for index in range(self.shards))

    def shard_of(self, lane: str) -> int:
        """The shard that owns ``lane`` (:func:`shard_of`)."""
        return shard_of(lane, self.shards)

    def _group_key(self, name: str) -> str:
        if self.colocated and (self.shards == 1 or self.shard is not None):
            return f"{self.prefix}:{{{self.tag()}}}:{name}"
        if self.cluster:
            # (a sharded crawl's crawl-wide view on a cluster: names in its own slot,
            # for the scripts that run there; its lanes' budgets are in its shards')
            return f"{self.prefix}:{{{self.tag()}}}:g:{name}"
        return f"{self.prefix}:{{{self.group_tag()}}}:{name}"

    @property
    def queue(self) -> str:
        return self._key("queue")

    @property
    def queue_counts(self) -> str:
        """The queue's counts (``requests`` held in its lists, ``lists``): derived from
        the queue's name, as ``scripts/lib/lists.lua`` derives it."""
        return f"{self.queue}#n"

    def queue_list(self, lane: str, priority_key: str, lifo: bool = False) -> str:
        """The list of ``lane``'s queued requests of one priority (its priority key,
        ``members.priority_key``) and order: the queue's name, ":", and the list's
        index entry (``members.index_entry``), as ``scripts/lib/lists.lua`` derives it."""
        return f"{self.queue}:{index_entry(lane, priority_key, lifo).decode()}"

    @property
    def hosts(self) -> str:
        return self._key("hosts")

    @property
    def busy(self) -> str:
        return self._key("busy")

    @property
    def backlog(self) -> str:
        return self._key("backlog")

    @property
    def group_busy(self) -> str:
        return self._group_key("group_busy")

    @property
    def host_next(self) -> str:
        return self._group_key("host_next")

    @property
    def host_delay(self) -> str:
        return self._group_key("host_delay")

    @property
    def inflight(self) -> str:
        return self._key("inflight")

    @property
    def leases(self) -> str:
        return self._key("leases")

    @property
    def owned(self) -> str:
        return self._key("owned")

    @property
    def requeues(self) -> str:
        return self._key("requeues")

    @property
    def seq(self) -> str:
        return self._key("seq")

    @property
    def seen(self) -> str:
        return self._key("seen")

    @property
    def dedup(self) -> str:
        return self._key("dedup")

    @property
    def bloom(self) -> str:
        return self._key("bloom")

    @property
    def starts(self) -> str:
        return self._key("starts")

    @property
    def dead(self) -> str:
        return self._key("dead")

    @property
    def workers(self) -> str:
        return self._key("workers")

    @property
    def stats(self) -> str:
        return self._key("stats")

    @property
    def control(self) -> str:
        return self._key("control")

    @property
    def fleet_stats(self) -> str:
        return self._key("fleet_stats")

    @property
    def worker_stats(self) -> str:
        return self._key("worker_stats")

    @property
    def progress(self) -> str:
        return self._key("progress")

    @property
    def record(self) -> str:
        return self._key("record")

    @property
    def starting(self) -> str:
        return self._key("starting")

    @property
    def lane_limits(self) -> str:
        return self._group_key("lane_limits")

    @property
    def lane_throttle(self) -> str:
        return self._group_key("lane_throttle")

    @property
    def lane_pages(self) -> str:
        return self._key("lane_pages")

    @property
    def items(self) -> str:
        return self._key("items")

    @property
    def page_holds(self) -> str:
        return self._key("page_holds")

    @property
    def crawls(self) -> str:
        """The registry of crawl ids: shared by all crawls under this prefix."""
        return f"{self.prefix}:crawls"

    @property
    def group_crawls(self) -> str:
        """The politeness group's registry of crawl ids: a crawl whose workers all
        died holds lane slots of the group, and the group's other crawls sweep it."""
        if self.colocated:
            return f"{self.prefix}:{{{self.group_tag()}}}:crawls"
        return self._group_key("crawls")

    @property
    def group_shards(self) -> str:
        """Redis Cluster: how many slots the politeness group's lanes are spread over
        (the REDISSPINE_SHARDS of its colocated crawls, which must all agree: a lane's
        budget lives in one slot). Written once by the group's first worker."""
        return f"{self.prefix}:{{{self.group_tag()}}}:shards"

    @property
    def crawl_groups(self) -> str:
        """Redis Cluster: crawl id -> politeness group of each colocated crawl, so that
        tools find a crawl's keys (they live in its group's slots) without knowing
        the workers' settings. Written (HSETNX) before anything of a new crawl by
        what writes to it (a worker's join, a push), and kept after a purge: a sharded
        crawl's record, a purge's tombstone too, is under the crawl's own tag, where
        an earlier version's crawl keeps its own (placement.py)."""
        return f"{self.prefix}:crawl_groups"

    def group_keys(self) -> tuple[str, ...]:
        """The politeness group's keys: shared with the group's other crawls."""
        return tuple(getattr(self, name) for name in GROUP_KEY_NAMES)

    def all_crawl_keys(self) -> tuple[str, ...]:
        """Every key that belongs to this crawl alone (what a flush deletes): in the
        crawl-wide view of a sharded crawl on one server, every shard's frontier keys
        too (on a cluster they are in other slots: sharded.py flushes each shard)."""
        own = self._own_keys()
        if self.shard is not None or self.shards == 1 or self.cluster:
            return own
        return own + tuple(
            getattr(view, name) for view in self.shard_views() for name in SHARD_KEY_NAMES
        )

    def shard_keys(self) -> tuple[str, ...]:
        """Every key of this shard's own (its frontier keys; on a cluster, its copies
        of the crawl-wide ones too): what a flush of the shard deletes."""
        names = SHARD_KEY_NAMES + (CLUSTER_SHARD_COPIES if self.cluster else ())
        return tuple(getattr(self, name) for name in names)

    def _own_keys(self) -> tuple[str, ...]:
        return (
            self.queue,
            self.queue_counts,
            self.hosts,
            self.busy,
            self.backlog,
            self.inflight,
            self.leases,
            self.owned,
            self.requeues,
            self.seq,
            self.seen,
            self.dedup,
            self.bloom,
            self.starts,
            self.dead,
            self.workers,
            self.stats,
            self.control,
            self.fleet_stats,
            self.worker_stats,
            self.progress,
            self.record,
            self.starting,
            self.lane_pages,
            self.items,
            self.page_holds,
        )


def feed_key(template: str, spider_name: str) -> str:
    """The feed key of a spider's crawl (``REDISSPINE_FEED_KEY``, ``%(name)s`` the
    spider's name, as scrapy-redis's ``REDIS_START_URLS_KEY``); "" when it is off.

    A ``ValueError`` names a template that is not one (``%(nme)s``, a lone ``%``).
    """
    if not template:
        return ""
    try:
        return template % {"name": spider_name}
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(
            f"REDISSPINE_FEED_KEY {template!r} is no key template ({type(exc).__name__}: "
            f"{exc}); use %(name)s for the spider's name"
        ) from None
