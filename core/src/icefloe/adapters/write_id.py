"""Write ids: telling a conditional write that lost from one that won but lost its answer.

An object store's SDK retries a request whose answer did not arrive (a timeout, a dropped
connection, a 5xx). If the first attempt of a create-if-absent write did land, the retry meets
the object that very write created and is refused, exactly as if another writer had been
first. So every write carries a random write id (:func:`new_write_id`) in the object's user
metadata, and :meth:`WriteIds.send` believes a refusal only after a ``HEAD`` shows that the
object there carries another id — or that there is none.

The stores differ in what a refusal looks like (S3 answers 412, or 409 to a concurrent
conditional write; GCS 412, or 404 when a finalised upload session is sent again; Azure 409
or 412) and in what a refusal with nothing at the key means (S3: try again; GCS and Azure:
the key is taken). So :meth:`WriteIds.send` sends, looks and reports a :class:`Refusal`; the
adapter decides what to raise, ``from`` :attr:`Refusal.cause`.

:class:`WriteIds` is an object the store builds once, binding what is the same for all its
writes (the metadata name, its ``HEAD``, what a refusal raises), so that each write site
names only the key, the id and the request.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass


def new_write_id() -> str:
    """A new random write id, for the metadata of every object one write creates."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Refusal:
    """A write that was refused, and not because an earlier attempt of it had won."""

    error: Exception
    """What sending the write raised (one of the ``refused`` types)."""
    taken: bool
    """Whether an object (someone else's) was at the key when it was looked at."""

    @property
    def cause(self) -> BaseException | None:
        """What :attr:`error` was raised from: the SDK's exception, which the adapter's own
        error is raised from in turn (the refusal itself was only a step on the way)."""
        return self.error.__cause__


class WriteIds:
    """Sends a store's writes tagged with write ids, and settles the refused ones."""

    def __init__(
        self,
        field: str,
        metadata_at: Callable[[str], Awaitable[Mapping[str, str] | None]],
        refused: type[Exception] | tuple[type[Exception], ...],
    ) -> None:
        """
        Args:
            field: The metadata name of the write id.
            metadata_at: ``HEAD``: the user metadata of the object at a key, or ``None`` if
                there is none.
            refused: What a write raises when the store refuses its condition; anything else
                it raises propagates.
        """
        self._field = field
        self._metadata_at = metadata_at
        self._refused = refused

    async def send(self, key: str, write_id: str, write: Awaitable[object]) -> Refusal | None:
        """Await ``write``; if it is refused, find out whether it won anyway.

        Args:
            key: The object's key, as ``metadata_at`` takes it.
            write_id: This write's id, from :func:`new_write_id`.
            write: The write, whose object's metadata names ``write_id`` (a coroutine not
                awaited yet).

        Returns:
            ``None`` when the object is written: now, or by an earlier attempt of this very
            write whose answer was lost. Otherwise the :class:`Refusal`.
        """
        try:
            await write
        except self._refused as exc:
            metadata = await self._metadata_at(key)
            if metadata is not None and metadata.get(self._field) == write_id:
                return None  # an earlier attempt of this very write won; its answer was lost
            return Refusal(exc, taken=metadata is not None)
        return None
