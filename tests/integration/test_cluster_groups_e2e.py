"""Politeness across crawls on a real 3-master Redis Cluster (issue 20).

On a cluster a crawl lives in its politeness group's slots (placement.py), so a lease
still takes a lane's request and the lane's group-wide slot in one script. Checked
from the test site's own log, as on one server (test_politeness_groups_e2e): two
crawls of three ``scrapy crawl`` workers each, one group, delay D: no two fetches of
a host overlap and no gap is below D; unsharded, and sharded over the three masters.
The control (two groups) shows the check would see crawls that ignore each other. A
crawl laid out by an earlier version (its own slot) still runs, saying it keeps its
own budget; workers that disagree with the group's layout are refused in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine import cli
from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.placement import GroupShardsConflict, claim_group_shards, locate
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from tests.integration.crawlproc import (
    Fleet,
    assert_finished,
    assert_refused,
    cluster_keys,
    wait_for,
    wait_workers,
)
from tests.integration.test_politeness_groups_e2e import (
    CLOCK_SLACK,
    FAST_RECOVERY,
    _assert_polite,
    _run_both,
    _two_crawls,
)
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]

@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(masters=3) as servers:
        yield servers


def _fleet(project_dir: Path, worker_log_dir: Path, url: str, crawl: str) -> Fleet:
    return Fleet(project_dir, {"REDISSPINE_REDIS_URL": url, "REDISSPINE_CRAWL_ID": crawl},
                 worker_log_dir / crawl)


@pytest.mark.parametrize("shards", [1, 3])
def test_two_crawls_of_one_group_on_a_cluster_keep_every_hosts_delay_with_no_overlap(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path, shards: int,
) -> None:
    delay = 0.3
    group = f"shops-{shards}"
    site = site_factory(hosts=3, pages_per_host=6, fanout=3, latency=0.05)
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, f"groups-{shards}")
    first, second = _two_crawls(fleet, site, DOWNLOAD_DELAY=delay, REDISSPINE_SHARDS=shards,
                                REDISSPINE_POLITENESS_GROUP=group)
    _, gaps = _run_both(fleet, site, first, second, timeout=180)
    _assert_polite(gaps, delay)
    # Where the keys are: each crawl's frontier beside the group's budget keys.
    client = client_from_url(cluster.url)
    for settings in (first, second):
        keys = cluster_keys(settings["REDISSPINE_CRAWL_ID"], group, shards)
        views = keys.shard_views() if shards > 1 else (keys,)
        assert all(key_slot(view.queue.encode()) == key_slot(view.group_busy.encode())
                   for view in views)
        assert sum(int(client.hget(view.stats, "acked") or 0) for view in views) >= len(
            site.all_urls())
        assert client.hget(keys.crawl_groups, keys.crawl_id) == group.encode()
    if shards > 1:
        masters = {cluster.master_of_slot(key_slot(view.queue.encode())).port
                   for view in cluster_keys("x", group, shards).shard_views()}
        assert len(masters) >= 2, "the group's slots spread over masters"


def test_two_crawls_of_different_groups_on_a_cluster_do_not_share_a_budget(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path,
) -> None:
    """The control: the test above would notice crawls that ignore each other."""
    delay = 0.3
    site = site_factory(hosts=3, pages_per_host=6, fanout=3, latency=0.05)
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, "apart")
    first, second = _two_crawls(fleet, site, DOWNLOAD_DELAY=delay,
                                REDISSPINE_POLITENESS_GROUP="apart-a")
    second["REDISSPINE_POLITENESS_GROUP"] = "apart-b"
    _, gaps = _run_both(fleet, site, first, second, timeout=180)
    assert min(gaps.values()) < delay - CLOCK_SLACK


def test_a_crawl_whose_only_worker_died_is_swept_by_the_other_crawl_on_a_cluster(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=8, fanout=3, latency=0.4)
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, "dead-crawl")
    first, second = _two_crawls(fleet, site, REDISSPINE_POLITENESS_GROUP="swept",
                                **FAST_RECOVERY)
    crawl_a = cluster_keys(first["REDISSPINE_CRAWL_ID"], "swept")
    client = client_from_url(cluster.url)
    [victim] = fleet.start(1, first, log="a")
    wait_for(lambda: client.hlen(crawl_a.inflight) >= 2, 60, "leases held by the victim")
    victim.kill()
    victim.process.wait()
    held = client.hlen(crawl_a.inflight)
    results = wait_workers(fleet.start(2, second, log="b"), timeout=180)
    assert_finished(results)
    assert sum(r.stats.get("response_received_count", 0) for r in results) >= len(
        site.all_urls())
    assert sum(r.stats.get("redisspine/recovery/group_requeued", 0) for r in results) == held
    assert client.hlen(crawl_a.inflight) == 0
    assert not client.exists(crawl_a.group_busy), client.hgetall(crawl_a.group_busy)


def test_a_worker_of_another_number_of_shards_than_its_group_is_refused(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
) -> None:
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, "layout-a")
    settings = fleet.crawling(test_site, REDISSPINE_POLITENESS_GROUP="layout",
                              REDISSPINE_SHARDS=2)
    assert_finished(fleet.run(1, settings, log="a", timeout=180))
    other = {**settings, "REDISSPINE_CRAWL_ID": "layout-b", "REDISSPINE_SHARDS": 1}
    [refused] = fleet.run(1, other, log="b", timeout=120)
    assert_refused(refused, "redisspine_crawl_conflict", "politeness group 'layout'",
                   "REDISSPINE_SHARDS = 2")
    # And a crawl of the group is not taken over by a worker of another group.
    moved = {**settings, "REDISSPINE_POLITENESS_GROUP": "elsewhere"}
    [refused] = fleet.run(1, moved, log="c", timeout=120)
    assert_refused(refused, "redisspine_crawl_conflict", "politeness group 'layout'",
                   "REDISSPINE_POLITENESS_GROUP")


def test_garbage_in_the_groups_number_of_slots_refuses_in_one_line_and_no_crawl_moves(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
) -> None:
    """Guessing would spread the group's lanes over a number of slots the others do not
    use (their budgets apart): the worker refuses, naming the key and the fix."""
    client = client_from_url(cluster.url)
    keys = cluster_keys("garbled", "garbled")
    client.set(keys.group_shards, "three")
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, "garbled")
    [refused] = fleet.run(1, fleet.crawling(test_site, REDISSPINE_POLITENESS_GROUP="garbled"),
                          log="w", timeout=120)
    assert_refused(refused, "redisspine_corrupt_key", keys.group_shards, "'three'",
                   "REDISSPINE_SHARDS")
    assert not client.exists(keys.record)
    assert not test_site.requests()
    client.set(keys.group_shards, "1")  # mended: the crawl runs
    assert_finished(fleet.run(1, fleet.crawling(
        test_site, REDISSPINE_POLITENESS_GROUP="garbled"), log="mended", timeout=180))


def test_a_crawl_laid_out_in_its_own_slot_by_an_earlier_version_still_runs(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before groups were shared on a cluster, a crawl kept all its keys under its own
    tag: a worker finds it there (not a fresh crawl in the group's slots), fetches
    what it queued, finishes, and says the crawl keeps a budget of its own."""
    crawl = "earlier-layout"
    old = CrawlKeys("redisspine", crawl, cluster=True)
    client = client_from_url(cluster.url)
    frontier = Frontier(client, old, "earlier-worker")
    frontier.register(flush=False, alive_ms=1_000, spider="links")
    frontier.done_starting()  # (else the crawl waits for it to time out as a starter)
    frontier.leave()
    # (the seed finds the crawl where it is, as every tool does: placement.locate)
    assert cli.main(["--redis-url", cluster.url, "seed", crawl,
                     *test_site.start_urls()]) == 0
    assert queued_count(client, old) == len(test_site.start_urls())
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
    [result] = fleet.run(1, fleet.crawling(test_site), log="w", timeout=180)
    assert_finished([result])
    assert "was created by a version that kept politeness per crawl there" in result.log
    assert result.stats.get("response_received_count", 0) >= len(test_site.all_urls())
    assert int(client.hget(old.stats, "acked") or 0) >= len(test_site.all_urls())
    assert client.hget(old.crawl_groups, crawl) is None
    capsys.readouterr()
    assert cli.main(["--redis-url", cluster.url, "status", crawl, "--json"]) == 0
    assert '"acked"' in capsys.readouterr().out


