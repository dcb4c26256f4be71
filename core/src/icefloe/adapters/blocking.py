"""Blocking SDK calls off the event loop: a bounded thread pool, closed once, errors translated.

Several adapters wrap a synchronous SDK (boto3, google-cloud-storage, azure-storage-blob,
pyiceberg, delta-rs). Each needs the same few things: a pool of a fixed number of threads
(so that the number of connections, and the memory of the requests in flight, stay bounded),
calls that never run on the event loop, a refusal of calls after ``close()``, and the SDK's
exceptions turned into :mod:`icefloe.errors` types raised ``from`` the original.
:class:`BlockingSdk` is that, once.

It is an object the adapter holds (``self._sdk``), not a base class or a mixin: the adapters
already subclass their port (``ObjectStore``, ``TableFormat``), whose constructors and ``close()``
differ, and a mixin would have to thread its settings through that hierarchy and share the
adapter's attribute names. Held as an attribute, its settings are plain constructor arguments,
each adapter's ``close()`` stays its own (it releases its client after the pool), and a call
site reads as what it does: ``await self._sdk.call("get 'k'", self._read, name)``.

What stays in the adapter: the translation function itself (it knows the SDK's exception
types and status codes), which module names mark an exception as the SDK's, and the message
naming the adapter in :class:`~icefloe.errors.ClosedError`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from icefloe.errors import ClosedError, IcefloeError

P = ParamSpec("P")
T = TypeVar("T")

Translate = Callable[[Exception, str], Exception]
"""``translate(exc, what)``: the :mod:`icefloe.errors` exception for ``exc``, raised by the
SDK call described by ``what`` (``"get 'wal/x'"``); :class:`BlockingSdk` raises it ``from``
``exc``."""


class BlockingSdk:
    """A bounded thread pool for one adapter's blocking SDK calls.

    :meth:`run` runs a function on the pool and lets its exceptions out unchanged;
    :meth:`call` does the same but translates the SDK's exceptions. Both refuse to start
    after :meth:`close`.
    """

    def __init__(
        self,
        name: str,
        *,
        threads: int,
        thread_name_prefix: str,
        translate: Translate | None = None,
        sdk_modules: tuple[str, ...] = (),
        sdk_types: tuple[type[Exception], ...] = (),
    ) -> None:
        """Start the pool (its threads start on demand).

        Args:
            name: The adapter as error messages name it (``"the S3 object store on bucket
                'b'"``); a call after :meth:`close` raises ``ClosedError(f"{name} is closed")``.
            threads: The most threads, hence the most SDK calls running at once.
            thread_name_prefix: Names the threads, for thread dumps and profiles.
            translate: Used by :meth:`call`; ``None`` lets every exception out unchanged.
            sdk_modules: An exception whose class's module starts with one of these (``"boto3"``,
                ``"google."``) is the SDK's, and is translated.
            sdk_types: Exceptions of these types are the SDK's too, wherever their class is
                defined (``OSError``, for an SDK that lets the socket's errors out).
        """
        self.name = name
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=thread_name_prefix)
        self._translate = translate
        self._sdk_modules = sdk_modules
        self._sdk_types = sdk_types
        self._closed = False

    @property
    def closed(self) -> bool:
        """``True`` from the start of :meth:`close` on: no call starts any more."""
        return self._closed

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the pool; whatever it raises is raised unchanged.

        For functions that translate their own errors (on the worker thread, where they know
        more than ``what``), and for work that is not an SDK call at all.

        Raises:
            ClosedError: :meth:`close` has begun.
        """
        if self._closed:
            raise ClosedError(f"{self.name} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def call(self, what: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """:meth:`run`, with the SDK's exceptions raised as :mod:`icefloe.errors` types.

        Icefloe's own errors, and exceptions that are not the SDK's (a ``ValueError`` of the
        adapter, an adapter's private signal such as "condition not met"), pass unchanged.

        Args:
            what: The operation and key, for messages (``"put 'wal/x'"``).
            fn: The blocking function.
            *args: Its positional arguments.
            **kwargs: Its keyword arguments.

        Raises:
            ClosedError: :meth:`close` has begun.
        """
        try:
            return await self.run(fn, *args, **kwargs)
        except IcefloeError:
            raise
        except Exception as exc:
            if self._translate is not None and self._is_sdk_error(exc):
                raise self._translate(exc, what) from exc
            raise

    async def close(self) -> None:
        """Refuse new calls, then wait for the running ones to end; idempotent.

        The wait runs on another thread so that the event loop goes on meanwhile (the running
        calls may take as long as the SDK's timeouts). The adapter releases its client after
        this returns, when nothing uses it any more.
        """
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    def _is_sdk_error(self, exc: Exception) -> bool:
        module = type(exc).__module__
        return module.startswith(self._sdk_modules) or isinstance(exc, self._sdk_types)
