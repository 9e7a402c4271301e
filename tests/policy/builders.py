"""Small synthetic plan documents, in the offline plan's JSON shape, that pass the whole policy pack.

Tests start from these compliant pieces and break one thing at a time, so a failing test names one rule.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from infra.policy.plan import PlannedStack, plan_from_document


def resource(
    type_token: str,
    name: str,
    inputs: dict[str, Any] | None = None,
    *,
    protect: bool = False,
    retain_on_delete: bool = False,
    provider: str | None = None,
    resource_id: str | None = None,
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "type": type_token,
        "name": name,
        "parent": None,
        "provider": provider,
        "inputs": inputs or {},
        "options": {
            "protect": protect,
            "retainOnDelete": retain_on_delete,
            "deleteBeforeReplace": False,
            "dependsOn": [],
            "ignoreChanges": [],
        },
    }
    if resource_id is not None:
        raw["id"] = resource_id
    return raw


def document(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"project": "ml-cluster", "stack": "test", "resources": list(resources)}


def plan(*resources: dict[str, Any]) -> PlannedStack:
    return plan_from_document(document(*resources))


def tls_only_policy(bucket_name: str) -> str:
    arn = f"arn:aws:s3:::{bucket_name}"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [arn, f"{arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


def s3_bucket(name: str = "data", **options: Any) -> list[dict[str, Any]]:
    """A bucket with its SSE configuration, public access block and TLS-only policy, linked by id."""
    bucket_id = f"{name}-id"
    return [
        resource(
            "aws:s3/bucket:Bucket",
            name,
            {"bucket": f"mlc-{name}", "forceDestroy": False},
            resource_id=bucket_id,
            **options,
        ),
        resource(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
            name,  # same logical name as the bucket: names are unique per type only
            {
                "bucket": bucket_id,
                "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}],
            },
        ),
        resource(
            "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
            f"{name}-pab",
            {
                "bucket": bucket_id,
                "blockPublicAcls": True,
                "blockPublicPolicy": True,
                "ignorePublicAcls": True,
                "restrictPublicBuckets": True,
            },
        ),
        resource(
            "aws:s3/bucketPolicy:BucketPolicy",
            f"{name}-tls",
            {"bucket": bucket_id, "policy": tls_only_policy(f"mlc-{name}")},
        ),
    ]


def gpu_job(name: str = "train") -> dict[str, Any]:
    """A Job like workloads.jobspec renders: Guaranteed GPU container, /dev/shm, NVMe scratch, staging."""
    limits = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1", "ephemeral-storage": "120Gi"}
    stage_limits = {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "training"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [
                        {
                            "name": "stage",
                            "image": "trainer:1",
                            "resources": {"requests": dict(stage_limits), "limits": dict(stage_limits)},
                            "volumeMounts": [{"name": "dataset", "mountPath": "/data"}],
                        }
                    ],
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {"requests": dict(limits), "limits": dict(limits)},
                            "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
                            "volumeMounts": [
                                {"name": "dshm", "mountPath": "/dev/shm"},
                                {"name": "dataset", "mountPath": "/data", "readOnly": True},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                        {"name": "dataset", "emptyDir": {"sizeLimit": "100Gi"}},
                    ],
                }
            }
        },
    }
    return resource("kubernetes:batch/v1:Job", name, manifest)


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["inputs"]["spec"]["template"]["spec"]


def container(job: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(job)
    return next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name)


def gpu_node_group(name: str = "gpu", **overrides: Any) -> dict[str, Any]:
    inputs = {
        "amiType": "AL2023_x86_64_NVIDIA",
        "instanceTypes": ["g5.xlarge"],
        "capacityType": "ON_DEMAND",
        "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}],
        "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 2},
    }
    inputs.update(overrides)
    return resource("aws:eks/nodeGroup:NodeGroup", name, inputs)


def compliant_stack(*, protected: bool = False) -> list[dict[str, Any]]:
    """One of everything the pack checks, all compliant (stateful resources protected when asked)."""
    stateful = {"protect": protected, "retain_on_delete": protected}
    return [
        *s3_bucket("data", **stateful),
        resource("aws:efs/fileSystem:FileSystem", "shared", {"encrypted": True}, **stateful),
        resource("aws:ec2/launchTemplate:LaunchTemplate", "gpu", {"metadataOptions": {"httpTokens": "required"}}),
        gpu_node_group(capacityType="SPOT" if protected else "ON_DEMAND"),
        resource(
            "aws:eks/nodeGroup:NodeGroup",
            "system",
            {"amiType": "AL2023_x86_64_STANDARD", "instanceTypes": ["m6i.large"]},
        ),
        gpu_job(),
    ]


def copy_of(raw: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(raw)
