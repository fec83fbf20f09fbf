"""Tracking-parameter stripping and URL canonicalization (tracking.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_redisspine.tracking import _canonical_url, canonical_url, tracking_params

DEFAULT = tracking_params()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://Shop.Example:443/item?utm_source=mail&id=7&gclid=x#reviews",
         "https://shop.example/item?id=7"),
        ("http://example.com:80/a?b=2&a=1", "http://example.com/a?a=1&b=2"),
        ("http://example.com:8080/a", "http://example.com:8080/a"),
        ("https://example.com", "https://example.com/"),
        ("https://example.com/?fbclid=1&UTM_Campaign=2&utm_medium=3", "https://example.com/"),
        ("https://example.com/?q=a%20b&utm_x=1", "https://example.com/?q=a%20b"),
        ("https://example.com/?b&a=", "https://example.com/?a=&b"),
        ("https://user:pw@Example.com:443/x", "https://user:pw@example.com/x"),
        ("http://[::1]:80/x", "http://[::1]/x"),
        ("https://example.com/?msclkid=1&mc_eid=2&keep=1", "https://example.com/?keep=1"),
    ],
)
def test_canonical_url(url: str, expected: str) -> None:
    assert canonical_url(url, DEFAULT) == expected


def test_non_tracking_parameters_with_similar_names_are_kept() -> None:
    url = "https://example.com/?utmost=1&gclid_x=2&page=3"
    assert canonical_url(url, DEFAULT) == "https://example.com/?gclid_x=2&page=3&utmost=1"


def test_encoded_tracking_name_is_stripped_and_values_keep_their_encoding() -> None:
    url = "https://example.com/?utm%5Fsource=x&q=caf%C3%A9+bar"
    assert canonical_url(url, DEFAULT) == "https://example.com/?q=caf%C3%A9+bar"


def test_extra_names_and_prefixes_extend_the_default_list() -> None:
    params = tracking_params(("sessionid", "ref_*"))
    url = "https://example.com/?SessionID=1&ref_src=2&ref=3&utm_x=4"
    assert canonical_url(url, params) == "https://example.com/?ref=3"


def test_unparsable_url_is_returned_unchanged() -> None:
    assert canonical_url("http://example.com:99999999/", DEFAULT) == "http://example.com:99999999/"


# The fast path of canonical_url (a URL already canonical is returned as it is) must
# never change a fingerprint: a persisted crawl's dedup record holds the old ones.
_TRICKY = ["http://h42.example/p/12345", "https://a.b/", "http://a.b//x", "http://A.b/x",
           "HTTP://a.b/x", "http://a.b:80/x", "http://a.b:8080/x", "http://u@a.b/x",
           "http://a.b/x?y=1", "http://a.b/x#f", "http://a.b", "http://a.b/x y",
           "http://a.b/x\ty", "http://a.b/x\n", " http://a.b/x", "http://a.b/x%20y",
           "http://[::1]/x", "http://a.b/;p=1", "ftp://a.b/x", "http://a_b.c/x",
           "http://a.b/é", "http://é.b/x", "http://a.b/x\x7f", "mailto:x@a.b"]


@pytest.mark.parametrize("url", _TRICKY)
def test_the_fast_path_agrees_with_the_parse(url: str) -> None:
    assert canonical_url(url, DEFAULT) == _canonical_url(url, DEFAULT)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="hHtTpPsS:/.?#&=@[]% \t\n\x7f-_~;aAé0189", max_size=30))
def test_the_fast_path_agrees_with_the_parse_on_any_text(tail: str) -> None:
    for url in (tail, "http://" + tail, "http://a.example/" + tail):
        assert canonical_url(url, DEFAULT) == _canonical_url(url, DEFAULT)
