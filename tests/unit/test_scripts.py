"""The Lua loader: include expansion, and every script as the server receives it."""

from __future__ import annotations

import re
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine import scripts
from scrapy_redisspine.scripts._source import (
    ScriptSourceError,
    expand,
    read_package,
    strip_comments,
)
from tests.unit.lua_bytecode import bytecode, global_names

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import redis

_FUNCTION = re.compile(r"^local function (\w+)", re.MULTILINE)
_OWN_INCLUDE = re.compile(r"^-- #include (\w+)$", re.MULTILINE)
#: What may hold "--" in code without being a comment: quoted strings (escapes honoured).
_CODE_ONLY = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
#: What Redis gives every script; a library may use these and nothing else.
_REDIS_GLOBALS = {
    "redis", "string", "math", "table", "tonumber", "tostring", "unpack", "ipairs",
    "pairs", "error", "type", "select", "next", "assert", "pcall", "bit", "cjson",
    "cmsgpack", "struct",
}
LIBRARIES = sorted(
    entry.name.removesuffix(".lua")
    for entry in resources.files(scripts).joinpath("lib").iterdir()
    if entry.name.endswith(".lua")
)


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

    def test_an_include_after_code_is_an_error(self) -> None:
        read = _reader({"lib/a.lua": "local function a() end\n"})
        with pytest.raises(ScriptSourceError, match=r"main\.lua: '-- #include a' follows code"):
            expand("--[[ header ]]\nlocal x = 1\n-- #include a\n", "main.lua", read)

    def test_includes_may_follow_a_header_and_comments(self) -> None:
        read = _reader({"lib/a.lua": "local function a() end\n"})
        text = "--[[\nheader\n-- #include not_a_directive\n]]\n-- why\n\n-- #include a\nreturn 1\n"
        assert expand(text, "main.lua", read).libraries == ("a",)

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

    def test_without_its_comments_it_compiles_to_the_same_bytecode(self, name: str) -> None:
        # code, constants and line numbers: an error's line is the annotated text's
        sent, annotated = scripts.source(name), scripts.annotated(name)
        assert "--" not in _CODE_ONLY.sub("", sent), "a comment was left"
        assert len(sent) < len(annotated)
        assert bytecode(sent) == bytecode(annotated)


class TestStripComments:
    def test_strings_and_long_strings_keep_what_looks_like_a_comment(self) -> None:
        text = ('local a = "x -- y" -- gone\n'
                "local b = 'it\\'s -- kept' --[[ gone\n also gone ]] .. \"\\\"--\"\n"
                "local c = [==[ -- kept ]] still ]==] --[=[ gone ]] gone ]=]\n")
        assert strip_comments(text) == ('local a = "x -- y"\n'
                                        "local b = 'it\\'s -- kept'\n .. \"\\\"--\"\n"
                                        "local c = [==[ -- kept ]] still ]==]\n")

    def test_every_line_stays_where_it_was(self) -> None:
        text = "--[[\nheader\n]]\nlocal x = 1 -- one\n\n-- why\nreturn x\n"
        stripped = strip_comments(text)
        assert stripped == "\n\n\nlocal x = 1\n\n\nreturn x\n"
        assert bytecode(stripped) == bytecode(text)

    @pytest.mark.parametrize("text", ['local s = "open\n"', "local s = 'open",
                                      "local s = [[ open", "--[==[ open ]]"])
    def test_an_unfinished_string_or_comment_names_its_line(self, text: str) -> None:
        with pytest.raises(ScriptSourceError, match=r"^lease\.lua:1: unfinished"):
            strip_comments(text, "lease.lua")


def _file(name: str) -> str:
    """The text of a script ("lease") or library ("lib/lanes") as written."""
    return read_package(f"{name}.lua")


def _calls_into(name: str) -> set[str]:
    """The libraries whose functions the file calls itself (not through another)."""
    code = _COMMENT.sub("", _file(name))
    return {
        library for library in LIBRARIES
        if f"lib/{library}" != name
        and any(re.search(rf"\b{function}\(", code)
                for function in _FUNCTION.findall(_file(f"lib/{library}")))
    }


@pytest.mark.parametrize("name", [*scripts.SCRIPT_NAMES, *(f"lib/{lib}" for lib in LIBRARIES)])
def test_a_file_includes_exactly_the_libraries_it_calls(name: str) -> None:
    assert set(_OWN_INCLUDE.findall(_file(name))) == _calls_into(name)


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_library_header_names_what_it_includes(library: str) -> None:
    text = _file(f"lib/{library}")
    named = re.search(r"^Includes ([^.]+)\.", text, re.MULTILINE)
    assert named, f"lib/{library}.lua: no 'Includes ... .' line in its header"
    includes = _OWN_INCLUDE.findall(text)
    assert named.group(1) == (", ".join(includes) or "nothing")


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_library_takes_nothing_from_the_script(library: str) -> None:
    # Includes come before a script's code, so a name the library does not declare
    # is a global: its bytecode shows every one. KEYS and ARGV are the script's too.
    reads, writes = global_names(expand(f"-- #include {library}\n", "t.lua").text)
    assert reads <= _REDIS_GLOBALS
    assert writes == set()


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_a_script_uses_no_global_of_its_own(name: str) -> None:
    reads, writes = global_names(scripts.source(name))
    assert reads <= _REDIS_GLOBALS | {"KEYS", "ARGV"}
    assert writes == set()


def test_every_library_is_used() -> None:
    used = {library for name in scripts.SCRIPT_NAMES for library in scripts.libraries(name)}
    assert used == set(LIBRARIES)


#: Locals a script's main chunk may still declare: Lua stops at 200 active locals
#: ("main function has more than 200 local variables"), and a script's own count
#: includes every library it takes in (lib/acks.lua took enqueue.lua to 200 once).
#: benchmarks/lua_profile.py adds one; a library or a script that grows adds more.
LOCALS_HEADROOM = 8


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_a_script_has_room_for_more_locals(name: str) -> None:
    extra = "".join(f"local spare_{i} = {i}\n" for i in range(LOCALS_HEADROOM))
    bytecode(extra + scripts.source(name))  # compiles, or raises Lua's error
