"""Items in meta and cb_kwargs: which classes travel, and how each is rebuilt.

An item travels as ``[class path, {field: value}]``. A payload names the class, so the
class is the part that needs guarding: a payload is rebuilt only as a class that

1. an allowed entry covers by its dotted path: an entry names a class
   (``myproject.items.Product``) or a module or package (``myproject.items``,
   ``myproject``) and covers every class defined in it;
2. is defined (not just imported) in a module this worker has already imported. Only
   a class an entry names in full is imported when a payload asks for it: no payload
   makes a worker run a module's code that it would not have run anyway;
3. is an item class: a ``scrapy.Item`` subclass, a dataclass or an attrs class, and
4. is given its declared fields only (unknown fields are refused, not dropped).

What the encoder accepts passes the same checks, so what one worker stores another
worker of the same project rebuilds.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import TYPE_CHECKING, Any

import attr
from scrapy import Item

from scrapy_redisspine.serialization import SerializationError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Spider

SETTING = "REDISSPINE_ALLOWED_ITEM_CLASSES"

#: A field: (attribute name, constructor argument or None when ``init=False``).
_Field = tuple[str, str | None]
_MISSING = object()


def _declared(cls: type) -> tuple[str, tuple[_Field, ...]] | None:
    """The item kind of a class and its declared fields, or None if it is no item class."""
    if issubclass(cls, Item):
        return "scrapy.Item", tuple((name, name) for name in cls.fields)
    if dataclasses.is_dataclass(cls):
        return "dataclass", tuple(
            (field.name, field.name if field.init else None) for field in dataclasses.fields(cls)
        )
    if attr.has(cls):
        return "attrs", tuple(
            (a.name, (getattr(a, "alias", None) or a.name.lstrip("_")) if a.init else None)
            for a in attr.fields(cls)
        )
    return None


class ItemClasses:
    """The item classes one worker stores and rebuilds (rules: module docstring).

    ``allowed`` are ``REDISSPINE_ALLOWED_ITEM_CLASSES``; ``packages`` are covered as
    well (by default the project's own: :meth:`for_spider`).
    """

    def __init__(self, allowed: Iterable[str] = (), packages: Iterable[str] = ()) -> None:
        allowed = tuple(allowed)
        self._named = frozenset(allowed)
        self._entries = tuple(dict.fromkeys((*allowed, *packages)))
        self._kinds: dict[type, tuple[str, tuple[_Field, ...]] | None] = {}
        self._paths: dict[type, str] = {}
        self._classes: dict[str, type] = {}

    @classmethod
    def for_spider(
        cls, spider: Spider | None, allowed: Iterable[str] | None = None
    ) -> ItemClasses:
        """``allowed`` (by default the spider's setting), plus the top-level packages
        of the project's ``SPIDER_MODULES`` and of the running spider's own module.
        The scheduler passes its loaded config's entries; tools read the setting."""
        modules: list[str] = []
        crawler = getattr(spider, "crawler", None)
        if crawler is not None:
            if allowed is None:
                from scrapy_redisspine.settings import load_config

                allowed = load_config(crawler.settings).allowed_item_classes
            modules += crawler.settings.getlist("SPIDER_MODULES")
        if spider is not None:
            modules.append(type(spider).__module__)
        return cls(allowed or (), (module.partition(".")[0] for module in modules if module))

    def covers(self, path: str) -> bool:
        return any(path == entry or path.startswith(f"{entry}.") for entry in self._entries)

    def fields_of(self, value: Any) -> dict[str, Any] | None:
        """An item's field values (set fields only), or None if the value is no item."""
        kind = self._kind(type(value))
        if kind is None:
            return None
        if isinstance(value, Item):
            return dict(value.items())
        return {
            name: field
            for name, _ in kind[1]
            if (field := getattr(value, name, _MISSING)) is not _MISSING
        }

    def object_parts(self, value: Any) -> list[Any] | None:
        """``[class path, fields]`` of an item; TypeError if its class may not travel."""
        fields = self.fields_of(value)
        return None if fields is None else [self._path(type(value)), fields]

    def rebuild(self, parts: Any) -> Any:
        if not (
            isinstance(parts, list) and len(parts) == 2
            and isinstance(parts[0], str) and isinstance(parts[1], dict)
        ):
            raise SerializationError(f"malformed item: {parts!r:.80}")
        path, fields = parts
        cls = self._class(path)
        return self._build(cls, path, fields)

    def _kind(self, cls: type) -> tuple[str, tuple[_Field, ...]] | None:
        try:
            return self._kinds[cls]
        except KeyError:
            kind = self._kinds[cls] = _declared(cls)
            return kind

    def _path(self, cls: type) -> str:
        path = self._paths.get(cls)
        if path is not None:
            return path
        module, name = cls.__module__, cls.__qualname__
        path = f"{module}.{name}"
        if "." in name or "<" in name:
            raise TypeError(f"item class {path} is not defined at the top level of its "
                            f"module, so no other worker can find it by name")
        if not self.covers(path):
            raise TypeError(f"item class {path} is not allowed: add it, or its module, "
                            f"to {SETTING}")
        found = sys.modules.get(module)
        if found is None or vars(found).get(name) is not cls:
            raise TypeError(f"item class {path} cannot be found by that name")
        self._check_constructor(cls, path)
        self._paths[cls] = path
        return path

    def _check_constructor(self, cls: type, path: str) -> None:
        """What :meth:`_build` will call must take the fields: checked once per class,
        so an item that no worker could rebuild is refused where it is stored."""
        kind = self._kind(cls)
        arguments = [arg for _, arg in kind[1] if arg] if kind else []
        try:
            inspect.signature(cls).bind_partial(**dict.fromkeys(arguments))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"item class {path} cannot be rebuilt from its fields: its "
                            f"constructor does not take {', '.join(arguments)} ({exc})") from exc

    def _class(self, path: str) -> type:
        """The class a payload names, if the rules allow it; nothing is imported before
        the path is found allowed."""
        cls = self._classes.get(path)
        if cls is not None:
            return cls
        if not self.covers(path):
            raise SerializationError(f"item class {path!r} is not allowed ({SETTING})")
        module_name, _, name = path.rpartition(".")
        module = sys.modules.get(module_name)
        if module is None and path in self._named and name.isidentifier():
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # whatever importing the named module raises
                raise SerializationError(f"item class {path}: cannot import "
                                         f"{module_name}: {exc}") from exc
        if module is None:
            raise SerializationError(
                f"item class {path} is refused: its module is not loaded in this worker "
                f"(only a class named in full in {SETTING} is imported for a payload)"
            )
        # vars(), not getattr(): a module's __getattr__ is code a payload must not run.
        cls = vars(module).get(name)
        if not (isinstance(cls, type) and cls.__module__ == module_name
                and cls.__qualname__ == name):
            raise SerializationError(f"{path} is not a class defined in {module_name}")
        if self._kind(cls) is None:
            raise SerializationError(f"{path} is not an item class (a scrapy.Item "
                                     f"subclass, a dataclass or an attrs class)")
        self._classes[path] = cls
        return cls

    def _build(self, cls: type, path: str, values: dict[Any, Any]) -> Any:
        kind = self._kind(cls)
        assert kind is not None  # _class checked it
        declared = dict(kind[1])
        unknown = [name for name in values if name not in declared]
        if unknown:
            raise SerializationError(f"item class {path} has no field {unknown[0]!r}")
        arguments = {arg: value for name, value in values.items() if (arg := declared[name])}
        try:
            item = cls(**arguments)
            for name, value in values.items():
                if declared[name] is None:  # init=False: set as the class would keep it
                    object.__setattr__(item, name, value)
        except Exception as exc:  # the item's own checks: __init__, __post_init__, validators
            raise SerializationError(f"cannot rebuild item {path}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return item
