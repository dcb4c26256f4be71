"""DescribeCluster: the live brokers of the client's zone, the cluster id and a controller id.

Icefloe has no controller: every broker can do everything. The lowest live broker id is
reported as the controller, as Metadata does, so both APIs agree. Describing the cluster
takes DESCRIBE on it when ACLs are on.
"""

from __future__ import annotations

import datetime
import enum
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.authorized import NOT_PROVIDED, authorized_operations
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.cluster import client_zone
from icefloe.security.acls import Operation, ResourceType

_NO_THROTTLE = datetime.timedelta(0)


class EndpointType(enum.IntEnum):
    """What DescribeCluster v1+ asks for (KIP-919)."""

    BROKER = 1
    CONTROLLER = 2


async def handle_describe_cluster(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    # v0 has no endpoint_type: it always asks for brokers.
    wanted = getattr(request, "endpoint_type", EndpointType.BROKER)
    if wanted != EndpointType.BROKER:
        return _refused(ctx, module, wanted)
    if not ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER):
        return _refused(ctx, module, wanted, ErrorCode.cluster_authorization_failed)
    cluster = ctx.broker.cluster
    brokers = cluster.brokers_for(client_zone(ctx.client_id))
    return make(
        module.DescribeClusterResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=EndpointType.BROKER,
        cluster_id=cluster.cluster_id,
        controller_id=min(b.node_id for b in brokers),
        brokers=tuple(
            make(
                module.DescribeClusterBroker,
                broker_id=b.node_id,
                host=b.endpoint(ctx.connection.listener)[0],
                port=b.endpoint(ctx.connection.listener)[1],
                rack=b.zone,
            )
            for b in brokers
        ),
        cluster_authorized_operations=authorized_operations(
            ctx, request.include_cluster_authorized_operations, ResourceType.CLUSTER
        ),
    )


def _refused(ctx: RequestContext, module: Any, wanted: int, error: ErrorCode | None = None) -> Any:
    """Kafka's answers when a broker is asked for controllers, or for an unknown type, or
    the client may not describe the cluster."""
    if error is not None:
        code, message = error, "describing the cluster takes DESCRIBE on it"
    elif wanted == EndpointType.CONTROLLER:
        code = ErrorCode.mismatched_endpoint_type
        message = (
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
            "of type CONTROLLER"
        )
    else:
        code, message = ErrorCode.unsupported_endpoint_type, f"unknown endpoint type {wanted}"
    return make(
        module.DescribeClusterResponse,
        throttle_time=_NO_THROTTLE,
        error_code=code,
        error_message=message,
        cluster_id=ctx.broker.cluster.cluster_id,
        controller_id=-1,
        brokers=(),
        cluster_authorized_operations=NOT_PROVIDED,
    )
