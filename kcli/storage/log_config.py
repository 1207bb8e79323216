"""Topic-level configs that shape one partition log, parsed from Kafka's string configs.

Names and defaults mirror Kafka's topic configs so ``kafka-configs``-style dicts pass straight
through. Keys the log does not use (remote.storage.enable, ...) are ignored here: other layers own
them.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from dataclasses import dataclass, fields
from typing import Any, Mapping

from kcli.storage.errors import LogError

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"

# Kafka config name -> (dataclass field, minimum accepted value)
_INT_CONFIGS: dict[str, tuple[str, int]] = {
    "segment.bytes": ("segment_bytes", 14),  # Kafka 3.x minimum (record overhead v0)
    "segment.ms": ("segment_ms", 1),
    "segment.index.bytes": ("segment_index_bytes", 4),
    "retention.ms": ("retention_ms", -1),
    "retention.bytes": ("retention_bytes", -(2**63)),
    "max.message.bytes": ("max_message_bytes", 0),
    "index.interval.bytes": ("index_interval_bytes", 0),
    "delete.retention.ms": ("delete_retention_ms", 0),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", 0),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", 1),
}
_INT32_FIELDS = {"segment_bytes", "segment_index_bytes", "max_message_bytes", "index_interval_bytes"}
_IGNORED = {"flush.messages", "flush.ms"}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The configs PartitionLog obeys. ``-1`` for retention means unlimited, as in Kafka."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_index_bytes: int = 10485760
    retention_ms: int = 604800000
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    index_interval_bytes: int = 4096
    message_timestamp_type: str = CREATE_TIME
    cleanup_policy: str = "delete"
    # Log cleaner (kcli.storage.cleaner), used only when cleanup.policy includes ``compact``.
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    min_cleanable_dirty_ratio: float = 0.5

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @property
    def delete_enabled(self) -> bool:
        """Time/size retention applies only when cleanup.policy includes ``delete``."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compact(self) -> bool:
        """The log cleaner keeps the latest record per key (cleanup.policy includes ``compact``)."""
        return "compact" in self.cleanup_policy.split(",")

    @classmethod
    def from_dict(cls, configs: Mapping[str, Any] | None = None) -> "LogConfig":
        """Build from Kafka topic configs (values as strings or ints; ``None`` = default).

        Raises LogError(INVALID_CONFIG) naming the key for a value Kafka would reject.
        """
        values: dict[str, Any] = {}
        for key, raw in (configs or {}).items():
            if raw is None or key in _IGNORED:
                continue
            if key in _INT_CONFIGS:
                name, minimum = _INT_CONFIGS[key]
                values[name] = _parse_int(key, raw, minimum, int32=name in _INT32_FIELDS)
            elif key == "message.timestamp.type":
                text = str(raw).strip()
                if text not in (CREATE_TIME, LOG_APPEND_TIME):
                    raise LogError(
                        ErrorCode.invalid_config,
                        f"message.timestamp.type must be {CREATE_TIME} or {LOG_APPEND_TIME}, got {text!r}",
                    )
                values["message_timestamp_type"] = text
            elif key == "min.cleanable.dirty.ratio":
                try:
                    ratio = float(str(raw).strip())
                except ValueError:
                    raise LogError(ErrorCode.invalid_config, f"min.cleanable.dirty.ratio must be a number, got {raw!r}") from None
                if not 0.0 <= ratio <= 1.0:
                    raise LogError(ErrorCode.invalid_config, f"min.cleanable.dirty.ratio must be in [0, 1], got {ratio}")
                values["min_cleanable_dirty_ratio"] = ratio
            elif key == "cleanup.policy":
                parts = [p.strip() for p in str(raw).split(",") if p.strip()]
                if not parts or any(p not in ("delete", "compact") for p in parts):
                    raise LogError(ErrorCode.invalid_config, f"cleanup.policy must be delete and/or compact, got {raw!r}")
                values["cleanup_policy"] = ",".join(parts)
        return cls(**values)

    def to_dict(self) -> dict[str, str]:
        """The Kafka-named string form (for describe-configs style output)."""
        by_field = {f: k for k, (f, _) in _INT_CONFIGS.items()}
        out = {by_field[f.name]: str(getattr(self, f.name)) for f in fields(self) if f.name in by_field}
        out["message.timestamp.type"] = self.message_timestamp_type
        out["cleanup.policy"] = self.cleanup_policy
        out["min.cleanable.dirty.ratio"] = str(self.min_cleanable_dirty_ratio)
        return out


def _parse_int(key: str, raw: Any, minimum: int, *, int32: bool) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise LogError(ErrorCode.invalid_config, f"{key} must be an integer, got {raw!r}") from None
    upper = 2**31 - 1 if int32 else 2**63 - 1
    if value < minimum or value > upper:
        raise LogError(ErrorCode.invalid_config, f"{key} must be in [{minimum}, {upper}], got {value}")
    return value
