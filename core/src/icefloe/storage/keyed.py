"""Compacted topics take keyed records only, as Kafka's ``LogValidator`` requires.

Kafka (since 2.4, KIP-467) refuses a produce batch holding a record without a key for a topic
whose ``cleanup.policy`` contains ``compact`` with ``INVALID_RECORD``, one record error per
keyless record (its index in the batch) and the error message
``One or more records have been rejected due to N record errors in total, and only showing the
first three errors at most: [RecordError(batchIndex=0, message='Compacted topic cannot accept
message without key in topic partition t-0'), ...]``. Brokers before 2.4 answered
``CORRUPT_MESSAGE``; Kafka 4, which Icefloe follows, answers ``INVALID_RECORD`` at every
produce version it serves (v3 and later), with the record errors from v8 on.

Checking keys means decoding the records (decompressing a compressed batch), which the produce
path does only for compacted topics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from kio.schema.errors import ErrorCode

from icefloe.storage.batch import BatchError
from icefloe.storage.records import decode_batch

SHOWN_ERRORS: Final = 3


class KeylessRecordsError(BatchError):
    """A batch for a compacted topic holds records without a key."""

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]]) -> None:
        super().__init__(ErrorCode.invalid_record, message)
        self.record_errors = tuple(record_errors)
        """``(batch index, message)`` of each keyless record, as ProduceResponse v8+ carries."""


def check_keys(batches: Sequence[bytes | bytearray | memoryview], partition: str) -> None:
    """Refuse ``batches`` (validated, each one whole batch) if a record has no key.

    Raises:
        KeylessRecordsError: Kafka's ``INVALID_RECORD`` with one record error per keyless
            record; ``partition`` (``topic-N``) is named as Kafka names it.
        BatchError: records that do not decode (``CORRUPT_MESSAGE``).
    """
    message = f"Compacted topic cannot accept message without key in topic partition {partition}"
    for batch in batches:
        _, records = decode_batch(batch, verify_crc=False)  # the CRC was checked already
        errors = [(i, message) for i, record in enumerate(records) if record.key is None]
        if errors:
            shown = ", ".join(
                f"RecordError(batchIndex={i}, message='{text}')"
                for i, text in errors[:SHOWN_ERRORS]
            )
            raise KeylessRecordsError(
                f"One or more records have been rejected due to {len(errors)} record errors in "
                f"total, and only showing the first three errors at most: [{shown}]",
                errors,
            )
