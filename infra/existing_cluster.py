"""An existing EKS cluster a stack lays itself onto: what DescribeCluster says of it, and why it may not fit the stack
file. Pure: the program reads the cluster through aws.eks.get_cluster (infra/cluster.py find_cluster; offline the
stacks/fixtures/clusters.json entry, checked by infra/plan/engine.py), preflight and scripts/new_stack.py through
DescribeCluster (boto3, or a saved `aws eks describe-cluster`); all of them check it here.

Every field read is checked by type before it is used: a missing, null or mistyped field (or junk where an object or
list belongs) is a ClusterAnswerError naming the cluster and the field, never a `None` read as text. The two shapes
are the EKS API's DescribeCluster `cluster` structure (`resourcesVpcConfig`, `certificateAuthority`,
`accessConfig`) and the Pulumi aws.eks.getCluster data source's result (`vpcConfig`, `certificateAuthorities[0]`,
`accessConfigs[0]`). Fields neither shape lists here are ignored: AWS adds fields over time."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infra.config import ClusterConfig


class ClusterAnswerError(ValueError):
    """A DescribeCluster answer (or getCluster result) that is not the shape the EKS API documents."""

    def __init__(self, cluster: str, field: str, why: str):
        self.cluster, self.field, self.why = cluster, field, why
        super().__init__(f"cluster {cluster}: {field}: {why}")


@dataclass(frozen=True)
class FoundCluster:
    """What DescribeCluster (or aws.eks.get_cluster) says of an existing EKS cluster, each field checked."""

    name: str
    version: str
    vpc_id: str
    endpoint: str
    certificate_authority: str
    cluster_security_group_id: str
    authentication_mode: str
    status: str
    arn: str = ""
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()  # the additional groups the cluster was created with
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def region(self) -> str:
        """The region in the cluster's ARN (arn:aws:eks:<region>:<account>:cluster/<name>)."""
        return self.arn.split(":")[3] if self.arn.count(":") >= 5 else ""


# Access entries (the stack's people, its teams, and the node role of managed node groups, which EKS adds itself)
# need one of these (EKS User Guide, "Grant IAM users access to Kubernetes with EKS access entries").
ACCESS_ENTRY_MODES = ("API", "API_AND_CONFIG_MAP")
# DescribeCluster leaves accessConfig out for clusters made before access entries existed: they use the aws-auth
# ConfigMap only.
DEFAULT_AUTHENTICATION_MODE = "CONFIG_MAP"

Path = tuple[str | int, ...]
ALWAYS, ACTIVE, OPTIONAL = "always", "when ACTIVE", "optional"  # a cluster being created has no endpoint yet
_KINDS = {"text": "a string", "texts": "a list of strings", "flag": "true or false", "map": "an object of strings",
          "time": "a timestamp"}


@dataclass(frozen=True)
class _Field:
    attribute: str  # FoundCluster's, or "" for a field only checked
    describe: Path  # in DescribeCluster's `cluster`
    get_cluster: Path  # in aws.eks.getCluster's result (clusters.json)
    kind: str
    need: str = OPTIONAL
    pattern: str | None = None  # each non-empty string must match


