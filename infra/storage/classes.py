"""Kubernetes storage objects as pure manifest builders (dicts in, dicts out), and how they are created.

StorageClasses: gp3 (default, encrypted, WaitForFirstConsumer), EFS access points, COS (s3fs flex or
csi-s3), NFS. Static volumes: a read-only Mountpoint-for-S3 PV/PVC per mounted dataset bucket, a COS PVC per
mounted COS bucket. Shared RWX claims for datasets/checkpoints. PVCs depend on their driver so that
`pulumi destroy` removes them first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.storage import (
    CosConfig,
    EfsStorageClassConfig,
    Gp3StorageClassConfig,
    NfsConfig,
    SharedVolumeConfig,
)
from infra.context import ClusterInfo

MOUNTPOINT_DRIVER = "s3.csi.aws.com"
FSX_DRIVER = "fsx.csi.aws.com"
ZONE_LABEL = "topology.kubernetes.io/zone"
EFS_PROVISIONER = "efs.csi.aws.com"
EBS_PROVISIONER = "ebs.csi.aws.com"
IBM_FLEX_PROVISIONER = "ibm.io/ibmc-s3fs"
CSI_S3_DRIVER = "ru.yandex.s3.csi"
NFS_PROVISIONER = "nfs.csi.k8s.io"
# Static object-store volumes ignore capacity, but the PV/PVC schema requires one.
STATIC_VOLUME_CAPACITY = "1Ti"
GEESEFS_OPTIONS = "--memory-limit 1000 --dir-mode 0777 --file-mode 0666"

Manifest = dict[str, Any]


def metadata(
    name: str, namespace: str | None = None, annotations: Mapping[str, Any] | None = None
) -> Manifest:
    meta: Manifest = {
        "name": name,
        "labels": {
            "app.kubernetes.io/name": name,
            "app.kubernetes.io/component": "storage",
            "app.kubernetes.io/part-of": "ml-cluster",
            "app.kubernetes.io/managed-by": "pulumi",
        },
    }
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def storage_class(meta: dict[str, Any], provisioner: str, parameters: dict[str, Any], reclaim_policy: str,
                  binding_mode: str = "Immediate", **more: Any) -> Manifest:
    """A StorageClass: its provisioner and parameters, reclaim policy and binding mode, and any further fields."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta, "provisioner": provisioner,
            "parameters": parameters, "reclaimPolicy": reclaim_policy, "volumeBindingMode": binding_mode, **more}


def ebs_tag_parameters(tags: Mapping[str, str]) -> dict[str, str]:
    """The stack's tags as the EBS CSI driver's StorageClass parameters `tagSpecification_<n>: "key=value"`, which
    it puts on every volume it creates for the class (kubernetes-sigs/aws-ebs-csi-driver v1.64.0 docs/tagging.md:
    13-39; pkg/driver/controller.go:224 takes every parameter key with the prefix, pkg/util/template/template.go:40
    splits the value at its first '='). Without them a gp3 claim's volume carries neither the stack's tags nor,
    without the driver's cluster id, the cluster's: nothing that finds the stack's resources by tag sees it.
    The config refuses the keys and values the driver would reject or rewrite (infra/config/schema.py)."""
    return {f"tagSpecification_{index}": f"{key}={value}"
            for index, (key, value) in enumerate(sorted(tags.items()), start=1)}


def gp3_storage_class(config: Gp3StorageClassConfig, tags: Mapping[str, str] | None = None) -> Manifest:
    """The default gp3 class; `tags` (the stack's) go onto every volume the driver makes for it."""
    parameters = {"type": "gp3", "encrypted": "true", "csi.storage.k8s.io/fstype": "ext4",
                  **ebs_tag_parameters(tags or {})}
    if config.kms_key_arn is not None:
        parameters["kmsKeyId"] = config.kms_key_arn
    if config.iops is not None:
        parameters["iops"] = str(config.iops)
    if config.throughput_mibps is not None:
        parameters["throughput"] = str(config.throughput_mibps)
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if config.default else None
    return storage_class(metadata(config.name, annotations=annotations), EBS_PROVISIONER, parameters, "Delete",
                         "WaitForFirstConsumer", allowVolumeExpansion=True)


