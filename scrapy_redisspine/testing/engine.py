"""An engine stand-in for driving a scheduler without a crawl (benchmarks, tests).

The spine's scheduler talks to Scrapy's engine through a small port
(:class:`~scrapy_redisspine._engine.EnginePort`): how many download slots are free,
a wake-up when work arrives, whether start requests are still being consumed, and a
callback for "done with this request". This stand-in answers with a fixed number of
free slots, no start requests and ignored wake-ups, and hands the caller the done
callback, so a driver can take requests and report them done at once.
"""

from __future__ import annotations

from typing import Any


class StandInEngine:
    """Always ``free_slots`` free download slots; :attr:`done` is the engine's "done
    with this request" (set when the scheduler attaches)."""

    def __init__(self, free_slots: int = 16) -> None:
        self.free_slots = free_slots
        self.done: Any = None

    def attach(self, on_request_done: Any) -> None:
        self.done = on_request_done

    def detach(self) -> None:
        pass

    def free_download_slots(self) -> int:
        return self.free_slots

    def wake(self) -> None:
        pass

    def starting(self) -> bool:
        return False  # no start requests: every request is an ordinary one

    def close_spider(self, reason: str) -> None:
        pass

    def mark_failed(self) -> None:
        pass
