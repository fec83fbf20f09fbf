"""The Lua loader: include expansion, and every script as the server receives it."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine import scripts
from scrapy_redisspine.scripts._source import ScriptSourceError, expand

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import redis

_FUNCTION = re.compile(r"^local function (\w+)", re.MULTILINE)


def _reader(files: dict[str, str]) -> Callable[[str], str]:
    """A reader over a dict, failing as the package reader does."""

    def read(relative: str) -> str:
        try:
            return files[relative]
        except KeyError:
            raise FileNotFoundError(relative) from None

    return read


class TestIncludes:
    def test_a_library_comes_once_and_after_what_it_includes(self) -> None:
        read = _reader({
            "lib/a.lua": "-- #include b\n-- #include c\nlocal function a() end\n",
            "lib/b.lua": "-- #include c\nlocal function b() end\n",
            "lib/c.lua": "local function c() end",
        })
        expansion = expand("-- #include a\n-- #include c\nreturn 1\n", "main.lua", read)
        assert expansion.libraries == ("c", "b", "a")
        assert expansion.text == (
            "local function c() end\nlocal function b() end\nlocal function a() end\n"
            "return 1\n"
        )

    def test_a_cycle_is_an_error_naming_the_chain(self) -> None:
        read = _reader({
            "lib/a.lua": "-- #include b\n",
            "lib/b.lua": "-- #include c\n",
            "lib/c.lua": "-- #include a\n",
        })
        with pytest.raises(ScriptSourceError, match=r"cycle: lib/a\.lua -> lib/b\.lua -> "
                           r"lib/c\.lua -> lib/a\.lua \(included from main\.lua\)"):
            expand("-- #include a\n", "main.lua", read)

    def test_a_library_including_itself_is_a_cycle(self) -> None:
        read = _reader({"lib/a.lua": "-- #include a\n"})
        with pytest.raises(ScriptSourceError, match=r"cycle: lib/a\.lua -> lib/a\.lua"):
            expand("-- #include a\n", "main.lua", read)

    def test_an_unknown_library_is_an_error_naming_who_included_it(self) -> None:
        read = _reader({"lib/a.lua": "-- #include nope\n"})
        with pytest.raises(ScriptSourceError, match=r"unknown Lua library 'nope' \(no "
                           r"scripts/lib/nope\.lua\), included by main\.lua -> lib/a\.lua"):
            expand("-- #include a\n", "main.lua", read)

    def test_a_bad_library_name_is_an_error(self) -> None:
        with pytest.raises(ScriptSourceError, match="bad library name"):
            expand("-- #include ../lease\n", "main.lua", _reader({}))

    def test_libraries_are_read_from_a_directory_too(self, tmp_path: Path) -> None:
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "one.lua").write_text("local function one() end\n")
        expansion = expand("-- #include one\n", "main.lua",
                           lambda relative: (tmp_path / relative).read_text())
        assert expansion.libraries == ("one",)


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
class TestEveryScript:
    def test_no_include_is_left_and_no_library_comes_twice(self, name: str) -> None:
        text = scripts.source(name)
        assert "#include" not in text
        defined = Counter(_FUNCTION.findall(text))
        assert [function for function, n in defined.items() if n > 1] == []
        assert len(set(scripts.libraries(name))) == len(scripts.libraries(name))

    def test_the_server_compiles_it(self, name: str, real_redis: redis.Redis) -> None:
        sha = real_redis.script_load(scripts.source(name))
        assert real_redis.script_exists(sha) == [True]
