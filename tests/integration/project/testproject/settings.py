"""Settings of the end-to-end test project.

Only what every test needs lives here; each test passes the rest with ``-s``
(the Redis URL above all, so no test can reach a Redis it did not start).
"""

BOT_NAME = "testproject"
SPIDER_MODULES = ["testproject.spiders"]
NEWSPIDER_MODULE = "testproject.spiders"

ADDONS = {"scrapy_redisspine.Addon": 0}

# The test site answers /robots.txt with 404; skipping it keeps the site's request
# log to the pages the tests count.
ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
# Scrapy 2.19 starts a code-executing HTTP control server and writes a job file in
# the user profile by default; test workers need neither.
REMOTE_CONTROL_ENABLED = False
# Local site, no politeness needed unless a test asks for it with -s.
DOWNLOAD_DELAY = 0
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 8
# A hung test should fail on the test's timeout, not wait for Scrapy's 180 s.
DOWNLOAD_TIMEOUT = 30
RETRY_ENABLED = True
# Off unless a test sets LINKS_KILL_AFTER_ITEM; after the add-on's own extensions, so
# that the plugin hears of an item before this kills the worker.
EXTENSIONS = {"testproject.extensions.KillAfterItem": 900, "testproject.extensions.ReportLoop": 0,
              "testproject.extensions.LoopLag": 0,
              "testproject.extensions.RedisNearUnderLoad": 0}
