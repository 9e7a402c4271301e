"""Pure builders: mount-target subnet choice, bucket rules and policies, IAM scoping, Kubernetes manifests."""

from __future__ import annotations

import json

import pytest

from infra.config.storage import (
    BucketConfig,
    CosConfig,
    EfsConfig,
    EfsStorageClassConfig,
    Gp3StorageClassConfig,
    NfsConfig,
    SharedVolumeConfig,
)
from infra.context import StackContext, SubnetRef
from infra.iam import pod_identity_trust_policy
from infra.plan.kubeschema import validate
from infra.storage import classes
from infra.storage.buckets import (
    cos_provider_args,
    default_bucket_name,
    encryption_rule,
    lifecycle_rules,
    tls_only_policy,
)
from infra.storage.drivers import efs_driver_policy, mountpoint_driver_policy
from infra.storage.efs import lifecycle_policies, mount_target_subnets

K8S = "1.33"
FS_ARN = "arn:aws:elasticfilesystem:us-west-2:111122223333:file-system/fs-0123456789abcdef0"
COS = CosConfig(endpoint="https://s3.us-south.cloud-object-storage.appdomain.cloud")


def valid(manifest: dict) -> None:
    validate(manifest, K8S, strict=True)


def test_one_mount_target_subnet_per_zone_first_in_order() -> None:
    subnets = [SubnetRef("subnet-b", "us-east-1b"), SubnetRef("subnet-a2", "us-east-1a"),
               SubnetRef("subnet-a1", "us-east-1a"), SubnetRef("subnet-c", "us-east-1c")]
    chosen = mount_target_subnets(subnets)
    assert list(chosen) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert chosen["us-east-1a"].id == "subnet-a2"


def test_efs_lifecycle_from_config() -> None:
    assert lifecycle_policies(EfsConfig()) == [{"transition_to_ia": "AFTER_30_DAYS"},
                                               {"transition_to_primary_storage_class": "AFTER_1_ACCESS"}]
    assert lifecycle_policies(EfsConfig(transition_to_ia=None)) == []


def test_lifecycle_aborts_multipart_and_expires_scratch_and_old_versions() -> None:
    rules = lifecycle_rules(BucketConfig(name="ckpt", scratch_prefixes=["tmp/", "scratch/"], scratch_expiry_days=3,
                                         versioning=True, noncurrent_version_expiry_days=9))
    by_id = {rule["id"]: rule for rule in rules}
    assert by_id["abort-incomplete-multipart"]["abort_incomplete_multipart_upload"] == {"days_after_initiation": 7}
    assert by_id["expire-scratch-0"]["filter"] == {"prefix": "tmp/"}
    assert by_id["expire-scratch-1"]["expiration"] == {"days": 3}
    assert by_id["expire-noncurrent-versions"]["noncurrent_version_expiration"] == {"noncurrent_days": 9}
    assert len(lifecycle_rules(BucketConfig(name="plain"))) == 1


