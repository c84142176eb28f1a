"""DescribeClientQuotas and AlterClientQuotas (KIP-546): quota values per user/client-id/ip.

As Kafka: Describe needs Cluster DescribeConfigs, Alter needs Cluster AlterConfigs
(CLUSTER_AUTHORIZATION_FAILED otherwise). A bad Describe filter fails the whole request
(INVALID_REQUEST, or UNSUPPORTED_VERSION for an unknown entity type, as Kafka 4's
ClientQuotasImage answers); a bad Alter entry fails alone with INVALID_REQUEST and the
others apply. Validation and storage: broker/quotas.py.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.quotas import QuotaError, check_entity, check_filter
from onceflow.security.acl import Operation


@handles(ApiKey.DESCRIBE_CLIENT_QUOTAS)
async def describe_client_quotas(ctx: RequestContext, body) -> dict:
    answer = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
              "entries": None}
    if not ctx.authorized_cluster(Operation.DESCRIBE_CONFIGS):
        answer["error_code"] = ErrorCode.cluster_authorization_failed
        answer["error_message"] = "Cluster authorization failed."
        return answer
    try:
        quota_filter = check_filter(((c.entity_type, c.match_type, c.match)
                                     for c in body.components), body.strict)
    except QuotaError as exc:
        answer["error_code"], answer["error_message"] = exc.code, exc.message
        return answer
    answer["entries"] = [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
        for entity, values in ctx.broker.quotas.describe(quota_filter)]
    return answer


@handles(ApiKey.ALTER_CLIENT_QUOTAS)
async def alter_client_quotas(ctx: RequestContext, body) -> dict:
    quotas = ctx.broker.quotas
    allowed = ctx.authorized_cluster(Operation.ALTER_CONFIGS)
    values = quotas.values()
    results = []
    for entry in body.entries:
        pairs = [(e.entity_type, e.entity_name) for e in entry.entity]
        code, message = ErrorCode.none, None
        if not allowed:
            code = ErrorCode.cluster_authorization_failed
            message = "Cluster authorization failed."
        else:
            try:
                entity = check_entity(pairs)
                ops = [(op.key, None if op.remove else op.value) for op in entry.ops]
                values = quotas.prepare(entity, ops, values)
            except QuotaError as exc:
                code, message = exc.code, exc.message
        results.append({"error_code": code, "error_message": message,
                        "entity": [{"entity_type": t, "entity_name": n} for t, n in pairs]})
    if allowed and not body.validate_only:
        quotas.commit(values, fsync=ctx.broker.config.fsync)
    return {"throttle_time": 0, "entries": results}
