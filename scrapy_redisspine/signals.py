"""Signals the plugin sends through Scrapy's signal manager.

``worker_opened`` lets the recovery extension share the scheduler's connection and
worker identity instead of registering a second, different worker in Redis.
"""

#: Sent by the scheduler once it joined its crawl. Arguments: ``scheduler``.
worker_opened = object()

#: Sent by the scheduler as it starts closing, while its connection is still open
#: (e.g. for a last push of fleet stats). Arguments: ``scheduler``.
worker_closing = object()
