"""Spiders of the end-to-end test project."""
