"""The small HTTP servers of ``redisspine metrics`` and ``redisspine dashboard``: the
standard library's WSGI server, in the foreground (Ctrl-C ends it), one thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

if TYPE_CHECKING:
    from collections.abc import Callable
    from wsgiref.simple_server import WSGIServer

    from _typeshed.wsgi import WSGIApplication


class QuietHandler(WSGIRequestHandler):
    """No line on stderr per request (a poll every few seconds would flood it)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def wsgi_server(app: WSGIApplication, host: str, port: int) -> WSGIServer:
    """A server of ``app`` on ``host:port`` (0: a free port), not started."""
    return make_server(host, port, app, handler_class=QuietHandler)


def serve(server: WSGIServer, path: str, announce: Callable[[str], None]) -> None:
    """Say where (``announce`` gets the URL), then serve until interrupted."""
    with server:
        host, port = server.server_address[:2]
        announce(f"http://{host!s}:{port}{path}")
        server.serve_forever()
