"""The WAL contract on the object-store WAL (over the local object store), plus its layout."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from icefloe.embedded.object_wal import ObjectWAL, ObjectWALOptions
from icefloe.errors import ClosedError, ConfigError, NotFoundError
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.testing.contract import open_backend
from icefloe.testing.wal_contract import WALContract

KEY = re.compile(r"(?P<prefix>.+)/(?P<ms>\d{13})-[0-9a-f]{32}")


class TestObjectWAL(WALContract):
    backend_name = "object"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"prefix": f"wal/{unique}"}

    # --- object-WAL-only behaviour --------------------------------------------------------

    @pytest.mark.asyncio
    async def test_open_without_an_object_store_is_a_config_error(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"\[object_store\]"):
            await open_backend(PortKind.WAL, "object", tmp_path, {})

    @pytest.mark.parametrize("prefix", ["", "/wal", "wal/", "a//b", "..", "w\nal"])
    def test_a_prefix_that_cannot_form_keys_is_rejected(self, prefix: str) -> None:
        with pytest.raises(ValidationError, match="prefix"):
            ObjectWALOptions.model_validate({"prefix": prefix})

    @pytest.mark.asyncio
    async def test_each_append_is_one_object_under_the_prefix_named_by_time(
        self, wal: WAL, object_store: ObjectStore, options: dict[str, Any]
    ) -> None:
        before_ms = int(time.time() * 1000)
        ref = await wal.append(b"payload")
        keys = [info.key async for info in object_store.list()]
        assert len(keys) == 1
        named = KEY.fullmatch(keys[0])
        assert named is not None, keys[0]
        assert named["prefix"] == options["prefix"]
        assert keys[0].endswith("/" + ref)
        assert before_ms <= int(named["ms"]) <= int(time.time() * 1000)
        assert await object_store.get(keys[0]) == b"payload"

    @pytest.mark.asyncio
    async def test_list_is_oldest_first(self, wal: WAL) -> None:
        refs = []
        for _ in range(4):
            refs.append(await wal.append(b"x"))
            await asyncio.sleep(0.003)  # distinct milliseconds: the time in the ref orders them
        infos = [info async for info in wal.list()]
        assert [info.ref for info in infos] == refs
        assert [info.created for info in infos] == sorted(info.created for info in infos)

    @pytest.mark.asyncio
    async def test_created_time_is_never_after_the_object_was_stored(
        self, wal: WAL, object_store: ObjectStore, options: dict[str, Any]
    ) -> None:
        ref = await wal.append(b"x")
        stored = await object_store.head(f"{options['prefix']}/{ref}")
        assert stored is not None
        [info] = [info async for info in wal.list()]
        assert info.created <= stored.modified

    @pytest.mark.asyncio
    async def test_a_future_time_in_a_ref_is_bounded_by_the_stored_time(
        self, wal: WAL, object_store: ObjectStore, options: dict[str, Any]
    ) -> None:
        # A writer whose clock ran an hour ahead.
        future_ms = int((time.time() + 3600) * 1000)
        ref = f"{future_ms:013d}-{'0' * 32}"
        await object_store.put(f"{options['prefix']}/{ref}", b"x")
        [info] = [info async for info in wal.list()]
        assert info.ref == ref
        assert info.created <= time.time()

    @pytest.mark.asyncio
    async def test_a_foreign_object_under_the_prefix_is_listed_by_its_stored_time(
        self, wal: WAL, object_store: ObjectStore, options: dict[str, Any]
    ) -> None:
        stored = await object_store.put(f"{options['prefix']}/left-over", b"orphan")
        [info] = [info async for info in wal.list()]
        assert (info.ref, info.size, info.created) == ("left-over", 6, stored.modified)
        assert await wal.read("left-over") == b"orphan"

    @pytest.mark.asyncio
    async def test_objects_outside_the_prefix_are_not_listed(
        self, wal: WAL, object_store: ObjectStore, options: dict[str, Any]
    ) -> None:
        await object_store.put(f"{options['prefix']}-other/x", b"x")
        await object_store.put("elsewhere/y", b"y")
        assert [info async for info in wal.list()] == []

    @pytest.mark.asyncio
    @pytest.mark.parametrize("ref", ["../escape", "/abs", "a//b", "bad\x00ref"])
    async def test_a_malformed_reference_is_not_found(self, wal: WAL, ref: str) -> None:
        with pytest.raises(NotFoundError):
            await wal.read(ref)
        await wal.delete(ref)

    @pytest.mark.asyncio
    async def test_calls_after_close_raise_closed_and_leave_the_store_open(
        self, object_store: ObjectStore
    ) -> None:
        wal = ObjectWAL(object_store, "closing")
        await wal.close()
        with pytest.raises(ClosedError):
            await wal.append(b"x")
        await object_store.put("still/open", b"y")
