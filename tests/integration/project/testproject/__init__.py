"""Scrapy project used by the end-to-end tests (run with cwd = its parent directory)."""
