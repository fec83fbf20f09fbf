"""Which client a REDISSPINE_REDIS_URL asks for, and one clear line when it asks for none."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from scrapy_redisspine import _redis_urls as redis_urls
from scrapy_redisspine import cli
from scrapy_redisspine._settings_checks import ConfigError, as_redis_url
from scrapy_redisspine.connection import client_from_url, describe_url, is_cluster, routed_to


def test_a_cluster_url_names_every_startup_node_and_the_credentials() -> None:
    target = redis_urls.parse("rediss+cluster://bob:s%40cret@10.0.0.1:7000,node-b:7001")
    assert target.kind == redis_urls.CLUSTER
    assert target.tls
    assert target.nodes == (("10.0.0.1", 7000), ("node-b", 7001))
    assert (target.username, target.password) == ("bob", "s@cret")


def test_a_sentinel_url_names_the_service_and_the_database() -> None:
    target = redis_urls.parse("redis+sentinel://:pw@s1:26379,s2:26380/primary/3")
    assert target.kind == redis_urls.SENTINEL
    assert not target.tls
    assert target.nodes == (("s1", 26379), ("s2", 26380))
    assert (target.service, target.db, target.password) == ("primary", 3, "pw")
    assert redis_urls.parse("redis+sentinel://s1:26379/primary").db == 0


@pytest.mark.parametrize("url", ["redis://h:1/0", "rediss://h:1", "unix:///tmp/r.sock?db=0",
                                 "REDIS://h:1"])
def test_single_server_urls_are_left_to_redis_py(url: str) -> None:
    target = redis_urls.parse(url)
    assert (target.kind, target.url) == (redis_urls.SINGLE, url)


@pytest.mark.parametrize(("url", "said"), [
    ("http://u:secret@h/", "is no Redis URL"),
    ("redis+cluster://u:secret@h", "'h' is no host:port"),
    ("redis+cluster://u:secret@h:1,h:x", "'h:x' is no host:port"),
    ("redis+cluster://u:secret@h:1/2", "has no path"),
    ("redis+cluster://u:secret@h:1?ssl_cert_reqs=none", "take no ?options"),
    ("redis+sentinel://u:secret@h:1", "names the service"),
    ("redis+sentinel://u:secret@h:1/svc/zero", "must be a number"),
])
def test_a_bad_url_is_one_line_that_names_the_fault_and_hides_the_password(
    url: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        as_redis_url("REDISSPINE_REDIS_URL", url)
    message = str(caught.value)
    assert message.startswith("REDISSPINE_REDIS_URL: ")
    assert said in message
    assert "secret" not in message
    assert "\n" not in message


def test_describe_url_masks_the_password_of_every_kind_of_url() -> None:
    assert describe_url("redis+cluster://u:pw@a:1,b:2") == "redis+cluster://u:***@a:1,b:2"
    assert describe_url("redis+sentinel://:pw@a:1/svc") == "redis+sentinel://:***@a:1/svc"
    assert describe_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert describe_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"


def test_an_unreachable_cluster_is_a_connection_error() -> None:
    # The cluster client asks for the slot map when it is made; its own error is no
    # RedisError, so callers (a worker's open, the CLI) would miss it.
    with pytest.raises(redis.ConnectionError, match="cannot be connected"):
        client_from_url("redis+cluster://127.0.0.1:1")
    assert not is_cluster(client_from_url("redis://127.0.0.1:1/0"))
    assert routed_to(client_from_url("redis://127.0.0.1:1/0"), "k") == {}


def test_the_cli_says_in_one_line_that_a_cluster_is_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--redis-url", "redis+cluster://:pw@127.0.0.1:1", "list"]) == \
        cli.EXIT_UNREACHABLE
    said = capsys.readouterr().err.strip()
    assert said.startswith("redisspine: cannot reach Redis at redis+cluster://:***@127.0.0.1:1")
    assert "\n" not in said
    assert "pw" not in said


def test_the_cli_refuses_a_bad_url_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--redis-url", "redis+sentinel://:pw@h:1", "list"]) == cli.EXIT_USAGE
    said = capsys.readouterr().err.strip()
    assert "names the service" in said
    assert "\n" not in said
    assert "pw" not in said


def test_a_sentinel_url_gives_a_client_of_the_service_primary() -> None:
    client = client_from_url("redis+sentinel://127.0.0.1:1/svc/2")
    assert not isinstance(client, RedisCluster)
    pool = client.connection_pool
    assert getattr(pool, "service_name", None) == "svc"
    assert pool.connection_kwargs["db"] == 2
