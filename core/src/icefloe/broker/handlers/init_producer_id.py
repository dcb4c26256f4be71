"""InitProducerId: producer ids for idempotent producers, and for transactional ones through
the transaction coordinator (which fences the transactional id's previous instance).

Kafka's transaction coordinator answers a producer without a transactional id by handing out a
fresh producer id at epoch 0, whatever id and epoch the request carries: an idempotent
producer bumps its epoch itself, without asking the broker (KIP-360), and asks for a new id
only when its epoch is exhausted or its state is unknown. This does the same, with ids
allocated from the metadata store, so they are unique across brokers.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.transactions import may_write, outcome
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.security.acls import Operation, ResourceType

log = logging.getLogger(__name__)

_NO_THROTTLE = datetime.timedelta(0)
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1


async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()

    def answer(error: ErrorCode, producer_id: int = NO_PRODUCER_ID, epoch: int = -1) -> Any:
        return make(
            module.InitProducerIdResponse,
            throttle_time=_NO_THROTTLE,
            error_code=error,
            producer_id=producer_id,
            producer_epoch=epoch,
        )

    producer_id = getattr(request, "producer_id", NO_PRODUCER_ID)
    epoch = getattr(request, "producer_epoch", NO_PRODUCER_EPOCH)
    if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
        return answer(ErrorCode.invalid_request)  # Kafka: both or neither
    transactional_id = request.transactional_id
    if transactional_id is not None:
        if not may_write(ctx, transactional_id):
            return answer(ErrorCode.transactional_id_authorization_failed)
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
        code, granted = await outcome(
            ctx.broker.transactions.init_producer_id(
                transactional_id, timeout_ms, producer_id, epoch
            )
        )
        if granted is None:
            return answer(code)
        return answer(ErrorCode.none, *granted)
    # Kafka's rule: an idempotent producer needs IDEMPOTENT_WRITE on the cluster, or WRITE on
    # some topic.
    authorizer = ctx.broker.authorizer
    if not ctx.allows(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER) and not (
        authorizer.allows_some(
            ctx.principal, ctx.connection.host, Operation.WRITE, ResourceType.TOPIC
        )
    ):
        return answer(ErrorCode.cluster_authorization_failed)
    try:
        fresh = await ctx.broker.storage.allocate_producer_id()
    except IcefloeError as exc:
        if not exc.retriable:
            raise
        # Retriable for every client: they ask again after a back-off.
        log.warning("cannot allocate a producer id: %s", exc)
        return answer(ErrorCode.coordinator_not_available)
    return answer(ErrorCode.none, fresh, 0)
