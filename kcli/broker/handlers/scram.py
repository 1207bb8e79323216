"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), as KRaft Kafka answers them.

Describe reads the credentials from the cluster metadata; Alter turns valid deletions and
upsertions into RemoveUserScramCredentialRecord / UserScramCredentialRecord and appends them as
one unit, so in a cluster every broker learns them from the shared store. Per-user errors and
their messages are Kafka's (ScramImage.describe, ScramControlManager.alterCredentials): a user may
be named only once per request, whatever the mechanism.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import RequestContext, handler
from kcli.metadata.metadata_log import record
from kcli.security.scram import BY_TYPE, ScramCredential, iterations_error
from kcli.protocol.errors import BrokerError

DESCRIBE_DUPLICATE_USER = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_USER_THAT_DOES_NOT_EXIST = "Attempt to describe a user credential that does not exist: "
ALTER_TWICE = "A user credential cannot be altered twice in the same request"

log = logging.getLogger("kcli.security.scram")


@handler(50, "DescribeUserScramCredentials", 0, 0)
async def describe_user_scram_credentials(ctx: RequestContext, req: Any) -> dict[str, Any]:
    creds = ctx.broker.state.scram_credentials
    if not req.users:  # null or empty: every user with a credential
        users: dict[str, bool] = {name: False for name in sorted(creds)}
    else:
        users = {}
        for u in req.users:
            users[u.name] = u.name in users  # True: named twice
    results = []
    for name, duplicate in users.items():
        if duplicate:
            results.append({"user": name, "error_code": ErrorCode.duplicate_resource,
                             "error_message": DESCRIBE_DUPLICATE_USER + name})
        elif name not in creds:
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": DESCRIBE_USER_THAT_DOES_NOT_EXIST + name})
        else:
            infos = [{"mechanism": t, "iterations": c.iterations} for t, c in sorted(creds[name].items())]
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None,
                            "credential_infos": infos})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}


def _name_and_mechanism_error(name: str, mechanism_type: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism_type not in BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def _upsertion_error(u: Any) -> tuple[ErrorCode, str] | None:
    error = _name_and_mechanism_error(u.name, int(u.mechanism))
    if error is not None:
        return error
    reason = iterations_error(BY_TYPE[int(u.mechanism)], int(u.iterations))
    if reason is not None:
        return ErrorCode.unacceptable_credential, reason
    # Kafka would fail later on these (an empty HMAC key); say what is wrong instead.
    if not u.salt:
        return ErrorCode.unacceptable_credential, "Salt must not be empty"
    if not u.salted_password:
        return ErrorCode.unacceptable_credential, "Salted password must not be empty"
    return None


@handler(51, "AlterUserScramCredentials", 0, 0)
async def alter_user_scram_credentials(ctx: RequestContext, req: Any) -> dict[str, Any]:
    state = ctx.broker.state
    errors: dict[str, tuple[int, str]] = {}
    deletions: dict[str, Any] = {}
    upserts: dict[str, Any] = {}
    for d in req.deletions:
        if d.name in errors:
            continue
        if deletions.pop(d.name, None) is not None:
            errors[d.name] = (ErrorCode.duplicate_resource, ALTER_TWICE)
            continue
        error = _name_and_mechanism_error(d.name, int(d.mechanism))
        if error is None and state.scram_credential(d.name, int(d.mechanism)) is None:
            error = (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
        if error is not None:
            errors[d.name] = error
        else:
            deletions[d.name] = d
    for u in req.upsertions:
        if u.name in errors:
            continue
        if deletions.pop(u.name, None) is not None or upserts.pop(u.name, None) is not None:
            errors[u.name] = (ErrorCode.duplicate_resource, ALTER_TWICE)
            continue
        error = _upsertion_error(u)
        if error is not None:
            errors[u.name] = error
        else:
            upserts[u.name] = u
    records = [record("RemoveUserScramCredentialRecord", name=d.name, mechanism=int(d.mechanism))
               for d in deletions.values()]
    for u in upserts.values():
        mechanism = BY_TYPE[int(u.mechanism)]
        cred = ScramCredential.from_salted_password(mechanism, bytes(u.salt), bytes(u.salted_password), int(u.iterations))
        records.append(record("UserScramCredentialRecord", **cred.record_data(u.name, mechanism)))
    done = list(deletions) + list(upserts)
    if records:
        try:
            ctx.broker.metadata.append(records)  # checked (check_record) before anything is written
        except Exception as err:  # every user asked about gets the error, as Kafka's getErrorResponse
            if isinstance(err, BrokerError):  # e.g. the cluster database is unreachable: nothing was written
                failure = (err.code, err.message or str(err))
            elif isinstance(err, OSError):
                failure = (int(ErrorCode.kafka_storage_error), f"cannot write the metadata log: {err.strerror or err}")
            else:
                log.exception("appending %d SCRAM credential record(s) failed", len(records))
                failure = (int(ErrorCode.unknown_server_error), f"Unexpected server error: {type(err).__name__}")
            for name in done:
                errors[name] = failure
            done = []
    results = [{"user": name, "error_code": ErrorCode.none, "error_message": None} for name in done]
    results += [{"user": name, "error_code": code, "error_message": message} for name, (code, message) in errors.items()]
    return {"throttle_time": 0, "results": results}
