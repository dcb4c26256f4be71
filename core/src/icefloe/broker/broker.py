"""One broker: the Kafka server over stream storage, registered in the cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Callable
from typing import Self

from icefloe import metrics
from icefloe.broker.compactor_process import CompactorProcess
from icefloe.broker.event_loop import running_loop_name
from icefloe.broker.memory import ByteBudget, client_data_bytes
from icefloe.broker.observability import OperatorEndpoints
from icefloe.broker.quotas import QuotaManager
from icefloe.broker.server import KafkaServer, Listener
from icefloe.broker.stalls import StallDetector
from icefloe.cluster import BrokerInfo, Cluster
from icefloe.compaction.service import Compactor, open_when_reachable
from icefloe.config import Config
from icefloe.config.broker import BrokerOptions
from icefloe.errors import ConfigError, IcefloeError
from icefloe.groups.coordinator import GroupCoordinator
from icefloe.schemas.http import RegistryServer
from icefloe.security import tls
from icefloe.security.acl_store import AclStore
from icefloe.security.authorizer import Authorizer
from icefloe.security.oauthbearer import TokenValidator
from icefloe.security.quotas import QuotaStore
from icefloe.security.users import UserStore
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from icefloe.transactions.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)


class Broker:
    """A stateless broker process: everything it knows is in the metadata store and the WAL."""

    def __init__(self, config: Config, storage: StreamStorage) -> None:
        self.config = config
        self.options: BrokerOptions = config.broker
        self.storage = storage
        self.topics = TopicRegistry(storage, config.table.identifier)
        self.cluster = Cluster(storage.metadata, self.options.session_ttl_s)
        self.groups = GroupCoordinator(
            storage.metadata, self.cluster, self.topics, config.groups, self.options.session_ttl_s
        )
        self.memory = ByteBudget(client_data_bytes(self.options, config.storage))
        """Memory for requests and responses in flight, over every connection."""
        self.server = KafkaServer(self, self.memory)
        self.transactions = TransactionCoordinator(
            storage.metadata, storage, self.topics, self.groups.store
        )
        self.users = UserStore(storage.metadata)
        self.acls = AclStore(storage.metadata)
        self.authorizer = Authorizer(config.security.acls, self.acls)
        self.quota_store = QuotaStore(storage.metadata)
        self.quotas = QuotaManager(self.quota_store, config.quotas)
        """Client quotas: measures clients against them and throttles those over."""
        security = config.security
        self.tokens = (
            TokenValidator(security.oauthbearer)
            if "OAUTHBEARER" in security.sasl_mechanisms
            else None
        )
        """Checks OAUTHBEARER tokens, where they are offered."""
        self.stalls = StallDetector()
        self.endpoints: OperatorEndpoints | None = None
        self.schema_registry: RegistryServer | None = None
        self.schema_registry_port: int | None = None
        """Where this broker serves the schema registry API, if it does."""
        self._stall_watch: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._compactor: Compactor | None = None
        """The compactor, when it runs in this process (``[compactor] own_process = false``)."""
        self._remove_compactor_source: Callable[[], None] | None = None
        self._compaction: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @classmethod
    async def open(cls, config: Config) -> Self:
        storage = await StreamStorage.open(config)
        return cls(config, storage)

    @property
    def compactor(self) -> Compactor | None:
        """This broker's compactor, if it runs in the broker's process (it compacts while it
        holds the compaction lease)."""
        return self._compactor

    @property
    def me(self) -> BrokerInfo:
        assert self.cluster.me is not None, "the broker has not started"
        return self.cluster.me

    async def start(
        self,
        port: int | None = None,
        metrics_port: int | None = None,
        index: int = 0,
        registry_port: int | None = None,
    ) -> BrokerInfo:
        """Listen for clients and register in the cluster; return this broker's record.

        Args:
            port: The main listener's port (default: ``[broker] port``; 0 picks a free one).
            metrics_port: Serve the operator endpoints (:mod:`.observability`) on this port
                (0 picks a free one); ``None`` serves none.
            index: This broker's index among those ``serve`` runs: added to the port of each
                further listener (``[security] listeners``).
            registry_port: Serve the schema registry API (:mod:`icefloe.schemas.http`) on this
                port (0 picks a free one); ``None`` serves none.
        """
        self._stall_watch = asyncio.create_task(self.stalls.run(), name="stall-detector")
        await self.topics.start()
        if self.authorizer.enabled:
            await self.acls.start()  # before the first client: no request goes unchecked
        await self.quota_store.start()  # before the first client: quotas hold from the start
        listeners = await self._listen(self.options.port if port is None else port, index)
        _, _, bound = listeners[0]
        bound_metrics = None
        if metrics_port is not None:
            self.endpoints = OperatorEndpoints(self)
            host = self.config.metrics.host or self.options.host
            bound_metrics = self.endpoints.start(host, metrics_port, self._metrics_tls())
        if registry_port is not None:
            sasl = any(
                a.protocol.sasl
                for a in self.config.security.listener_addresses(self.options.host, 0)
            )
            # With SASL logins on, the registry asks for the same users' passwords.
            self.schema_registry = RegistryServer(
                self.storage.metadata, self._check_password if sasl else None
            )
            host = self.config.schema_registry.host or self.options.host
            tls_context = self._https(self.config.schema_registry.tls, "[schema_registry]")
            try:
                self.schema_registry_port = await self.schema_registry.start(
                    host, registry_port, tls_context
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve the schema registry on {host}:{registry_port}: "
                    f"{exc.strerror or exc}; choose another with --schema-registry-port (or "
                    "[schema_registry] port), or set [schema_registry] enabled = false"
                ) from None
        advertised = self.options.advertised_host or self.options.host
        info = await self.cluster.join(
            advertised, bound, self.options.zone, self.options.node_id, bound_metrics, listeners
        )
        await self.groups.start()
        await self.transactions.start()
        # Only now do clients get in: a request answered before the broker knows the cluster
        # would name no broker as leader or coordinator.
        await self.server.accept()
        self._maintenance = asyncio.create_task(self._collect_orphans(), name="orphan-collector")
        if self.config.compactor.enabled and self.config.compaction.backend:
            Compactor.check(self.config)  # a wrong backend or option fails the start
            # Opening the table formats imports their SDKs, which takes seconds: clients are
            # served meanwhile (compaction only ever runs behind them).
            if self.config.compactor.own_process:
                process = CompactorProcess(self.config)
                self._remove_compactor_source = metrics.add_source(process.families)
                self._compaction = asyncio.create_task(
                    process.run(self._stopping), name="compactor-process"
                )
            else:
                self._compaction = asyncio.create_task(self._compact(), name="compactor")
        log.info(
            "broker %d listening on %s:%d (event loop: %s)",
            info.node_id,
            advertised,
            bound,
            running_loop_name(),
        )
        return info

    async def _compact(self) -> None:
        """Open the compactor, retrying while a backend cannot be reached, then let it compete
        for the compaction lease until the broker stops."""
        self._compactor = await open_when_reachable(
            self.config, self.storage, self.topics, self._stopping
        )
        if self._compactor is not None:
            metrics.COMPACTOR_OPEN.set(1)
            await self._compactor.run(self._stopping)

    async def _check_password(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s, against the stored SCRAM credentials."""
        for credential in await self.users.credentials(user):
            # PBKDF2 takes milliseconds: not on the event loop.
            if await asyncio.to_thread(credential.matches, password):
                return True
        return False

    def _metrics_tls(self) -> ssl.SSLContext | None:
        return self._https(self.config.metrics.tls, "[metrics]")

    def _https(self, wanted: bool, section: str) -> ssl.SSLContext | None:
        if not wanted:
            return None
        if self.config.security.tls.certfile is None:
            raise ConfigError(
                f"{section} tls = true needs a certificate: set [security.tls] certfile "
                "(and keyfile)"
            )
        return tls.server_context(self.config.security.tls)

    async def _listen(self, port: int, index: int) -> tuple[tuple[str, str, int], ...]:
        """Open every listener; return (name, advertised host, port) of each, main first."""
        security = self.config.security
        advertised_host = self.options.advertised_host or self.options.host
        context = None
        listening = []
        for number, address in enumerate(security.listener_addresses(self.options.host, port)):
            wanted = address.port if number == 0 or not address.port else address.port + index
            if address.protocol.tls and context is None:
                context = tls.server_context(security.tls)
            listener = Listener(address.protocol, context if address.protocol.tls else None)
            bound = await self.server.start(address.host, wanted, listener)
            shown = security.advertised(address.protocol)
            host = shown.host if shown else (advertised_host if number == 0 else address.host)
            listening.append((listener.name, host, shown.port + index if shown else bound))
        return tuple(listening)

    async def stop(self) -> None:
        """Stop accepting, commit what is buffered, deregister, release everything."""
        self._stopping.set()
        if self._compaction is not None:
            await self._compaction
        if self._remove_compactor_source is not None:
            self._remove_compactor_source()
        if self._compactor is not None:
            metrics.COMPACTOR_OPEN.set(0)
            await self._compactor.close()
        for task in (self._maintenance, self._stall_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.server.close()
        if self.endpoints is not None:
            await self.endpoints.close()
        if self.schema_registry is not None:
            await self.schema_registry.close()
        await self.transactions.stop()
        await self.groups.stop()  # hands this broker's group leases over at once
        await self.storage.flush()
        await self.cluster.leave()
        await self.topics.close()
        await self.acls.close()
        await self.quota_store.close()
        await self.storage.close()

    async def _collect_orphans(self) -> None:
        # Every broker may collect: deletion is idempotent. Jitter spreads the listing load.
        period = self.config.storage.orphan_grace_s / 4
        while True:
            await asyncio.sleep(period * random.uniform(0.5, 1.5))
            try:
                await self.storage.collect_orphans()
            except IcefloeError:
                log.warning("orphan collection failed; will retry", exc_info=True)
