"""Test and benchmark helpers: a local multi-host site and a throwaway redis-server.

They ship with the package so that the test suite, the benchmarks and the example
project all exercise the plugin against the same reproducible fixtures, with no
internet access and no shared Redis.
"""
