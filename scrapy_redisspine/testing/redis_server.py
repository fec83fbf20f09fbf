"""A throwaway redis-server for tests and benchmarks.

Tests must never touch a Redis someone else uses, and the invariants that matter
(atomic scripts, no loss across a Redis restart) only mean something on a real
server, not on a fake. So each test session spawns its own redis-server on a free
loopback port (or a unix socket) in a temporary directory, in the foreground, so
that killing it is as simple as killing a child process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine.testing._service import Service
from scrapy_redisspine.testing.servers import (
    SERVER_ENV,
    ServerVersion,
    chosen_server_binary,
    server_version,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_START_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 10.0
_PORT_ATTEMPTS = 5
_LOG_TAIL_LINES = 20


def free_port(host: str = _HOST) -> int:
    """A port that was free a moment ago; the caller retries if it is taken since."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisServerError(RuntimeError):
    """The redis-server did not start or answer; the message carries its log tail."""


class _PortTaken(Exception):
    """The server could not bind its port: pick another one."""


class RedisServer(Service):
    """One redis-server child process and its data directory.

    ``stop()`` shuts it down cleanly and removes a directory it created; ``kill()``
    simulates a crash and keeps the directory, so ``restart()`` (same port, same
    directory) shows what survives: with ``appendonly=True``, every acknowledged write.
    """

    def __init__(
        self,
        port: int | None = None,
        unix_socket: bool = False,
        appendonly: bool = False,
        directory: str | Path | None = None,
        extra_args: Sequence[str] = (),
        *,
        config_file: str | None = None,
    ) -> None:
        self.port = port
        self.config_file = config_file  # a file name in the directory, read first
        self.unix_socket = unix_socket
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self.binary: str | None = None  # the one the last start() ran

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> RedisServer:
        if self.running:
            raise RuntimeError("redis-server is already running")
        binary = chosen_server_binary()
        if self.binary != binary:
            self.binary = binary
            logger.info("test redis-server: %s (%s; %s)", binary, server_version(binary),
                        f"from {SERVER_ENV}" if os.environ.get(SERVER_ENV) else "found")
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="redisspine-test-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        pick_port = self.port is None and not self.unix_socket
        tried, tail = self.port, ""
        for _ in range(_PORT_ATTEMPTS if pick_port else 1):
            if pick_port:
                self.port = free_port()
            try:
                self._spawn(binary)
                return self
            except _PortTaken:
                # Another process took the port between our probe and the server's bind.
                tried, tail = self.port, self.log_tail()
                if pick_port:
                    self.port = None
        self._discard_directory()
        raise RedisServerError(f"redis-server could not bind port {tried}:\n{tail}")

    def _command(self, binary: str) -> list[str]:
        assert self.directory is not None
        config = [str(self.directory / self.config_file)] if self.config_file else []
        command = [
            binary,
            *config,
            "--bind", _HOST,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--dir", str(self.directory),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]
        if self.unix_socket:
            command += ["--port", "0", "--unixsocket", str(self.socket_path),
                        "--unixsocketperm", "700"]
        else:
            command += ["--port", str(self.port)]
        return command + list(self.extra_args)

    def _spawn(self, binary: str) -> None:
        assert self.directory is not None
        command = self._command(binary)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        # Errors in the arguments go to stderr before the log file is opened.
        with open(self.directory / "redis.out", "wb") as output:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.ping():
                return
            time.sleep(0.02)
        returncode = self.process.poll()
        self._reap(signal.SIGKILL)
        tail = self.log_tail()
        if returncode is not None and "Address already in use" in self._log_since(log_offset):
            raise _PortTaken
        what = (f"exited with code {returncode}" if returncode is not None
                else f"did not answer within {_START_TIMEOUT_SECONDS:.0f}s")
        self._discard_directory()
        raise RedisServerError(f"redis-server {what}: {shlex.join(command)}\n{tail}")

    def stop(self) -> None:
        """Shut down cleanly (SIGTERM: the AOF is flushed) and remove our temp dir."""
        self._reap(signal.SIGTERM)
        self._discard_directory()

    def _discard_directory(self) -> None:
        """Remove the directory if this object created it (a given one is kept)."""
        if self._own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def kill(self) -> None:
        """Crash the server (SIGKILL); the directory stays for :meth:`restart`."""
        self._reap(signal.SIGKILL)

    def restart(self) -> RedisServer:
        """Stop if running, then start on the same port and directory (AOF kept)."""
        self._reap(signal.SIGTERM)
        return self.start()

    def _reap(self, signum: int) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout=_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    # -- where it is and how it is doing ---------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def socket_path(self) -> Path:
        if self.directory is None:
            raise RuntimeError("redis-server has no directory until it is started")
        return self.directory / "redis.sock"

    @property
    def log_path(self) -> Path:
        if self.directory is None:
            raise RuntimeError("redis-server has no directory until it is started")
        return self.directory / "redis.log"

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{self.socket_path}?db=0"
        if self.port is None:
            raise RuntimeError("redis-server has no port until it is started")
        return f"redis://{_HOST}:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client; bytes in and out, like the plugin's own clients."""
        return redis.Redis.from_url(self.url, decode_responses=False, **kwargs)

    def ping(self) -> bool:
        client = self.client(socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False  # ResponseError: LOADING while the AOF is replayed
        finally:
            client.close()

    def _log_since(self, offset: int) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            return log_file.read().decode(errors="replace")
        return ""

    @property
    def version(self) -> ServerVersion:
        """The version of the binary this server runs (or would run, before a start)."""
        return server_version(self.binary or chosen_server_binary())

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The end of the server's log file and of its stdout/stderr."""
        if self.directory is None:
            return "(no log)"
        tails = []
        for path in (self.log_path, self.directory / "redis.out"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip()
                if text:
                    tails.append(f"[{path.name}]\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails) or "(no log)"