def test_the_cli_finds_a_colocated_crawl_of_a_group_it_was_not_told(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, "found-by-cli")
    settings = fleet.crawling(test_site, REDISSPINE_POLITENESS_GROUP="unnamed")
    assert_finished(fleet.run(1, settings, log="w", timeout=180))
    capsys.readouterr()
    assert cli.main(["--redis-url", cluster.url, "status", "found-by-cli", "--json"]) == 0
    out = capsys.readouterr().out
    assert f'"acked": {len(test_site.all_urls())}' in out.replace("\n", " ") or (
        str(len(test_site.all_urls())) in out), out


class TestPlacement:
    """placement.locate and claim_group_shards on the real cluster."""

    def test_a_new_crawl_goes_to_its_groups_slot(self, cluster: ClusterServers) -> None:
        client = client_from_url(cluster.url)
        placed = locate(client, CrawlKeys("redisspine", "new-crawl", "place-a"))
        assert placed == cluster_keys("new-crawl", "place-a")

    def test_the_groups_number_of_slots_is_claimed_once_and_kept(
        self, cluster: ClusterServers
    ) -> None:
        client = client_from_url(cluster.url)
        first = locate(client, CrawlKeys("redisspine", "one", "place-b", shards=2))
        claim_group_shards(client, first)
        # another crawl of the group: located with the group's N, whatever it asked
        assert locate(client, CrawlKeys("redisspine", "two", "place-b")).shards == 2
        with pytest.raises(GroupShardsConflict, match="REDISSPINE_SHARDS = 2"):
            claim_group_shards(client, cluster_keys("two", "place-b", shards=3))

    def test_a_registered_crawl_is_found_in_its_group_whatever_the_settings_say(
        self, cluster: ClusterServers
    ) -> None:
        client = client_from_url(cluster.url)
        keys = cluster_keys("registered", "place-c")
        client.hset(keys.crawl_groups, "registered", "place-c")
        assert locate(client, CrawlKeys("redisspine", "registered")) == keys

    def test_a_crawl_in_its_own_slot_from_an_earlier_version_stays_there(
        self, cluster: ClusterServers
    ) -> None:
        client = client_from_url(cluster.url)
        old = CrawlKeys("redisspine", "old-crawl", "place-d", cluster=True)
        client.hset(old.record, "epoch", "e")
        assert locate(client, CrawlKeys("redisspine", "old-crawl", "place-d")) == old
