"""The one error type of the storage layer, carrying the Kafka error code the broker answers with.

The broker turns a :class:`LogError` into a per-partition error code without guessing; the CLI
prints it as one line (it is an :class:`~kcli.errors.OperationError`).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from kcli.errors import OperationError
from kcli.protocol.errors import error_name

# Kafka error codes the storage layer raises (names as in Kafka's Errors enum).


class LogError(OperationError):
    """A storage failure; ``code`` is the Kafka error code, ``name`` its upper-case name."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = code
        self.name = error_name(code)
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)


class RecordValidationError(LogError):
    """Records refused one by one (Kafka's RecordValidationException): INVALID_RECORD with
    ``record_errors`` as (index of the record in the request's batch, message), which Produce
    v8+ returns per partition."""

    def __init__(self, code: int, record_errors: list[tuple[int, str]]) -> None:
        self.record_errors = record_errors
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
        super().__init__(
            code,
            f"One or more records have been rejected due to {len(record_errors)} record errors in total, "
            f"and only showing the first three errors at most: [{shown}]",
        )


class OffsetOutOfRange(LogError):
    """A read or offset move outside ``[log_start_offset, log_end_offset]`` (OFFSET_OUT_OF_RANGE).

    ``local_log_start_offset`` lets a tiered-storage caller tell "gone" from "only in the
    remote tier": an offset in ``[log_start_offset, local_log_start_offset)`` is remote.
    """

    def __init__(
        self,
        offset: int,
        *,
        log_start_offset: int,
        local_log_start_offset: int,
        log_end_offset: int,
        message: str = "",
    ) -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.local_log_start_offset = local_log_start_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            ErrorCode.offset_out_of_range,
            message
            or (
                f"offset {offset} is outside the local log "
                f"[{local_log_start_offset}, {log_end_offset}] (log start {log_start_offset})"
            ),
        )

    @property
    def is_remote(self) -> bool:
        """True when the offset is still in the log but only in the remote tier."""
        return self.log_start_offset <= self.offset < self.local_log_start_offset
