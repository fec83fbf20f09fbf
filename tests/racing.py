"""Processes that race each other on the real redis-server, for the concurrency tests.

Threads would share one interpreter (and its lock); the races that matter are between
processes, as between workers of a crawl. Each target runs in a spawned process and
waits at a barrier, so that all of them start together.
"""

from __future__ import annotations

import multiprocessing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def run_at_once(
    targets: Sequence[tuple[Callable[..., None], tuple[Any, ...]]], timeout: float
) -> list[Any]:
    """Run ``target(*args, start, results)`` for each ``(target, args)``, each in its
    own process, all let go together by the barrier ``start``.

    Each target puts one item on the queue ``results``; the items come back in the
    order the processes put them. Fails unless every process exits with code 0.
    """
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(len(targets))
    results = context.Queue()
    processes = [context.Process(target=target, args=(*args, start, results))
                 for target, args in targets]
    for process in processes:
        process.start()
    try:
        collected = [results.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)
    return collected
