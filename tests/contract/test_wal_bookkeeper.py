"""The WAL contract on the BookKeeper WAL, against ZooKeeper and three real bookies."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from icefloe_wal_bookkeeper.options import BookKeeperWALOptions
from icefloe_wal_bookkeeper.refs import LedgerRef, parse
from pydantic import ValidationError

from icefloe.errors import ClosedError, NotFoundError, StorageError, UnavailableError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.testing.wal_contract import WALContract
from tests.support.bookkeeper import shared_bookkeeper
from tests.support.servers import free_port


class TestBookKeeperWAL(WALContract):
    backend_name = "bookkeeper"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return shared_bookkeeper().wal_options(unique, entry_size=4096)

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        return None  # ledgers, not objects in a store

    # --- BookKeeper-only behaviour ----------------------------------------------------------

    @pytest.mark.asyncio
    async def test_an_object_of_several_entries_reads_back_any_range(self, wal: WAL) -> None:
        data = bytes(range(256)) * 40  # 10,240 bytes: entries of 4,096, 4,096 and 2,048
        ref = await wal.append(data)
        assert ref.startswith("bk1:")
        assert ref.endswith(":10240:4096")
        assert await wal.read(ref) == data
        for start, end in [(0, 4096), (4095, 4097), (4096, 8192), (100, 9000), (8191, None)]:
            assert await wal.read(ref, start, end) == data[start:end], (start, end)

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        "ref",
        [
            "bk1",
            "bk1:1:10",
            "bk1:-1:10:4096",
            "bk1:01:10:4096",
            "bk1:1:0:4096",
            "bk1:1:10:1",  # entry size below the minimum
            "bk1:1:10:99999999",  # entry size above the maximum
            "bk1:99999999999999999999:10:4096",  # ledger id beyond 2^63 - 1
            "bk1:9223372036854775808:10:4096",
            "bk1:1:999999999999:4096",  # beyond the largest object
            "bk1:1:10:4096\n",
            "bk2:1:10:4096",
            "../etc/passwd",
            "bk1:1:10:4096:extra",
            "bk1:١:10:4096",  # a digit that is not ASCII
        ],
    )
    async def test_a_malformed_reference_is_not_found_and_deletes_nothing(
        self, wal: WAL, ref: str
    ) -> None:
        kept = await wal.append(b"kept")
        with pytest.raises(NotFoundError, match="not a BookKeeper WAL reference"):
            await wal.read(ref)
        await wal.delete(ref)
        assert await wal.read(kept) == b"kept"

    @pytest.mark.asyncio
    async def test_a_reference_that_lies_about_the_size_is_not_found(self, wal: WAL) -> None:
        ref = parse(await wal.append(b"0123456789"))
        for lie in (
            LedgerRef(ref.ledger_id, 11, ref.entry_size),
            LedgerRef(ref.ledger_id, 1 << 33, ref.entry_size),
            LedgerRef(ref.ledger_id, 10, ref.entry_size * 2),
        ):
            with pytest.raises(NotFoundError):
                await wal.read(str(lie))
            await wal.delete(str(lie))  # not the same object: left alone
        assert await wal.read(str(ref)) == b"0123456789"

    @pytest.mark.asyncio
    async def test_a_ledger_id_that_does_not_exist_is_not_found_quickly(self, wal: WAL) -> None:
        with pytest.raises(NotFoundError):
            await asyncio.wait_for(wal.read(f"bk1:{(1 << 63) - 1}:10:4096"), 10)

    @pytest.mark.asyncio
    async def test_another_namespace_neither_sees_nor_deletes_the_objects(
        self, wal: WAL, tmp_path: Path
    ) -> None:
        ref = await wal.append(b"mine")
        other = await self.open_wal(tmp_path, self.backend_options(tmp_path, "other-ns"), None)
        try:
            with pytest.raises(NotFoundError, match="namespace 'other-ns'"):
                await other.read(ref)
            await other.delete(ref)
            assert ref not in {info.ref async for info in other.list()}
        finally:
            await other.close()
        assert await wal.read(ref) == b"mine"

    @pytest.mark.asyncio
    async def test_a_reader_with_another_password_gets_a_clear_error(
        self, wal: WAL, tmp_path: Path, unique: str
    ) -> None:
        ref = await wal.append(b"secret")
        options = {**self.backend_options(tmp_path, unique), "password": "not-the-same"}
        other = await self.open_wal(tmp_path, options, None)
        try:
            with pytest.raises(StorageError, match=r"\[wal.bookkeeper\] password"):
                await other.read(ref)
        finally:
            await other.close()

    @pytest.mark.asyncio
    async def test_calls_after_close_raise_closed(self, tmp_path: Path, unique: str) -> None:
        wal = await self.open_wal(tmp_path, self.backend_options(tmp_path, unique), None)
        await wal.close()
        await wal.close()
        with pytest.raises(ClosedError):
            await wal.append(b"x")

    @pytest.mark.asyncio
    async def test_an_unreachable_metadata_service_is_a_retriable_error(
        self, tmp_path: Path
    ) -> None:
        options = {
            **self.backend_options(tmp_path, "x"),
            "metadata_service_uri": f"zk+hierarchical://127.0.0.1:{free_port()}/ledgers",
            "zk_session_timeout": 1,
        }
        with pytest.raises(UnavailableError, match="metadata_service_uri") as caught:
            await self.open_wal(tmp_path, options, None)
        assert caught.value.retriable


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ensemble": 2, "write_quorum": 3}, "ack_quorum <= write_quorum <= ensemble"),
        ({"ack_quorum": 3}, "ack_quorum <= write_quorum <= ensemble"),
        ({"ensemble": 0}, "ensemble"),
        ({"metadata_service_uri": "http://127.0.0.1:2181"}, "metadata_service_uri"),
        ({"digest_type": "md5"}, "digest_type"),
        ({"entry_size": 100}, "entry_size"),
        ({"namespace": "a b"}, "namespace"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"ensemle": 3}, "ensemle"),
    ],
)
def test_bad_options_are_refused_naming_the_setting(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BookKeeperWALOptions.model_validate(options)


def test_the_password_is_masked_in_config_show() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "icefloe", "config", "show"],
        env={
            **os.environ,
            "ICEFLOE_WAL__BACKEND": "bookkeeper",
            "ICEFLOE_WAL__BOOKKEEPER__PASSWORD": "hunter2",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "hunter2" not in shown
    assert "bookkeeper" in shown


def config_check(**env: str) -> subprocess.CompletedProcess[str]:
    """``icefloe config check`` in a fresh process (no JVM yet) with the BookKeeper WAL."""
    return subprocess.run(
        [sys.executable, "-m", "icefloe", "config", "check", "--timeout", "20"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")},
            "ICEFLOE_WAL__BACKEND": "bookkeeper",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_bad_option_in_the_environment_is_one_line_naming_the_variable() -> None:
    checked = config_check(ICEFLOE_WAL__BOOKKEEPER__ACK_QUORUM="3")
    assert checked.returncode == 2
    [line] = checked.stderr.strip().splitlines()
    assert "ICEFLOE_WAL__BOOKKEEPER__ACK_QUORUM" in line, line
    assert "need ack_quorum <= write_quorum <= ensemble" in line, line


def test_a_classpath_without_the_client_names_the_setting(tmp_path: Path) -> None:
    checked = config_check(ICEFLOE_WAL__BOOKKEEPER__CLASSPATH=str(tmp_path))
    assert checked.returncode == 2
    [line] = [line for line in checked.stdout.splitlines() if line.startswith("wal:")]
    assert f"[wal.bookkeeper] classpath = '{tmp_path}' holds no bookkeeper-server-*.jar" in line


def test_config_check_reaches_a_running_cluster() -> None:
    cluster = shared_bookkeeper()
    checked = config_check(
        ICEFLOE_WAL__BOOKKEEPER__METADATA_SERVICE_URI=cluster.metadata_service_uri,
        ICEFLOE_WAL__BOOKKEEPER__CLASSPATH=cluster.wal_options("x")["classpath"],
        ICEFLOE_TABLE__FORMATS="[]",
    )
    assert "wal: bookkeeper — reachable" in checked.stdout, checked.stdout + checked.stderr
