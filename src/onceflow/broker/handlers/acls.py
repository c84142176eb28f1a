"""CreateAcls, DescribeAcls and DeleteAcls (Kafka's AclApis, facts only).

Without `--authorizer` each answers SECURITY_DISABLED ("No Authorizer is configured."),
as Kafka does. DescribeAcls needs Cluster Describe, the other two Cluster Alter. A
binding Kafka would refuse (an unknown type, a cluster not named kafka-cluster, a
principal without a type) is answered INVALID_REQUEST in its own result; the valid ones
are created. Changes are on disk before the answer (broker/access.py).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

_DISABLED = "No Authorizer is configured."


def _enum(enum_type, value: int):
    try:
        return enum_type(value)
    except ValueError:
        return enum_type.UNKNOWN


def _binding(creation) -> AclBinding:
    return AclBinding(_enum(ResourceType, creation.resource_type), creation.resource_name,
                      _enum(PatternType, creation.resource_pattern_type), creation.principal,
                      creation.host, _enum(Operation, creation.operation),
                      _enum(Permission, creation.permission_type))


def _filter(f) -> AclFilter:
    """A filter of DescribeAcls (fields `resource_type_filter` ..) or DeleteAcls."""
    return AclFilter(_enum(ResourceType, getattr(f, "resource_type_filter")),
                     getattr(f, "resource_name_filter"),
                     _enum(PatternType, getattr(f, "pattern_type_filter", PatternType.LITERAL)),
                     getattr(f, "principal_filter"), getattr(f, "host_filter"),
                     _enum(Operation, f.operation), _enum(Permission, f.permission_type))


@handles(ApiKey.CREATE_ACLS)
async def create_acls(ctx: RequestContext, body) -> dict:
    def results(error: ErrorCode, message: str | None) -> dict:
        return {"throttle_time": 0, "results": [
            {"error_code": error, "error_message": message} for _ in body.creations]}

    if ctx.access is None or ctx.access.authorizer is None:
        return results(ErrorCode.security_disabled, _DISABLED)
    if not ctx.authorized_cluster(Operation.ALTER):
        return results(ErrorCode.cluster_authorization_failed, None)
    answers, valid = [], []
    for creation in body.creations:
        binding = _binding(creation)
        reason = binding.invalid_reason()
        if reason is None:
            valid.append(binding)
            answers.append({"error_code": ErrorCode.none, "error_message": None})
        else:
            answers.append({"error_code": ErrorCode.invalid_request, "error_message": reason})
    if valid:
        ctx.access.create_acls(valid)
    return {"throttle_time": 0, "results": answers}


def _resources(bindings: list[AclBinding]) -> list[dict]:
    by_resource: dict[tuple, list[dict]] = {}
    for acl in bindings:
        key = (acl.resource_type, acl.resource_name, acl.pattern_type)
        by_resource.setdefault(key, []).append({
            "principal": acl.principal, "host": acl.host, "operation": int(acl.operation),
            "permission_type": int(acl.permission)})
    return [{"resource_type": int(t), "resource_name": n, "pattern_type": int(p), "acls": acls}
            for (t, n, p), acls in by_resource.items()]


@handles(ApiKey.DESCRIBE_ACLS)
async def describe_acls(ctx: RequestContext, body) -> dict:
    answer = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
              "resources": []}
    if ctx.access is None or ctx.access.authorizer is None:
        return answer | {"error_code": ErrorCode.security_disabled, "error_message": _DISABLED}
    if not ctx.authorized_cluster(Operation.DESCRIBE):
        return answer | {"error_code": ErrorCode.cluster_authorization_failed}
    acl_filter = _filter(body)
    reason = acl_filter.invalid_reason()
    if reason is not None:
        return answer | {"error_code": ErrorCode.invalid_request, "error_message": reason}
    answer["resources"] = _resources([a for a in ctx.access.acls() if acl_filter.matches(a)])
    return answer


def _matching(acl: AclBinding) -> dict:
    return {"error_code": ErrorCode.none, "error_message": None,
            "resource_type": int(acl.resource_type), "resource_name": acl.resource_name,
            "pattern_type": int(acl.pattern_type), "principal": acl.principal,
            "host": acl.host, "operation": int(acl.operation),
            "permission_type": int(acl.permission)}


@handles(ApiKey.DELETE_ACLS)
async def delete_acls(ctx: RequestContext, body) -> dict:
    def results(error: ErrorCode, message: str | None) -> dict:
        return {"throttle_time": 0, "filter_results": [
            {"error_code": error, "error_message": message, "matching_acls": []}
            for _ in body.filters]}

    if ctx.access is None or ctx.access.authorizer is None:
        return results(ErrorCode.security_disabled, _DISABLED)
    if not ctx.authorized_cluster(Operation.ALTER):
        return results(ErrorCode.cluster_authorization_failed, None)
    filters = [_filter(f) for f in body.filters]
    invalid = [f.invalid_reason() for f in filters]
    matched = ctx.access.delete_acls([f for f, why in zip(filters, invalid) if why is None])
    answers, hits = [], iter(matched)
    for why in invalid:
        if why is not None:
            answers.append({"error_code": ErrorCode.invalid_request, "error_message": why,
                            "matching_acls": []})
        else:
            answers.append({"error_code": ErrorCode.none, "error_message": None,
                            "matching_acls": [_matching(a) for a in next(hits)]})
    return {"throttle_time": 0, "filter_results": answers}
