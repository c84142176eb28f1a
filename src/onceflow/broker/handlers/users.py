"""DescribeUserScramCredentials and AlterUserScramCredentials: SCRAM users kept by the broker.

As Kafka's ScramControlManager: Describe needs Cluster Describe, Alter needs Cluster Alter;
a user named twice in one request is DUPLICATE_RESOURCE, an unknown mechanism
UNSUPPORTED_SASL_MECHANISM, iterations outside 4096..16384 UNACCEPTABLE_CREDENTIAL, the
deletion of a credential that does not exist RESOURCE_NOT_FOUND. The client sends the salt
and salted password, never the password; the broker keeps salt, stored key and server key
(security/store.py), written to disk before the answer.
"""

from __future__ import annotations

from collections import Counter

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation
from onceflow.security.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    MECHANISM_CODES,
    MECHANISM_NAMES,
    ScramCredential,
)

_TWICE = "A user credential cannot be altered twice in the same request"


@handles(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS)
async def describe_user_scram_credentials(ctx: RequestContext, body) -> dict:
    answer = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
              "results": []}
    if not ctx.authorized_cluster(Operation.DESCRIBE):
        answer["error_code"] = ErrorCode.cluster_authorization_failed
        return answer
    assert ctx.access is not None
    users = ctx.access.users()
    if body.users is None or not body.users:
        names = sorted(users)
    else:
        names = [u.name for u in body.users]
    counts = Counter(names)
    for name in dict.fromkeys(names):
        if counts[name] > 1:
            answer["results"].append(_described(name, ErrorCode.duplicate_resource,
                                                "Cannot describe SCRAM credentials for the "
                                                "same user twice in a single request"))
        elif name not in users:
            answer["results"].append(_described(
                name, ErrorCode.resource_not_found,
                f"Attempt to describe a user credential that does not exist: {name}"))
        else:
            infos = [{"mechanism": MECHANISM_CODES[m], "iterations": c.iterations}
                     for m, c in sorted(users[name].items())]
            answer["results"].append(_described(name, ErrorCode.none, None, infos))
    return answer


def _described(user: str, error: ErrorCode, message: str | None, infos=()) -> dict:
    return {"user": user, "error_code": error, "error_message": message,
            "credential_infos": list(infos)}


def _check(name: str, mechanism: int, iterations: int | None = None) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in MECHANISM_NAMES:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if iterations is not None and iterations < ITERATIONS_MIN:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if iterations is not None and iterations > ITERATIONS_MAX:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    return None


@handles(ApiKey.ALTER_USER_SCRAM_CREDENTIALS)
async def alter_user_scram_credentials(ctx: RequestContext, body) -> dict:
    names = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
    if not ctx.authorized_cluster(Operation.ALTER):
        return {"throttle_time": 0, "results": [
            {"user": name, "error_code": ErrorCode.cluster_authorization_failed,
             "error_message": None} for name in dict.fromkeys(names)]}
    assert ctx.access is not None
    counts = Counter(names)
    errors: dict[str, tuple[ErrorCode, str]] = {n: (ErrorCode.duplicate_resource, _TWICE)
                                                for n, c in counts.items() if c > 1}
    data = ctx.access.store.data
    for deletion in body.deletions:
        if deletion.name in errors:
            continue
        error = _check(deletion.name, deletion.mechanism)
        mechanism = MECHANISM_NAMES.get(deletion.mechanism, "")
        if error is None and data.users.get(deletion.name, {}).get(mechanism) is None:
            error = (ErrorCode.resource_not_found,
                     "Attempt to delete a user credential that does not exist")
        if error is not None:
            errors[deletion.name] = error
        else:
            data = data.without_credential(deletion.name, mechanism)
    for upsertion in body.upsertions:
        if upsertion.name in errors:
            continue
        error = _check(upsertion.name, upsertion.mechanism, upsertion.iterations)
        if error is not None:
            errors[upsertion.name] = error
            continue
        credential = ScramCredential.from_salted_password(
            MECHANISM_NAMES[upsertion.mechanism], bytes(upsertion.salt),
            bytes(upsertion.salted_password), upsertion.iterations)
        data = data.with_credential(upsertion.name, credential)
    ctx.access.alter_users(data)
    return {"throttle_time": 0, "results": [
        {"user": name, "error_code": errors.get(name, (ErrorCode.none, None))[0],
         "error_message": errors.get(name, (ErrorCode.none, None))[1]}
        for name in dict.fromkeys(names)]}
