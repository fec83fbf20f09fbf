"""Example Scrapy project using scrapy_redisspine."""
