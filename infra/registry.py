"""The stack's image registry: one ECR repository for the training image, which the stack's Jobs run by tag.

Tags are immutable (a tag names one image for good, so a Job's name hash names one image too), every push is
scanned, and a lifecycle policy expires untagged layers and keeps only the newest tagged images. Protected
stacks keep the repository on `destroy`; others delete it with its images.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config.registry import RegistryConfig
from infra.context import StackContext


def repository_name(prefix: str, config: RegistryConfig) -> str:
    return f"{prefix}-{config.repository}"


def repository_url(account_id: str, region: str, name: str) -> str:
    """What ECR reports as repositoryUri: known before the repository exists, so Jobs can be rendered up front."""
    return f"{account_id}.dkr.ecr.{region}.amazonaws.com/{name}"


def lifecycle_policy(config: RegistryConfig) -> str:
    """ECR lifecycle policy: rule 1 expires untagged images, rule 2 keeps the newest tagged ones."""
    return json.dumps({"rules": [
        {"rulePriority": 1, "description": f"expire untagged images after {config.untagged_expiry_days} days",
         "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                       "countNumber": config.untagged_expiry_days},
         "action": {"type": "expire"}},
        {"rulePriority": 2, "description": f"keep the newest {config.keep_tagged_images} tagged images",
         "selection": {"tagStatus": "any", "countType": "imageCountMoreThan",
                       "countNumber": config.keep_tagged_images},
         "action": {"type": "expire"}},
    ]}, sort_keys=True)


@dataclass(frozen=True)
class ImageRegistryArgs:
    ctx: StackContext
    config: RegistryConfig


class ImageRegistry(pulumi.ComponentResource):
    def __init__(self, name: str, args: ImageRegistryArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:ImageRegistry", name, None, opts)
        ctx = args.ctx
        stateful = pulumi.ResourceOptions(parent=self, protect=ctx.protected, retain_on_delete=ctx.protected)
        self.repository = aws.ecr.Repository(
            ctx.name("registry", "repository"),
            name=repository_name(ctx.prefix, args.config),
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="AES256")],
            force_delete=not ctx.protected,  # dev: `destroy` removes the images too
            tags=ctx.tags,
            opts=stateful)
        aws.ecr.LifecyclePolicy(ctx.name("registry", "lifecycle"), repository=self.repository.name,
                                policy=lifecycle_policy(args.config), opts=pulumi.ResourceOptions(parent=self))
        self.url = self.repository.repository_url
        self.register_outputs({"url": self.url})
