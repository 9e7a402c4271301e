"""Dataset packs on the cluster (`submit pack`): a service account of their own, bound by EKS Pod Identity to a role
that reads every stack bucket and writes only the buckets marked `packInto`.

Training Jobs read datasets and write checkpoints; a pack writes datasets. Giving that to the Jobs' role would let
every training run overwrite its own inputs, so packs get their own identity (`packer` in the Jobs' namespace).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.names import PACK_SERVICE_ACCOUNT
from infra.config.schema import StackConfig
from infra.context import ClusterInfo, StackContext
from infra.iam import pod_identity_trust_policy, policy_document
from infra.jobs import service_account_manifest


def pack_bucket_keys(cfg: StackConfig) -> list[str]:
    """The logical names of the S3 buckets packs may write (EKS only: COS buckets are reached with HMAC keys)."""
    return [bucket.name for bucket in cfg.storage.buckets if bucket.pack_into] if cfg.platform == "eks" else []


def pack_access_policy(readable_arns: Sequence[str], writable_arns: Sequence[str]) -> str:
    """Read (list, get) on every stack bucket: a pack's source may be any of them. Write on the packInto buckets:
    the shards and their records (put), a rerun slice's cleanup of its own unfinished uploads (list and abort
    them) and of shards it replaces (delete)."""
    readable = sorted(set(readable_arns) | set(writable_arns))
    writable = sorted(set(writable_arns))
    statements: list[dict[str, Any]] = [
        {"Sid": "ListStackBuckets", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": readable},
        {"Sid": "ReadStackObjects", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"{arn}/*" for arn in readable]},
    ]
    if writable:
        statements += [
            {"Sid": "ListPackUploads", "Effect": "Allow", "Action": ["s3:ListBucketMultipartUploads"],
             "Resource": writable},
            {"Sid": "WritePackedDatasets", "Effect": "Allow",
             "Action": ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:DeleteObject"],
             "Resource": [f"{arn}/*" for arn in writable]},
        ]
    return policy_document(*statements)


@dataclass(frozen=True)
class DatasetPackerArgs:
    cluster: ClusterInfo
    namespace: str  # the Jobs' namespace
    namespace_resource: pulumi.Resource
    bucket_arns: Mapping[str, pulumi.Input[str]]  # every stack S3 bucket by logical name
    writable: Sequence[str]  # logical names of the packInto buckets


class DatasetPacker(pulumi.ComponentResource):
    """The packer service account and its role (only on EKS stacks with a packInto bucket)."""

    def __init__(self, ctx: StackContext, args: DatasetPackerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:DatasetPacker", ctx.name("pack", "all"), None, opts)
        child = pulumi.ResourceOptions(parent=self)
        manifest = service_account_manifest(PACK_SERVICE_ACCOUNT, args.namespace, ctx.stack, ctx.label_prefix)
        manifest["metadata"]["labels"]["app.kubernetes.io/component"] = "dataset-pack"
        account = k8s.core.v1.ServiceAccount(
            ctx.name("pack", "service-account"), metadata=manifest["metadata"],
            opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider,
                                        depends_on=[args.namespace_resource]))
        role = aws.iam.Role(ctx.name("pack", "role"), assume_role_policy=pod_identity_trust_policy(),
                            description=f"Dataset packs of {ctx.stack}: read the stack buckets, write packInto ones",
                            tags=ctx.tags, opts=child)
        readable = list(args.bucket_arns.values())
        writable = [args.bucket_arns[key] for key in args.writable]
        aws.iam.RolePolicy(ctx.name("pack", "bucket-access"), role=role.id,
                           policy=pulumi.Output.all(readable, writable).apply(
                               lambda arns: pack_access_policy(arns[0], arns[1])),
                           opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            ctx.name("pack", "pod-identity"), cluster_name=args.cluster.name, namespace=args.namespace,
            service_account=PACK_SERVICE_ACCOUNT, role_arn=role.arn, tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[account]))
        self.role_arn = role.arn
        self.register_outputs({"serviceAccount": PACK_SERVICE_ACCOUNT, "roleArn": role.arn})