def efs_storage_class(config: EfsStorageClassConfig, file_system_id: Any) -> Manifest:
    parameters: dict[str, Any] = {
        "provisioningMode": "efs-ap",
        "fileSystemId": file_system_id,
        "directoryPerms": config.directory_perms,
        "basePath": config.base_path,
        "subPathPattern": config.sub_path_pattern,
        "ensureUniqueDirectory": "true" if config.ensure_unique_directory else "false",
    }
    if config.uid is not None and config.gid is not None:
        parameters["uid"] = str(config.uid)
        parameters["gid"] = str(config.gid)
    return storage_class(metadata(config.name), EFS_PROVISIONER, parameters, config.reclaim_policy)


def static_claim(name: str, namespace: str, volume_name: str, access_mode: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(name, namespace),
        "spec": {
            "accessModes": [access_mode],
            "storageClassName": "",  # static binding: never picked up by the default class
            "volumeName": volume_name,
            "resources": {"requests": {"storage": STATIC_VOLUME_CAPACITY}},
        },
    }


def static_volume(
    claim_name: str, namespace: str, access_mode: str, csi: dict[str, Any], mount_options: list[str] | None = None
) -> tuple[Manifest, Manifest]:
    """A pre-bound (static) CSI PV, retained on release, and the PVC bound to it."""
    volume_name = f"{namespace}-{claim_name}"
    spec: dict[str, Any] = {
        "capacity": {"storage": STATIC_VOLUME_CAPACITY},
        "accessModes": [access_mode],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "claimRef": {"namespace": namespace, "name": claim_name},
    }
    if mount_options:
        spec["mountOptions"] = mount_options
    spec["csi"] = csi
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata(volume_name), "spec": spec}
    return volume, static_claim(claim_name, namespace, volume_name, access_mode)


def mountpoint_volume(
    claim_name: str, namespace: str, volume_handle: str, bucket_name: Any, region: str
) -> tuple[Manifest, Manifest]:
    """A read-only Mountpoint-for-S3 PV (static: the driver cannot create buckets) and the PVC bound to it."""
    return static_volume(
        claim_name, namespace, "ReadOnlyMany",
        {
            "driver": MOUNTPOINT_DRIVER,
            "volumeHandle": volume_handle,  # unique per PV in the cluster
            "volumeAttributes": {"bucketName": bucket_name},
        },
        mount_options=["read-only", f"region {region}"],
    )


def fsx_volume(
    claim_name: str, namespace: str, file_system_id: Any, dns_name: Any, mount_name: Any, capacity_gib: int,
    zone: str, mount_options: list[str],
) -> tuple[Manifest, Manifest]:
    """A static FSx for Lustre PV (the file system is the stack's, not the driver's: no StorageClass, no
    provisioning) and the ReadWriteMany PVC bound to it. Pods that mount it schedule only in the file system's
    zone (the PV's node affinity)."""
    volume, claim = static_volume(
        claim_name, namespace, "ReadWriteMany",
        {"driver": FSX_DRIVER, "volumeHandle": file_system_id,
         "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name}},
        mount_options=mount_options,
    )
    size = f"{capacity_gib}Gi"
    volume["spec"]["capacity"] = {"storage": size}
    volume["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}]}}
    claim["spec"]["resources"] = {"requests": {"storage": size}}
    return volume, claim


def cos_flex_storage_class(config: CosConfig) -> Manifest:
    parameters = {
        "ibm.io/chunk-size-mb": "16",
        "ibm.io/parallel-count": "2",
        "ibm.io/multireq-max": "20",
        "ibm.io/stat-cache-size": "100000",
        "ibm.io/s3fs-fuse-retry-count": "5",
        "ibm.io/debug-level": "warn",
        "ibm.io/curl-debug": "false",
        "ibm.io/kernel-cache": "true",
        "ibm.io/object-store-endpoint": config.endpoint,
        "ibm.io/object-store-storage-class": config.location_constraint,
    }
    return storage_class(metadata(config.storage_class_name), IBM_FLEX_PROVISIONER, parameters, "Retain")


def cos_flex_claim(claim_name: str, namespace: str, bucket_name: Any, config: CosConfig) -> Manifest:
    """A PVC the IBM flex provisioner binds to an existing bucket; it never creates or deletes buckets."""
    annotations = {
        "ibm.io/bucket": bucket_name,
        "ibm.io/endpoint": config.endpoint,
        "ibm.io/region": config.location_constraint,
        "ibm.io/secret-name": config.secret_name,
        "ibm.io/secret-namespace": namespace,
        "ibm.io/auto-create-bucket": "false",
        "ibm.io/auto-delete-bucket": "false",
    }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(claim_name, namespace, annotations),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": config.storage_class_name,
            "resources": {"requests": {"storage": STATIC_VOLUME_CAPACITY}},
        },
    }