_ID = r"[0-9a-f]{8}(?:[0-9a-f]{9})?"
FIELDS = (
    _Field("name", ("name",), ("name",), "text", ALWAYS, r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}"),
    _Field("arn", ("arn",), ("arn",), "text", ALWAYS, r"arn:aws[a-z-]*:eks:[a-z0-9-]+:\d{12}:cluster/[A-Za-z0-9_-]+"),
    _Field("version", ("version",), ("version",), "text", ALWAYS, r"\d+\.\d+"),
    _Field("status", ("status",), ("status",), "text", ALWAYS, r"[A-Z_]+"),
    _Field("endpoint", ("endpoint",), ("endpoint",), "text", ACTIVE, r"https://[^\s]+"),
    _Field("certificate_authority", ("certificateAuthority", "data"), ("certificateAuthorities", 0, "data"), "text",
           ACTIVE, r"[A-Za-z0-9+/=]+"),
    _Field("vpc_id", ("resourcesVpcConfig", "vpcId"), ("vpcConfig", "vpcId"), "text", ALWAYS, rf"vpc-{_ID}"),
    _Field("subnet_ids", ("resourcesVpcConfig", "subnetIds"), ("vpcConfig", "subnetIds"), "texts", ALWAYS,
           rf"subnet-{_ID}"),
    _Field("security_group_ids", ("resourcesVpcConfig", "securityGroupIds"), ("vpcConfig", "securityGroupIds"),
           "texts", OPTIONAL, rf"sg-{_ID}"),
    _Field("cluster_security_group_id", ("resourcesVpcConfig", "clusterSecurityGroupId"),
           ("vpcConfig", "clusterSecurityGroupId"), "text", ALWAYS, rf"sg-{_ID}"),
    _Field("", ("resourcesVpcConfig", "endpointPublicAccess"), ("vpcConfig", "endpointPublicAccess"), "flag"),
    _Field("", ("resourcesVpcConfig", "endpointPrivateAccess"), ("vpcConfig", "endpointPrivateAccess"), "flag"),
    _Field("", ("resourcesVpcConfig", "publicAccessCidrs"), ("vpcConfig", "publicAccessCidrs"), "texts"),
    _Field("authentication_mode", ("accessConfig", "authenticationMode"), ("accessConfigs", 0, "authenticationMode"),
           "text", OPTIONAL, r"[A-Z_]+"),
    _Field("", ("platformVersion",), ("platformVersion",), "text"),
    _Field("", ("roleArn",), ("roleArn",), "text"),
    _Field("tags", ("tags",), ("tags",), "map"),
    _Field("", ("createdAt",), ("createdAt",), "time"),
    _Field("", ("kubernetesNetworkConfig", "serviceIpv4Cidr"), ("kubernetesNetworkConfigs", 0, "serviceIpv4Cidr"),
           "text"),
    _Field("", ("identity", "oidc", "issuer"), ("identities", 0, "oidcs", 0, "issuer"), "text"),
)
DESCRIBE, GET_CLUSTER = "describe", "get_cluster"

_MISSING = object()


def _dotted(path: Path) -> str:
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".") or "answer"


def _shown(value: Any) -> str:
    """A value in an error line: JSON, cut to stay one short line."""
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _walk(answer: Any, path: Path, cluster: str) -> tuple[Any, Path]:
    """The value at `path`, or _MISSING / None (null) with the path walked so far. Junk where an object or a list
    belongs is an error at that step."""
    value: Any = answer
    walked: Path = ()
    for step in path:
        want = "a list" if isinstance(step, int) else "an object"
        fits = isinstance(value, list) if isinstance(step, int) else isinstance(value, Mapping)
        if not fits:
            raise ClusterAnswerError(cluster, _dotted(walked), f"{_shown(value)} is {_kind_of(value)}, not {want}")
        if isinstance(step, int):
            if step >= len(value):
                return _MISSING, (*walked, step)
            value = value[step]
        else:
            if step not in value:
                return _MISSING, (*walked, step)
            value = value[step]
        walked = (*walked, step)
        if value is None:
            return None, walked
    return value, walked


