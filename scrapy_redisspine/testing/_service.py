"""What the test site and the throwaway redis-server share: ``with`` starts and stops."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

_S = TypeVar("_S", bound="Service")


class Service:
    """Something that runs between ``start()`` and ``stop()``; ``with service:`` runs it
    for the block and stops it however the block ends."""

    def start(self: _S) -> _S:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
