"""A worker's identity and its Redis connection (configured URL or embedded server).

Kept apart from the Scrapy adapters so that the scheduler and the dupefilter (used
alone with another scheduler) connect the same way and log the same line.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_redisspine.connection import (
    client_from_url,
    describe_url,
    ensure_embedded_server,
    shutdown_embedded_if_unused,
)

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.settings import SpineConfig

logger = logging.getLogger(__name__)


def new_worker_id() -> str:
    """Unique per process and readable in Redis: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def default_embedded_dir(createdir: bool = True) -> str:
    """``.scrapy/redisspine`` inside the Scrapy project (or the current directory)."""
    try:
        from scrapy.utils.project import data_path

        return data_path("redisspine", createdir=createdir)
    except Exception:  # outside a project Scrapy may refuse; fall back to cwd
        return os.path.join(os.getcwd(), ".scrapy", "redisspine")


@dataclass
class WorkerConnection:
    """One Redis client, and where it points (for logs)."""

    client: redis.Redis
    description: str
    embedded_dir: str | None = None

    @classmethod
    def open(cls, config: SpineConfig, crawl_id: str, worker_id: str) -> WorkerConnection:
        if config.redis_url:
            url, embedded_dir = config.redis_url, None
            description = f"Redis {describe_url(url)}"
        else:
            embedded_dir = config.embedded_dir or default_embedded_dir()
            url = ensure_embedded_server(embedded_dir, config.redis_server_bin)
            description = f"embedded redis-server {url} (no REDISSPINE_REDIS_URL set)"
        timeout = config.redis_timeout_seconds
        client = client_from_url(url, cooperative=True, socket_timeout=timeout,
                                 socket_connect_timeout=timeout)
        client.ping()
        return cls(client, description, embedded_dir)

    def close(self) -> None:
        self.client.close()
        if self.embedded_dir is not None and shutdown_embedded_if_unused(self.embedded_dir):
            logger.info("redisspine: stopped the embedded redis-server (no client left)")