def _checked(value: Any, field: _Field, where: str, cluster: str) -> Any:
    """`value` if it is the field's kind (and pattern), else ClusterAnswerError."""
    want = _KINDS[field.kind]

    def wrong(why: str) -> ClusterAnswerError:
        return ClusterAnswerError(cluster, where, why)

    if field.kind in ("text", "time"):
        # boto3 parses timestamps; the AWS CLI prints ISO 8601 (v2) or the wire's epoch seconds (v1's default)
        if field.kind == "time" and (isinstance(value, datetime) or (isinstance(value, (int, float))
                                                                     and not isinstance(value, bool))):
            return value
        if not isinstance(value, str):
            raise wrong(f"{_shown(value)} is {_kind_of(value)}, not {want}")
        if field.need != OPTIONAL and not value:
            raise wrong(f"empty, not {want}")
        if value and field.pattern and not re.fullmatch(field.pattern, value):
            raise wrong(f"{_shown(value)} is not what EKS answers there")
        return value
    if field.kind == "flag":
        if not isinstance(value, bool):
            raise wrong(f"{_shown(value)} is {_kind_of(value)}, not {want}")
        return value
    if field.kind == "texts":
        if not isinstance(value, list):
            raise wrong(f"{_shown(value)} is {_kind_of(value)}, not {want}")
        for index, item in enumerate(value):
            if not isinstance(item, str) or (field.pattern and not re.fullmatch(field.pattern, item)):
                raise ClusterAnswerError(cluster, f"{where}[{index}]", f"{_shown(item)} is "
                                         + (f"{_kind_of(item)}, not a string" if not isinstance(item, str)
                                            else "not what EKS answers there"))
        if field.need != OPTIONAL and not value:
            raise wrong("an empty list")
        return tuple(value)
    # map
    if not isinstance(value, Mapping):
        raise wrong(f"{_shown(value)} is {_kind_of(value)}, not {want}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ClusterAnswerError(cluster, f"{where}.{key}", f"{_shown(item)} is {_kind_of(item)}, not a string")
    return tuple(sorted(value.items()))


def _found(answer: Any, shape: str, asked: str | None) -> FoundCluster:
    named = answer.get("name") if isinstance(answer, Mapping) else None
    name: str = asked or (named if isinstance(named, str) and named else "(unnamed)")
    if not isinstance(answer, Mapping):
        raise ClusterAnswerError(name, "answer", "missing, not an object" if answer is None else
                                 f"{_shown(answer)} is {_kind_of(answer)}, not an object")
    status = answer.get("status")
    values: dict[str, Any] = {}
    for field in FIELDS:
        path = field.describe if shape == DESCRIBE else field.get_cluster
        value, walked = _walk(answer, path, name)
        where = _dotted(path)
        needed = field.need == ALWAYS or (field.need == ACTIVE and status == "ACTIVE")
        if value is _MISSING or value is None:
            if needed:
                at = _dotted(walked)
                kind, gone = _KINDS[field.kind], "missing" if value is _MISSING else "null"
                why = (f"missing ({kind})" if value is _MISSING and at == where else f"null, not {kind}"
                       if at == where else f"{gone}: {where} ({kind}) is required")
                raise ClusterAnswerError(name, at, why)
            continue
        checked = _checked(value, field, where, name)
        if field.attribute:
            values[field.attribute] = checked
    if asked is not None and values["name"] != asked:
        raise ClusterAnswerError(asked, "name", f"{_shown(values['name'])}: the answer is another cluster's")
    values.setdefault("endpoint", "")
    values.setdefault("certificate_authority", "")
    values["authentication_mode"] = values.get("authentication_mode") or DEFAULT_AUTHENTICATION_MODE
    return FoundCluster(**values)


def found_from_describe(cluster: Any, asked: str | None = None) -> FoundCluster:
    """From DescribeCluster's `cluster` (boto3's describe_cluster()["cluster"], or `aws eks describe-cluster`'s
    JSON under "cluster"); `asked`: the name the stack asked for. ClusterAnswerError on a broken field."""
    return _found(cluster, DESCRIBE, asked)


def found_from_get_cluster(result: Any, asked: str | None = None) -> FoundCluster:
    """From aws.eks.getCluster's result in its wire shape (a stacks/fixtures/clusters.json entry)."""
    return _found(result, GET_CLUSTER, asked)


def existing_cluster_problems(found: FoundCluster, cfg: ClusterConfig, vpc_id: str) -> list[tuple[str, str]]:
    """Why the stack cannot be laid onto the cluster it read: each a `path: why` with the fix."""
    problems = []
    if found.status != "ACTIVE":
        problems.append(("cluster.name", f"cluster {found.name} is {found.status}, not ACTIVE: wait for it"))
    if found.version != cfg.kubernetes_version:
        problems.append(("cluster.kubernetesVersion", f"{cfg.kubernetes_version}, but cluster {found.name} runs "
                                                      f"{found.version}: set kubernetesVersion: \"{found.version}\""))
    if found.vpc_id != vpc_id:
        problems.append(("network.existing.vpcId", f"{vpc_id}, but cluster {found.name} is in {found.vpc_id}: "
                                                   f"set vpcId: {found.vpc_id} and that VPC's subnets"))
    if found.authentication_mode not in ACCESS_ENTRY_MODES:
        problems.append(("cluster.name", f"cluster {found.name} authenticates with {found.authentication_mode} "
                                         "only; the stack's node groups and people need access entries: aws eks "
                                         f"update-cluster-config --name {found.name} --access-config "
                                         "authenticationMode=API_AND_CONFIG_MAP"))
    return problems
