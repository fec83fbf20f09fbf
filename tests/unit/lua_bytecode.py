"""The global names a Lua chunk reads or writes, from its Lua 5.1 bytecode.

Redis runs Lua 5.1. A name no ``local`` declares compiles to GETGLOBAL (or
SETGLOBAL), so the bytecode lists, exactly, what a chunk takes from outside
itself: for a library, anything but Redis's own globals would be a name it
expects a script to provide. lupa (a fakeredis dependency) compiles and dumps;
the format is the one of Lua 5.1's ``ldump.c``.
"""

from __future__ import annotations

import struct

from lupa import lua51

_GETGLOBAL, _SETGLOBAL = 5, 7
_HEADER = b"\x1bLuaQ\x00\x01\x04\x08\x04\x08\x00"  # little endian, 4-byte int, 8-byte size_t


def bytecode(source: str) -> bytes:
    """``source`` compiled by Lua 5.1 and dumped (``string.dump``): its code, constants
    and line numbers."""
    runtime = lua51.LuaRuntime(encoding=None)
    dump = runtime.eval(
        "function(src) local fn = assert(loadstring(src, 'chunk')) return string.dump(fn) end"
    )
    return bytes(dump(source.encode()))


def global_names(source: str) -> tuple[set[str], set[str]]:
    """(names read, names written) as globals anywhere in ``source``."""
    blob = bytecode(source)
    if not blob.startswith(_HEADER):
        raise ValueError(f"unexpected Lua bytecode header {blob[:12]!r}")
    reads: set[str] = set()
    writes: set[str] = set()
    _Reader(blob, len(_HEADER)).function(reads, writes)
    return reads, writes


class _Reader:
    def __init__(self, blob: bytes, offset: int) -> None:
        self.blob, self.at = blob, offset

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.blob, self.at)
        self.at += struct.calcsize("<" + fmt)
        return int(value)

    def string(self) -> str | None:
        size = self.take("Q")
        text = self.blob[self.at:self.at + size - 1].decode("latin-1") if size else None
        self.at += size
        return text

    def function(self, reads: set[str], writes: set[str]) -> None:
        self.string()  # source
        self.at += 4 + 4 + 4  # line defined, last line, nups/params/vararg/stack bytes
        code = [self.take("I") for _ in range(self.take("i"))]
        constants: list[object] = []
        for _ in range(self.take("i")):
            kind = self.take("B")
            if kind == 1:
                constants.append(self.take("B"))
            elif kind == 3:
                self.at += 8
                constants.append(None)
            elif kind == 4:
                constants.append(self.string())
            else:
                constants.append(None)
        for instruction in code:
            opcode, bx = instruction & 0x3F, instruction >> 14
            if opcode in (_GETGLOBAL, _SETGLOBAL):
                (reads if opcode == _GETGLOBAL else writes).add(str(constants[bx]))
        for _ in range(self.take("i")):
            self.function(reads, writes)
        lines = self.take("i")  # line info (not `at += take()`: at is read first)
        self.at += 4 * lines
        for _ in range(self.take("i")):  # local variables
            self.string()
            self.at += 8
        for _ in range(self.take("i")):  # upvalue names
            self.string()
