"""Share sessions (Kafka's ShareSessionCache / ShareSession, KIP-932).

A share consumer keeps one session per (group, member) with each broker it fetches from: the
ShareFetch with epoch 0 opens it (replacing an older one) and names its partitions; each later
request carries the next epoch (1, 2, ... wrapping to 1) and only the partitions it adds or
forgets; epoch -1 closes it (the member's acquired records on its partitions are released).
A request whose session is unknown gets SHARE_SESSION_NOT_FOUND, one with the wrong epoch
INVALID_SHARE_SESSION_EPOCH; both make the client open a new session. The cache holds at most
``group.share.max.share.sessions`` sessions (SHARE_SESSION_LIMIT_REACHED beyond).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

TopicIdPartition = tuple[Any, int]  # (topic id, partition)


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


class ShareSessionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message


@dataclass(eq=False)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int  # the epoch the next request must carry
    partitions: dict[TopicIdPartition, None] = field(default_factory=dict)  # ordered
    last_used: float = field(default_factory=time.monotonic)
    connection: int = 0  # id of the connection that opened it

    @property
    def key(self) -> tuple[str, str]:
        return (self.group_id, self.member_id)


class ShareSessionCache:
    def __init__(self, max_entries: int = 2000) -> None:
        self.max_entries = max_entries
        self.sessions: dict[tuple[str, str], ShareSession] = {}

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self.sessions.get((group_id, member_id))

    def remove(self, group_id: str, member_id: str) -> ShareSession | None:
        return self.sessions.pop((group_id, member_id), None)

    def of_group(self, group_id: str) -> list[ShareSession]:
        return [s for s in self.sessions.values() if s.group_id == group_id]

    def fetch_context(self, group_id: str, member_id: str, epoch: int, added: list[TopicIdPartition],
                      forgotten: list[TopicIdPartition], has_acks: bool, connection: int = 0) -> tuple[ShareSession | None, bool]:
        """Kafka's SharePartitionManager.newContext: (the session, or None for a final request;
        whether the request is a full one). Raises ShareSessionError."""
        key = (group_id, member_id)
        if epoch == FINAL_EPOCH:
            if added:
                raise ShareSessionError(ErrorCode.invalid_request,
                                        "A final ShareFetch request must not name partitions to fetch "
                                        "(only partitions with acknowledgements).")
            if key not in self.sessions:
                raise ShareSessionError(ErrorCode.share_session_not_found,
                                        f"Share session for member {member_id} of group {group_id} not found.")
            return None, False
        if epoch == INITIAL_EPOCH:
            if has_acks:
                raise ShareSessionError(ErrorCode.invalid_request,
                                        "Acknowledge data present in the initial ShareFetch request.")
            self.sessions.pop(key, None)
            if len(self.sessions) >= self.max_entries:
                raise ShareSessionError(ErrorCode.share_session_limit_reached,
                                        "The broker has reached its limit of share sessions.")
            session = ShareSession(group_id, member_id, next_epoch(INITIAL_EPOCH), dict.fromkeys(added),
                                   connection=connection)
            self.sessions[key] = session
            return session, True
        session = self.sessions.get(key)
        if session is None:
            raise ShareSessionError(ErrorCode.share_session_not_found,
                                    f"Share session for member {member_id} of group {group_id} not found.")
        if session.epoch != epoch:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    f"Share session epoch {epoch} is not the expected {session.epoch}.")
        for tp in added:
            session.partitions.setdefault(tp, None)
        for tp in forgotten:
            session.partitions.pop(tp, None)
        session.epoch = next_epoch(session.epoch)
        session.last_used = time.monotonic()
        return session, False

    def acknowledge_context(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """Kafka's acknowledgeSessionUpdate: ShareAcknowledge never opens a session."""
        if epoch == INITIAL_EPOCH:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    "ShareAcknowledge cannot open a share session (epoch 0).")
        session = self.sessions.get((group_id, member_id))
        if session is None:
            raise ShareSessionError(ErrorCode.share_session_not_found,
                                    f"Share session for member {member_id} of group {group_id} not found.")
        if epoch == FINAL_EPOCH:
            return session
        if session.epoch != epoch:
            raise ShareSessionError(ErrorCode.invalid_share_session_epoch,
                                    f"Share session epoch {epoch} is not the expected {session.epoch}.")
        session.epoch = next_epoch(session.epoch)
        session.last_used = time.monotonic()
        return session

    def idle(self, older_than_s: float) -> list[ShareSession]:
        cutoff = time.monotonic() - older_than_s
        return [s for s in self.sessions.values() if s.last_used < cutoff]
