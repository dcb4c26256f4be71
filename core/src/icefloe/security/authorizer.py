"""Decides whether a principal may perform an operation on a resource (``[security.acls]``).

With ACLs off every request is allowed, as in Kafka without an authorizer. With them on:
super users may do everything; otherwise the cluster's ACLs decide (:func:`.acls.authorized`)
and a resource no ACL names is denied unless ``allow_everyone_if_no_acl_found``. Denials are
logged at most once a second per principal, so a client retrying cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from icefloe.config.security import AclOptions
from icefloe.security.acl_store import AclStore
from icefloe.security.acls import (
    CLUSTER_NAME,
    Operation,
    ResourceType,
    authorized,
    authorized_on_some,
)

log = logging.getLogger(__name__)

_LOG_EVERY_S: Final = 1.0
_LOGGED_PRINCIPALS: Final = 1024


class Authorizer:
    def __init__(self, options: AclOptions, acls: AclStore) -> None:
        self.options = options
        self.acls = acls
        self._super_users = frozenset(options.super_users)
        self._last_logged: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    def allows(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str = CLUSTER_NAME,
    ) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the resource."""
        if not self.options.enabled or principal in self._super_users:
            return True
        allowed = authorized(
            self.acls.covering(resource_type, name),
            principal,
            host,
            operation,
            allow_if_none=self.options.allow_everyone_if_no_acl_found,
        )
        if not allowed:
            self._log_denial(principal, host, operation, resource_type, name)
        return allowed

    def allows_some(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether ``principal`` may do ``operation`` on at least one resource of the type."""
        if not self.options.enabled or principal in self._super_users:
            return True
        acls = list(self.acls.of_type(resource_type))
        if not acls and self.options.allow_everyone_if_no_acl_found:
            return True
        return authorized_on_some(acls, principal, host, operation)

    def _log_denial(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> None:
        now = time.monotonic()
        if now - self._last_logged.get(principal, -_LOG_EVERY_S) < _LOG_EVERY_S:
            return
        if len(self._last_logged) >= _LOGGED_PRINCIPALS:
            self._last_logged.clear()
        self._last_logged[principal] = now
        log.info(
            "denied %s from %s: %s on %s %r",
            principal,
            host,
            operation.name,
            resource_type.name,
            name,
        )
