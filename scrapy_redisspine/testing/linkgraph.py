"""The deterministic link graph behind the test site.

The graph depends only on ``(hosts, pages_per_host, fanout, seed, tracking_params)``,
never on the port, so two runs (or a test and the site it starts) agree on which
pages exist and which links each page carries. Hrefs are rendered per port.

Page ``n`` of every host links to page ``n + 1`` of the same host, so every page is
reachable from the start pages (``/p/0`` of each host) whatever the random links
are. The random links mix same-host and cross-host targets, and hrefs mix absolute,
root-relative, relative and scheme-relative forms, so a crawler's URL handling and
its fingerprint-based dedup are both exercised. Some pages repeat a link in another
form, which a correct crawl must fetch once.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

FIRST_HOST_OCTET = 10
MAX_HOSTS = 255 - FIRST_HOST_OCTET
TRACKING_QUERY = "?utm_source=x"

_CROSS_HOST_SHARE = 0.5
_DUPLICATE_SHARE = 0.5
_TRACKING_SHARE = 0.3
_SAME_HOST_FORMS = ("absolute", "root", "relative")
_CROSS_HOST_FORMS = ("absolute", "scheme-relative")

PageId = tuple[int, int]
"""(host index, page number)."""


def host_address(host: int) -> str:
    """The loopback address of host ``host``: one address per host makes each a
    distinct host (and download slot) for Scrapy without any DNS."""
    return f"127.0.0.{FIRST_HOST_OCTET + host}"


def page_path(page: int) -> str:
    return f"/p/{page}"


def page_url(host: int, page: int, port: int) -> str:
    """The canonical URL of a page (no tracking parameters)."""
    return f"http://{host_address(host)}:{port}{page_path(page)}"


@dataclass(frozen=True)
class Link:
    """One ``<a href>`` on a page: its target and how the href is written."""

    host: int
    page: int
    form: str
    tracking: bool = False

    def href(self, port: int) -> str:
        query = TRACKING_QUERY if self.tracking else ""
        if self.form == "absolute":
            return page_url(self.host, self.page, port) + query
        if self.form == "scheme-relative":
            return f"//{host_address(self.host)}:{port}{page_path(self.page)}{query}"
        if self.form == "root":
            return page_path(self.page) + query
        # Relative to "/p/<n>", a bare number resolves to "/p/<number>".
        return f"{self.page}{query}"


class LinkGraph:
    """Which links each page carries; immutable once built."""

    def __init__(
        self,
        hosts: int = 3,
        pages_per_host: int = 20,
        fanout: int = 4,
        seed: int = 0,
        tracking_params: bool = False,
    ) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
        if pages_per_host < 1:
            raise ValueError(f"pages_per_host must be >= 1, got {pages_per_host}")
        if fanout < 1:
            raise ValueError(f"fanout must be >= 1, got {fanout}")
        self.hosts = hosts
        self.pages_per_host = pages_per_host
        self.fanout = fanout
        self.seed = seed
        self.tracking_params = tracking_params
        rng = random.Random(seed)
        self._links: dict[PageId, tuple[Link, ...]] = {
            (host, page): self._build_page(rng, host, page)
            for host in range(hosts)
            for page in range(pages_per_host)
        }

    def _pick_target(self, rng: random.Random, host: int) -> PageId:
        target_host = host
        if self.hosts > 1 and rng.random() < _CROSS_HOST_SHARE:
            target_host = rng.randrange(self.hosts - 1)
            target_host += target_host >= host  # skip our own host
        return target_host, rng.randrange(self.pages_per_host)

    def _make_link(self, rng: random.Random, host: int, target: PageId) -> Link:
        forms = _SAME_HOST_FORMS if target[0] == host else _CROSS_HOST_FORMS
        tracking = self.tracking_params and rng.random() < _TRACKING_SHARE
        return Link(target[0], target[1], rng.choice(forms), tracking)

    def _build_page(self, rng: random.Random, host: int, page: int) -> tuple[Link, ...]:
        targets: list[PageId] = []
        if page + 1 < self.pages_per_host:
            targets.append((host, page + 1))  # the chain that makes every page reachable
        while len(targets) < self.fanout:
            targets.append(self._pick_target(rng, host))
        links = [self._make_link(rng, host, target) for target in targets]
        if rng.random() < _DUPLICATE_SHARE:
            original = rng.choice(links)
            links.append(self._make_link(rng, host, (original.host, original.page)))
        rng.shuffle(links)
        return tuple(links)

    def links(self, host: int, page: int) -> tuple[Link, ...]:
        """The links of one page, in page order (may repeat a target)."""
        return self._links[(host, page)]

    def has_page(self, host: int, page: int) -> bool:
        return (host, page) in self._links

    def start_pages(self) -> list[PageId]:
        return [(host, 0) for host in range(self.hosts)]

    def reachable(self) -> set[PageId]:
        """Every page reachable from the start pages (by construction: all of them)."""
        seen = set(self.start_pages())
        frontier = deque(seen)
        while frontier:
            for link in self._links[frontier.popleft()]:
                target = (link.host, link.page)
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
        return seen
