"""Settings of the example project.

One line turns the plugin on (``ADDONS``); the ``REDISSPINE_*`` lines below are
optional and show the defaults worth knowing. Any of them can be overridden per
run with ``scrapy crawl example -s NAME=VALUE``.
"""

BOT_NAME = "example"
SPIDER_MODULES = ["example.spiders"]
NEWSPIDER_MODULE = "example.spiders"

# The add-on sets SCHEDULER and DUPEFILTER_CLASS (and the plugin's other
# components), so the request queue and the seen-set live in Redis.
ADDONS = {"scrapy_redisspine.Addon": 0}

# Where the shared Redis is. Left unset, the first worker starts an embedded
# redis-server for this project (unix socket, AOF on) and later workers join it.
# REDISSPINE_REDIS_URL = "redis://127.0.0.1:6379/0"

# Where the embedded redis-server keeps its socket, AOF and log (default:
# .scrapy/redisspine inside the project).
# REDISSPINE_EMBEDDED_DIR = ".scrapy/redisspine"

# Names the crawl in Redis: every worker with the same id shares one frontier.
# Defaults to the spider's name.
REDISSPINE_CRAWL_ID = "example"

# Keep the crawl's keys after it finishes, so a rerun resumes it and skips pages
# already seen. run_example.py passes REDISSPINE_FLUSH_ON_START=True instead, so
# that each demo run starts from scratch (the flush is skipped while other
# workers of the crawl are alive, so a late joiner cannot wipe its peers' work).
REDISSPINE_PERSIST = True

# How requests are stored in Redis: "msgpack" (compact) or "json" (readable
# with redis-cli). Never pickle: a shared Redis must not be able to run code.
REDISSPINE_SERIALIZER = "msgpack"

# Most requests a worker leases in one round trip (never more than its free
# download slots).
REDISSPINE_LEASE_BATCH_SIZE = 16

# Among requests of equal priority: "fifo" (breadth-first) or "lifo".
REDISSPINE_QUEUE_ORDER = "fifo"

# False: a worker closes with reason "finished" once the whole fleet has nothing
# queued and nothing in flight. True: service mode, wait for new requests.
REDISSPINE_KEEP_ALIVE = False

# Plain Scrapy settings. The local test site answers /robots.txt with 404.
ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
# Scrapy 2.19 runs a code-executing HTTP control server per process by default;
# the example does not need it.
REMOTE_CONTROL_ENABLED = False
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 2
DOWNLOAD_DELAY = 0.05