def csi_s3_secret_refs(config: CosConfig, namespace: str) -> dict[str, Any]:
    ref = {"name": config.secret_name, "namespace": namespace}
    return {"controllerPublishSecretRef": ref, "nodeStageSecretRef": ref, "nodePublishSecretRef": ref}


def csi_s3_storage_class(config: CosConfig, namespace: str) -> Manifest:
    parameters = {"mounter": "geesefs", "options": GEESEFS_OPTIONS}
    for secret_use in ("provisioner", "controller-publish", "node-stage", "node-publish"):
        parameters[f"csi.storage.k8s.io/{secret_use}-secret-name"] = config.secret_name
        parameters[f"csi.storage.k8s.io/{secret_use}-secret-namespace"] = namespace
    return storage_class(metadata(config.storage_class_name), CSI_S3_DRIVER, parameters, "Retain")


def csi_s3_volume(
    claim_name: str, namespace: str, bucket_name: Any, config: CosConfig
) -> tuple[Manifest, Manifest]:
    return static_volume(
        claim_name, namespace, "ReadWriteMany",
        {
            "driver": CSI_S3_DRIVER,
            "volumeHandle": bucket_name,  # csi-s3 reads the bucket from the handle
            "volumeAttributes": {"capacity": STATIC_VOLUME_CAPACITY, "mounter": "geesefs", "options": GEESEFS_OPTIONS},
            **csi_s3_secret_refs(config, namespace),
        },
    )


def nfs_storage_class(config: NfsConfig) -> Manifest:
    return storage_class(metadata(config.storage_class_name), NFS_PROVISIONER,
                         {"server": config.server, "share": config.share}, config.reclaim_policy,
                         mountOptions=list(config.mount_options))


def shared_claim(config: SharedVolumeConfig, namespace: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(config.name, namespace),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": config.storage_class,
            "resources": {"requests": {"storage": config.size}},
        },
    }


def secret(name: str, namespace: str, secret_type: str, string_data: Mapping[str, Any]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(name, namespace),
        "type": secret_type,
        "stringData": dict(string_data),
    }


def create(
    name: str,
    manifest: Manifest,
    cluster: ClusterInfo,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    protect: bool = False,
) -> pulumi.CustomResource:
    """Create a manifest as its typed pulumi_kubernetes resource through the cluster's provider."""
    opts = pulumi.ResourceOptions(
        parent=parent, provider=cluster.provider, depends_on=list(depends_on), protect=protect
    )
    kind, meta = manifest["kind"], manifest["metadata"]
    if kind == "StorageClass":
        return k8s.storage.v1.StorageClass(
            name,
            metadata=meta,
            provisioner=manifest["provisioner"],
            parameters=manifest.get("parameters"),
            reclaim_policy=manifest.get("reclaimPolicy"),
            volume_binding_mode=manifest.get("volumeBindingMode"),
            allow_volume_expansion=manifest.get("allowVolumeExpansion"),
            mount_options=manifest.get("mountOptions"),
            opts=opts,
        )
    if kind == "PersistentVolume":
        return k8s.core.v1.PersistentVolume(name, metadata=meta, spec=manifest["spec"], opts=opts)
    if kind == "PersistentVolumeClaim":
        return k8s.core.v1.PersistentVolumeClaim(name, metadata=meta, spec=manifest["spec"], opts=opts)
    if kind == "Secret":
        return k8s.core.v1.Secret(
            name, metadata=meta, type=manifest["type"], string_data=manifest["stringData"], opts=opts
        )
    raise ValueError(f"no typed resource for kind {kind}")


@dataclass
class CreatedObjects:
    """What other components read: names, and the resources to depend on."""

    storage_classes: list[str] = field(default_factory=list)
    dataset_claims: dict[str, str] = field(default_factory=dict)  # bucket key -> PVC name
    shared_claims: list[str] = field(default_factory=list)
    resources: list[pulumi.Resource] = field(default_factory=list)
