"""A file system's security group and its port rules: what EFS (NFS from the nodes) and FSx for Lustre (Lustre to
and from the nodes and itself) both create, in one place.

Rules are standalone `aws.vpc` ingress/egress rule resources (one per peer and port range), never inline rules, so a
rule added later is an update of one resource, not a replacement of the group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws

from infra.context import StackContext

SELF = "self"  # a peer name meaning the group itself (its own members talk to each other)


@dataclass(frozen=True)
class PortRule:
    """One rule: TCP `low`-`high` (or, with protocol "-1", every protocol and port) from (ingress) or to (egress)
    the peer named `peer` of the group's peers.

    `key` completes the rule's resource name (ctx.name("storage", key)); `description` is the rule's own."""

    key: str
    direction: Literal["ingress", "egress"]
    peer: str
    low: int
    high: int
    description: str
    protocol: Literal["tcp", "-1"] = "tcp"


def file_system_security_group(ctx: StackContext, key: str, vpc_id: pulumi.Input[str], description: str,
                               peers: Mapping[str, pulumi.Input[str]], rules: Sequence[PortRule],
                               parent: pulumi.Resource) -> aws.ec2.SecurityGroup:
    """The group `ctx.name("storage", key)` in `vpc_id` with `rules`, in order; a rule's peer is a key of `peers`
    (security group ids) or SELF. Rules are revoked when the group is deleted (destroy never waits on them)."""
    child = pulumi.ResourceOptions(parent=parent)
    group = aws.ec2.SecurityGroup(
        ctx.name("storage", key),
        vpc_id=vpc_id,
        description=description,
        revoke_rules_on_delete=True,
        tags={**ctx.tags, "Name": ctx.name("storage", key)},
        opts=child,
    )
    for rule in rules:
        peer_id = group.id if rule.peer == SELF else peers[rule.peer]
        kind = aws.vpc.SecurityGroupIngressRule if rule.direction == "ingress" else aws.vpc.SecurityGroupEgressRule
        kind(
            ctx.name("storage", rule.key),
            security_group_id=group.id,
            referenced_security_group_id=peer_id,
            ip_protocol=rule.protocol,
            from_port=rule.low if rule.protocol == "tcp" else None,
            to_port=rule.high if rule.protocol == "tcp" else None,
            description=rule.description,
            opts=child,
        )
    return group
