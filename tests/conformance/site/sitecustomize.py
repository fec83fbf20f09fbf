"""Reach the crawlers of the child processes Scrapy's tests start.

Some of Scrapy's tests run a crawl in a child process (``CrawlerProcess`` scripts,
``python -m scrapy.cmdline``). The conformance plugin puts this directory on
``PYTHONPATH`` and its redis-server's URL in ``REDISSPINE_CONFORMANCE_REDIS_URL``;
Python then runs this module at start-up in every child. It must not import Scrapy
here (that could install a reactor before the child chooses one): it waits for
``scrapy.addons`` to be imported and then wraps it as the plugin does in-process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any

_URL = os.environ.get("REDISSPINE_CONFORMANCE_REDIS_URL")
_TARGET = "scrapy.addons"


class _WrapAddonsOnImport(importlib.abc.MetaPathFinder):
    """Finds ``scrapy.addons`` with the other finders, then installs the wrap right
    after the module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
            try:
                import redisspine_conformance
            finally:
                sys.path.pop(0)
            redisspine_conformance.install(_URL)  # type: ignore[arg-type]

        loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


if _URL:
    sys.meta_path.insert(0, _WrapAddonsOnImport())
