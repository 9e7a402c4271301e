"""Object-store buckets: S3 (encrypted, private, TLS-only, lifecycle) and IBM COS / S3-compatible buckets
through an explicit aws.Provider pointed at the COS endpoint with the stack's HMAC keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
from pydantic import SecretStr

from infra.config.storage import BucketConfig, CosBucketConfig, CosConfig
from infra.context import StackContext
from infra.iam import policy_document

MAX_BUCKET_NAME = 63


def default_bucket_name(ctx: StackContext, key: str, account_id: str | None) -> str:
    """`<prefix>-<key>[-<account>]`: the account id keeps S3's global namespace from colliding.

    The same name as infra.config.names.default_bucket_name, whose length and uniqueness are checked with every
    other derived name before any resource is registered; the ValueError here is only a last line of defence.
    """
    name = f"{ctx.prefix}-{key}" + (f"-{account_id}" if account_id else "")
    if len(name) > MAX_BUCKET_NAME:
        raise ValueError(f"storage bucket {key}: derived name {name!r} is longer than 63; set bucketName")
    return name


def lifecycle_rules(config: BucketConfig | CosBucketConfig) -> list[aws.s3.BucketLifecycleConfigurationRuleArgsDict]:
    """Lifecycle rules (pulumi-aws input shape): abort stale multipart uploads, expire scratch prefixes and,
    with versioning, old versions."""
    everything: aws.s3.BucketLifecycleConfigurationRuleFilterArgsDict = {"prefix": ""}
    rules: list[aws.s3.BucketLifecycleConfigurationRuleArgsDict] = [
        {
            "id": "abort-incomplete-multipart",
            "status": "Enabled",
            "filter": everything,
            "abort_incomplete_multipart_upload": {"days_after_initiation": config.abort_incomplete_multipart_days},
        }
    ]
    for index, prefix in enumerate(config.scratch_prefixes):
        rules.append(
            {
                "id": f"expire-scratch-{index}",
                "status": "Enabled",
                "filter": {"prefix": prefix},
                "expiration": {"days": config.scratch_expiry_days},
            }
        )
    if config.noncurrent_version_expiry_days is not None:
        rules.append(
            {
                "id": "expire-noncurrent-versions",
                "status": "Enabled",
                "filter": everything,
                "noncurrent_version_expiration": {"noncurrent_days": config.noncurrent_version_expiry_days},
            }
        )
    return rules


def tls_only_policy(bucket_arn: str) -> str:
    """A bucket policy that denies every request made without TLS."""
    return policy_document(
        {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    )


def encryption_rule(config: BucketConfig) -> aws.s3.BucketServerSideEncryptionConfigurationRuleArgsDict:
    by_default: aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgsDict = {
        "sse_algorithm": config.encryption
    }
    if config.kms_key_arn is not None:
        by_default["kms_master_key_id"] = config.kms_key_arn
    # An S3 bucket key cuts KMS request costs for buckets read by many GPUs.
    return {
        "apply_server_side_encryption_by_default": by_default,
        "bucket_key_enabled": config.encryption == "aws:kms",
    }


@dataclass(frozen=True)
class S3BucketsArgs:
    buckets: Sequence[BucketConfig]


class S3Buckets(pulumi.ComponentResource):
    """Attributes: names / arns by logical bucket name, buckets (the aws.s3.Bucket resources)."""

    def __init__(self, ctx: StackContext, args: S3BucketsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:S3Buckets", ctx.name("storage", "s3"), None, opts)
        account_id = aws.get_caller_identity(opts=pulumi.InvokeOptions(parent=self)).account_id
        self.names: dict[str, pulumi.Output[str]] = {}
        self.arns: dict[str, pulumi.Output[str]] = {}
        self.buckets: dict[str, aws.s3.Bucket] = {}
        for config in args.buckets:
            bucket = self._bucket(ctx, config, config.bucket_name or default_bucket_name(ctx, config.name, account_id))
            self.buckets[config.name] = bucket
            self.names[config.name] = bucket.bucket
            self.arns[config.name] = bucket.arn
        self.register_outputs({"names": self.names})

    def _bucket(self, ctx: StackContext, config: BucketConfig, physical_name: str) -> aws.s3.Bucket:
        def name(thing: str) -> str:
            return ctx.name("storage", f"s3-{config.name}{thing}")

        bucket = aws.s3.Bucket(
            name(""),
            bucket=physical_name,
            force_destroy=not ctx.protected,
            tags={**ctx.tags, "Name": physical_name},
            opts=pulumi.ResourceOptions(parent=self, protect=ctx.protected, retain_on_delete=ctx.protected),
        )
        # Sub-resources hang off the component, not the bucket: `protect` is inherited from a parent.
        child = pulumi.ResourceOptions(parent=self)
        aws.s3.BucketOwnershipControls(
            name("-ownership"), bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        public_access_block = aws.s3.BucketPublicAccessBlock(
            name("-public-access-block"),
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            name("-sse"), bucket=bucket.id, rules=[encryption_rule(config)], opts=child
        )
        versioning = None
        if config.versioning:
            versioning = aws.s3.BucketVersioning(
                name("-versioning"),
                bucket=bucket.id,
                versioning_configuration={"status": "Enabled"},
                opts=child,
            )
        aws.s3.BucketLifecycleConfiguration(
            name("-lifecycle"),
            bucket=bucket.id,
            rules=lifecycle_rules(config),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning] if versioning else []),
        )
        # After the public access block, so S3 never evaluates the policy against a half-configured bucket.
        aws.s3.BucketPolicy(
            name("-tls-only"),
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access_block]),
        )
        return bucket


@dataclass(frozen=True)
class CosBucketsArgs:
    config: CosConfig
    access_key_id: SecretStr
    secret_access_key: SecretStr


def cos_provider_args(config: CosConfig) -> dict:
    """Settings that point the aws provider at an S3-compatible endpoint (credentials apart)."""
    return {
        "region": config.location_constraint,
        "endpoints": [{"s3": config.endpoint}],
        "s3_use_path_style": True,
        "skip_credentials_validation": True,
        "skip_region_validation": True,
        "skip_requesting_account_id": True,
        "skip_metadata_api_check": True,
    }


class CosBuckets(pulumi.ComponentResource):
    """Buckets on IBM COS through their own aws.Provider. COS encrypts every object at rest and has no bucket
    policies, public-access blocks or ownership controls (access is IAM/HMAC), so only versioning and
    lifecycle rules are configured. Attributes: names by logical bucket name, provider, buckets."""

    def __init__(self, ctx: StackContext, args: CosBucketsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:CosBuckets", ctx.name("storage", "cos"), None, opts)
        self.provider = aws.Provider(
            ctx.name("storage", "cos-provider"),
            access_key=pulumi.Output.secret(args.access_key_id.get_secret_value()),
            secret_key=pulumi.Output.secret(args.secret_access_key.get_secret_value()),
            **cos_provider_args(args.config),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.names: dict[str, pulumi.Output[str]] = {}
        self.buckets: dict[str, aws.s3.Bucket] = {}
        for config in args.config.buckets:
            bucket = aws.s3.Bucket(
                ctx.name("storage", f"cos-{config.name}"),
                bucket=config.bucket_name or default_bucket_name(ctx, config.name, None),
                force_destroy=not ctx.protected,
                opts=pulumi.ResourceOptions(
                    parent=self, provider=self.provider, protect=ctx.protected, retain_on_delete=ctx.protected
                ),
            )
            child = pulumi.ResourceOptions(parent=self, provider=self.provider)
            versioning = None
            if config.versioning:
                versioning = aws.s3.BucketVersioning(
                    ctx.name("storage", f"cos-{config.name}-versioning"),
                    bucket=bucket.id,
                    versioning_configuration={"status": "Enabled"},
                    opts=child,
                )
            aws.s3.BucketLifecycleConfiguration(
                ctx.name("storage", f"cos-{config.name}-lifecycle"),
                bucket=bucket.id,
                rules=lifecycle_rules(config),
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[versioning] if versioning else [])
                ),
            )
            self.buckets[config.name] = bucket
            self.names[config.name] = bucket.bucket
        self.register_outputs({"names": self.names})