def test_tls_policy_denies_insecure_transport_on_bucket_and_objects() -> None:
    statement = json.loads(tls_only_policy("arn:aws:s3:::b"))["Statement"][0]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*" and statement["Action"] == "s3:*"
    assert statement["Resource"] == ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_encryption_rule() -> None:
    assert encryption_rule(BucketConfig(name="a")) == {
        "apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}, "bucket_key_enabled": False}
    key = "arn:aws:kms:us-west-2:111122223333:key/k"
    rule = encryption_rule(BucketConfig(name="a", encryption="aws:kms", kms_key_arn=key))
    assert rule["apply_server_side_encryption_by_default"] == {"sse_algorithm": "aws:kms", "kms_master_key_id": key}
    assert rule["bucket_key_enabled"] is True


def test_default_bucket_name_and_length_limit() -> None:
    ctx = StackContext(project="ml-cluster", stack="dev", prefix="mlc-dev", label_prefix="x", protected=False,
                       region="us-west-2")
    assert default_bucket_name(ctx, "datasets", "111122223333") == "mlc-dev-datasets-111122223333"
    long_ctx = StackContext(project="p", stack="s", prefix="p" * 45, label_prefix="x", protected=False, region=None)
    with pytest.raises(ValueError, match="set bucketName"):
        default_bucket_name(long_ctx, "datasets", "111122223333")


def test_cos_provider_points_at_endpoint_without_aws_checks() -> None:
    args = cos_provider_args(COS)
    assert args["endpoints"] == [{"s3": COS.endpoint}]
    assert args["region"] == "us-south-smart"
    for flag in ("s3_use_path_style", "skip_credentials_validation", "skip_region_validation",
                 "skip_requesting_account_id", "skip_metadata_api_check"):
        assert args[flag] is True


def test_iam_policies_are_scoped_to_stack_resources() -> None:
    trust = json.loads(pod_identity_trust_policy())["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(trust["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    efs = json.loads(efs_driver_policy(FS_ARN))["Statement"]
    # Everything but mounting is AWS's managed AmazonEFSCSIDriverPolicy, statement for statement (moto ships it).
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    managed = json.loads(aws_managed_policies_data)["AmazonEFSCSIDriverPolicy"]["Document"]["Statement"]

    def canon(statement: dict) -> dict:
        actions = statement["Action"]
        return {**statement, "Action": sorted([actions] if isinstance(actions, str) else actions)}

    assert [canon(s) for s in efs[:-1]] == [canon(s) for s in managed]
    for statement in efs[1:-1]:  # create, tag, delete: `*` only under the driver's cluster-tag conditions
        assert "efs.csi.aws.com/cluster" in json.dumps(statement["Condition"])
    assert efs[-1]["Resource"] == FS_ARN and efs[-1]["Sid"] == "Mount"
    s3 = json.loads(mountpoint_driver_policy(["arn:aws:s3:::b2", "arn:aws:s3:::b1"]))["Statement"]
    assert s3[0]["Resource"] == ["arn:aws:s3:::b1", "arn:aws:s3:::b2"]
    assert s3[1] == {"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject"],
                     "Resource": ["arn:aws:s3:::b1/*", "arn:aws:s3:::b2/*"]}


def test_gp3_class_is_encrypted_default_and_waits_for_consumer() -> None:
    manifest = classes.gp3_storage_class(Gp3StorageClassConfig(iops=6000, throughput_mibps=500))
    valid(manifest)
    assert manifest["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert manifest["parameters"]["type"] == "gp3" and manifest["parameters"]["encrypted"] == "true"
    assert manifest["parameters"]["iops"] == "6000" and manifest["parameters"]["throughput"] == "500"
    assert manifest["volumeBindingMode"] == "WaitForFirstConsumer" and manifest["allowVolumeExpansion"] is True
    assert "annotations" not in classes.gp3_storage_class(Gp3StorageClassConfig(default=False))["metadata"]


def test_gp3_class_tags_its_volumes_with_the_stacks_tags() -> None:
    """The EBS CSI driver's tagSpecification_<n> parameters, `key=value` each (aws-ebs-csi-driver docs/tagging.md)."""
    tags = {"stack": "dev", "project": "ml-cluster", "managed-by": "pulumi", "cost-center": "ml research"}
    manifest = classes.gp3_storage_class(Gp3StorageClassConfig(), tags)
    valid(manifest)
    spec = {key: value for key, value in manifest["parameters"].items() if key.startswith("tagSpecification")}
    assert spec == {"tagSpecification_1": "cost-center=ml research", "tagSpecification_2": "managed-by=pulumi",
                    "tagSpecification_3": "project=ml-cluster", "tagSpecification_4": "stack=dev"}
    assert dict(value.split("=", 1) for value in spec.values()) == tags  # as the driver splits them


def test_efs_class_uses_access_points_from_config() -> None:
    config = EfsStorageClassConfig(directory_perms="750", base_path="/jobs/", uid=2000, gid=3000)
    manifest = classes.efs_storage_class(config, "fs-1")
    valid(manifest)
    assert manifest["parameters"] == {
        "provisioningMode": "efs-ap", "fileSystemId": "fs-1", "directoryPerms": "750", "basePath": "/jobs",
        "subPathPattern": "${.PVC.namespace}/${.PVC.name}", "ensureUniqueDirectory": "true",
        "uid": "2000", "gid": "3000",
    }


def test_mountpoint_volume_is_static_read_only_and_bound() -> None:
    volume, claim = classes.mountpoint_volume("s3-datasets", "training", "mlc-dev-s3-datasets", "bkt", "us-west-2")
    valid(volume)
    valid(claim)
    assert volume["spec"]["csi"] == {"driver": "s3.csi.aws.com", "volumeHandle": "mlc-dev-s3-datasets",
                                     "volumeAttributes": {"bucketName": "bkt"}}
    assert volume["spec"]["mountOptions"] == ["read-only", "region us-west-2"]
    assert volume["spec"]["claimRef"] == {"namespace": "training", "name": "s3-datasets"}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == "" and claim["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_cos_flex_claim_is_annotated_for_an_existing_bucket() -> None:
    claim = classes.cos_flex_claim("cos-datasets", "training", "lab-datasets", COS)
    valid(claim)
    assert claim["metadata"]["annotations"] == {
        "ibm.io/bucket": "lab-datasets", "ibm.io/endpoint": COS.endpoint, "ibm.io/region": "us-south-smart",
        "ibm.io/secret-name": "cos-hmac", "ibm.io/secret-namespace": "training",
        "ibm.io/auto-create-bucket": "false", "ibm.io/auto-delete-bucket": "false",
    }
    storage_class = classes.cos_flex_storage_class(COS)
    valid(storage_class)
    assert storage_class["provisioner"] == "ibm.io/ibmc-s3fs"
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]


def test_csi_s3_volume_and_class_reference_the_secret() -> None:
    config = COS.model_copy(update={"driver": "csi-s3"})
    volume, claim = classes.csi_s3_volume("cos-datasets", "training", "lab-datasets", config)
    for manifest in (volume, claim, classes.csi_s3_storage_class(config, "training")):
        valid(manifest)
    assert volume["spec"]["csi"]["nodePublishSecretRef"] == {"name": "cos-hmac", "namespace": "training"}


def test_nfs_class_and_shared_claim_and_secret_are_schema_valid() -> None:
    nfs = classes.nfs_storage_class(NfsConfig(server="10.0.0.5", share="/exports"))
    valid(nfs)
    assert nfs["parameters"] == {"server": "10.0.0.5", "share": "/exports"}
    claim = classes.shared_claim(SharedVolumeConfig(name="ckpt", storage_class="nfs", size="2Ti"), "training")
    valid(claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    valid(classes.secret("cos-hmac", "training", "ibm/ibmc-s3fs", {"access-key": "a", "secret-key": "b"}))
