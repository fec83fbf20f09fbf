"""What the worker's own Python pays per request for two steps, before and after
session 15's changes, measured side by side in one process (no Redis needed):

- ``pack``: packing an enqueue call of a page's 100 links (five arguments each) and a
  lease call's 16 acks (seven each) into RESP, with redis-py's packer (what a
  connection had) and with :class:`~scrapy_redisspine._packing.HiredisFirstPacker`;
- ``encode``: a request's payload, through the codec's general path and its path for
  plain ``Request`` objects, for a bare GET and for a GET with a callback and
  ``meta={"depth": 2}`` (what a crawl's links look like after DepthMiddleware).

Best of ``--repeat`` timings of ``--number`` calls each, in µs per request.

    .venv/bin/python benchmarks/client_costs.py
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _best(function: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number


def pack_costs(number: int, repeat: int) -> dict[str, float]:
    """µs per request of packing the enqueue and ack arguments, both packers."""
    from redis.connection import Connection

    from scrapy_redisspine._packing import pack_with_hiredis

    theirs, ours = Connection(), Connection()
    pack_with_hiredis(ours)
    enqueue = ("EVALSHA", "f" * 40, 16, *(f"P:{{c}}:k{i}" for i in range(16)),
               "1", "0", "w-1", 0, 8, 0, 0, 0, 0, 1000, 0.5)
    for i in range(100):  # flags, fingerprint, lane, priority key, payload
        enqueue += (0, bytes(14), f"h{i}.example", b"\x80\x00", f"http://h{i}.example/p/{i}")
    acks = ("EVALSHA", "f" * 40, 16, *(f"P:{{c}}:k{i}" for i in range(16)),
            "1", "0", "w-1", 16, 8, 0, 0, 0, 0, 1000, 0.5)
    for i in range(16):  # key, token, rest ms, items, latency ms, status, ended
        acks += (f"0000{i:06d}", "123", 0, 0, 12, 200, 1765000000.25)
    report: dict[str, float] = {}
    for name, args, per in (("enqueue", enqueue, 100), ("ack", acks, 16)):
        for who, connection in (("redis_py", theirs), ("hiredis_first", ours)):
            seconds = _best(lambda c=connection, a=args: c.pack_command(*a), number, repeat)
            report[f"pack_{name}_{who}_us"] = round(seconds * 1e6 / per, 3)
    return report


def encode_costs(number: int, repeat: int) -> dict[str, float]:
    """µs per request of the codec's encode, general path and plain path."""
    import scrapy

    import scrapy_redisspine.request_codec as codec_module
    from scrapy_redisspine.request_codec import RequestCodec
    from scrapy_redisspine.serialization import get_serializer

    class Spider(scrapy.Spider):
        name = "costs"

        def parse_item(self, response: Any) -> None:
            pass

    spider = Spider()
    codec = RequestCodec(spider, get_serializer("msgpack"))
    requests = {
        "bare": scrapy.Request("http://h1.example/p/1"),
        "callback_depth": scrapy.Request("http://h1.example/p/1", callback=spider.parse_item,
                                         meta={"depth": 2}),
    }
    report: dict[str, float] = {}
    known = codec_module._PLAIN_FIELDS_KNOWN
    try:
        for path, plain in (("general", False), ("plain", known)):
            codec_module._PLAIN_FIELDS_KNOWN = plain
            for name, request in requests.items():
                seconds = _best(lambda r=request: codec.encode(r), number, repeat)
                report[f"encode_{name}_{path}_us"] = round(seconds * 1e6, 3)
    finally:
        codec_module._PLAIN_FIELDS_KNOWN = known
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    report = {**pack_costs(args.number, args.repeat),
              **encode_costs(args.number * 10, args.repeat)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
