"""The one module that touches Scrapy internals must notice when they change.

Run on the oldest and the newest supported Scrapy (marker ``compat``): if Scrapy's
engine slot stops looking as ``_engine`` expects, these fail, instead of a crawl that
silently never acks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import scrapy
from scrapy.core.engine import _Slot  # private on purpose: the internals under watch
from scrapy.utils.reactor import CallLaterOnce

# Private on purpose: these tests check the one module that reaches into Scrapy.
from scrapy_redisspine._engine import EngineHooks, UnsupportedScrapyError, check_engine

pytestmark = pytest.mark.compat


def _crawler(slot: Any, active: Any = None) -> Any:
    downloader = SimpleNamespace(active=set() if active is None else active, total_concurrency=8)
    return SimpleNamespace(
        engine=SimpleNamespace(_slot=slot, downloader=downloader, _start=None)
    )


def _real_slot() -> Any:
    return _Slot(True, CallLaterOnce(lambda: None), scheduler=None)  # type: ignore[arg-type]


def test_scrapys_own_engine_slot_passes_the_check() -> None:
    check_engine(_crawler(_real_slot()))


@pytest.mark.parametrize(
    ("slot", "problem"),
    [
        (None, "_slot is missing"),
        (SimpleNamespace(inprogress=[], remove_request=print,
                         nextcall=SimpleNamespace(schedule=print)), "inprogress is not a set"),
        (SimpleNamespace(inprogress=set(), nextcall=SimpleNamespace(schedule=print)),
         "remove_request() is missing"),
        (SimpleNamespace(inprogress=set(), remove_request=print), "nextcall.schedule()"),
    ],
)
def test_changed_internals_fail_loudly_naming_the_scrapy_version(slot: Any, problem: str) -> None:
    with pytest.raises(UnsupportedScrapyError) as error:
        check_engine(_crawler(slot))
    assert problem in str(error.value)
    assert f"Scrapy {scrapy.__version__}" in str(error.value)


def test_hook_runs_before_the_engine_forgets_the_request_and_can_be_removed() -> None:
    slot = _real_slot()
    hooks = EngineHooks(_crawler(slot))
    seen: list[tuple[object, bool]] = []
    request = scrapy.Request("http://example.com")
    hooks.attach(lambda r: seen.append((r, r in slot.inprogress)))
    slot.add_request(request)
    slot.remove_request(request)
    assert seen == [(request, True)], "the ack must run while the engine still holds it"
    assert request not in slot.inprogress
    hooks.detach()
    slot.add_request(request)
    slot.remove_request(request)
    assert len(seen) == 1


def test_hook_failure_still_lets_the_engine_forget_the_request() -> None:
    slot = _real_slot()
    hooks = EngineHooks(_crawler(slot))

    def broken(_: object) -> None:
        raise RuntimeError("boom")

    hooks.attach(broken)
    request = scrapy.Request("http://example.com")
    slot.add_request(request)
    with pytest.raises(RuntimeError):
        slot.remove_request(request)
    assert request not in slot.inprogress


def test_free_download_slots_counts_active_downloads() -> None:
    active = {object(), object(), object()}
    assert EngineHooks(_crawler(_real_slot(), active)).free_download_slots() == 5


def test_close_spider_uses_the_engines_call_of_this_scrapy() -> None:
    closed: list[tuple[object, ...]] = []

    async def close_spider_async(*, reason: str) -> None:
        closed.append(("async", reason))

    new = SimpleNamespace(close_spider_async=close_spider_async)
    EngineHooks(SimpleNamespace(engine=new, spider="s")).close_spider("drained")  # type: ignore[arg-type]
    old = SimpleNamespace(close_spider=lambda spider, reason: closed.append((spider, reason)))
    EngineHooks(SimpleNamespace(engine=old, spider="s")).close_spider("drained")  # type: ignore[arg-type]
    EngineHooks(SimpleNamespace(engine=None, spider="s")).close_spider("drained")  # type: ignore[arg-type]
    assert closed == [("async", "drained"), ("s", "drained")]


def test_a_missing_start_iterator_fails_loudly() -> None:
    crawler = _crawler(_real_slot())
    del crawler.engine._start
    with pytest.raises(UnsupportedScrapyError, match=r"engine\._start"):
        check_engine(crawler)


def test_starting_while_the_spider_produces_start_requests() -> None:
    crawler = _crawler(_real_slot())
    hooks = EngineHooks(crawler)
    assert not hooks.starting()
    crawler.engine._start = object()  # the engine holds the spider's start() iterator
    assert hooks.starting()
