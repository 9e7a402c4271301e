"""The storage rules, checked on the offline plan of every committed stack (the real program, mock engine)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.plan.engine import OFFLINE_SECRET, SECRET_MARK, offline_id, validate_kubernetes_objects
from tests.conftest import AWS_STACKS, resources_of, stack_values

ADDONS = {"aws-efs-csi-driver", "aws-ebs-csi-driver", "aws-mountpoint-s3-csi-driver", "eks-pod-identity-agent"}


def storage_resources(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if "-storage-" in r["name"]]


def one(plan: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [r for r in plan["resources"] if r["name"] == name]
    assert len(matches) == 1, name
    return matches[0]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_one_mount_target_per_distinct_zone_of_the_node_subnets(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    zone_of = plan["outputs"]["subnetAzs"]
    targets = resources_of(plan, "aws:efs/mountTarget:MountTarget")
    target_zones = [zone_of[t["inputs"]["subnetId"]] for t in targets]
    assert sorted(target_zones) == sorted(set(zone_of.values()))


def test_prod_vpc_has_two_subnets_in_one_zone_and_still_one_target_there(stack_plan) -> None:
    zone_of = stack_plan("prod")["outputs"]["subnetAzs"]
    zones = list(zone_of.values())
    assert any(zones.count(zone) > 1 for zone in zones)  # the case the seed's per-subnet loop broke on


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_nfs_is_admitted_only_from_the_node_security_group(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    rules = [r for r in storage_resources(plan) if r["type"].startswith("aws:vpc/securityGroupIngressRule")
             and "-efs-" in r["name"]]  # FSx for Lustre's rules: tests/storage/test_fsx_plan.py
    assert len(rules) == 1
    rule = rules[0]["inputs"]
    assert (rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 2049, 2049)
    assert rule["referencedSecurityGroupId"] == plan["outputs"]["nodeSecurityGroupId"]
    assert "cidrIpv4" not in rule and "cidrIpv6" not in rule
    for target in resources_of(plan, "aws:efs/mountTarget:MountTarget"):
        assert target["inputs"]["securityGroups"] == [rule["securityGroupId"]]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_file_system_is_encrypted_elastic_with_lifecycle(stack_plan, stack: str) -> None:
    [fs] = resources_of(stack_plan(stack), "aws:efs/fileSystem:FileSystem")
    assert fs["inputs"]["encrypted"] is True
    assert fs["inputs"]["throughputMode"] == "elastic"
    assert {"transitionToPrimaryStorageClass": "AFTER_1_ACCESS"} in fs["inputs"]["lifecyclePolicies"]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_file_system_refuses_clients_without_tls(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    [fs] = resources_of(plan, "aws:efs/fileSystem:FileSystem")
    [policy] = resources_of(plan, "aws:efs/fileSystemPolicy:FileSystemPolicy")
    assert policy["inputs"]["fileSystemId"] == offline_id(fs["type"], fs["name"])
    statements = json.loads(policy["inputs"]["policy"])["Statement"]
    [deny] = [st for st in statements if st["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and deny["Action"] == "*"
    [allow] = [st for st in statements if st["Effect"] == "Allow"]
    assert allow["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_bucket_is_encrypted_private_owner_enforced_and_tls_only(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    buckets = resources_of(plan, "aws:s3/bucket:Bucket")
    assert buckets
    for bucket in buckets:
        name = bucket["name"]
        sse = one(plan, f"{name}-sse")["inputs"]["rules"][0]["applyServerSideEncryptionByDefault"]
        assert sse["sseAlgorithm"] in ("AES256", "aws:kms")
        block = one(plan, f"{name}-public-access-block")["inputs"]
        assert all(block[key] is True for key in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                  "restrictPublicBuckets"))
        ownership = one(plan, f"{name}-ownership")["inputs"]["rule"]
        assert ownership == {"objectOwnership": "BucketOwnerEnforced"}
        policy_resource = one(plan, f"{name}-tls-only")
        [statement] = json.loads(policy_resource["inputs"]["policy"])["Statement"]
        assert statement["Effect"] == "Deny"
        assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert statement["Resource"] == [f"arn:aws:s3:::{bucket['inputs']['bucket']}",
                                         f"arn:aws:s3:::{bucket['inputs']['bucket']}/*"]
        assert f"{name}-public-access-block" in policy_resource["options"]["dependsOn"]
        lifecycle = one(plan, f"{name}-lifecycle")["inputs"]["rules"]
        assert any("abortIncompleteMultipartUpload" in rule for rule in lifecycle)
        bucket_ids = {one(plan, f"{name}{suffix}")["inputs"]["bucket"]
                      for suffix in ("-sse", "-public-access-block", "-ownership", "-tls-only", "-lifecycle")}
        assert len(bucket_ids) == 1  # all settings apply to this bucket


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_addons_with_pod_identity_scoped_to_the_stack(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    addons = {r["inputs"]["addonName"]: r for r in resources_of(plan, "aws:eks/addon:Addon")}
    assert set(addons) >= ADDONS
    associations = {r["inputs"]["serviceAccount"]: r
                    for r in resources_of(plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                    if "-storage-" in r["name"]}
    expected_accounts = {"efs-csi-controller-sa", "efs-csi-node-sa", "ebs-csi-controller-sa", "s3-csi-driver-sa"}
    assert expected_accounts <= set(associations)
    assert all(a["inputs"]["namespace"] == "kube-system" for a in associations.values())
    # each driver add-on waits for its role association and the Pod Identity agent
    for addon_name, account in (("aws-efs-csi-driver", "efs-csi-controller-sa"),
                                ("aws-ebs-csi-driver", "ebs-csi-controller-sa"),
                                ("aws-mountpoint-s3-csi-driver", "s3-csi-driver-sa")):
        needs = addons[addon_name]["options"]["dependsOn"]
        assert associations[account]["name"] in needs
        assert addons["eks-pod-identity-agent"]["name"] in needs
    mounted = [b["inputs"]["bucket"] for b in resources_of(plan, "aws:s3/bucket:Bucket")
               if b["name"].endswith("-datasets")]
    s3_policy = json.loads(one(plan, f"mlc-{stack}-storage-mountpoint-s3-csi-policy-0")["inputs"]["policy"])
    assert s3_policy["Statement"][0]["Resource"] == [f"arn:aws:s3:::{name}" for name in mounted]
    efs_policy = json.loads(one(plan, f"mlc-{stack}-storage-efs-csi-policy-0")["inputs"]["policy"])
    [efs_class] = [r for r in resources_of(plan, "kubernetes:storage.k8s.io/v1:StorageClass")
                   if r["inputs"]["provisioner"] == "efs.csi.aws.com"]
    file_system_id = efs_class["inputs"]["parameters"]["fileSystemId"]
    scoped = [s["Resource"] for s in efs_policy["Statement"] if s["Resource"] != "*"]
    assert {arn.rsplit(":", 1)[1] for arn in scoped} == {f"file-system/{file_system_id}"}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_storage_classes_and_claims_exist_and_claims_wait_for_drivers(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    storage = stack_values(stack)["ml-cluster:storage"]
    classes = {r["inputs"]["metadata"]["name"]: r
               for r in resources_of(plan, "kubernetes:storage.k8s.io/v1:StorageClass")}
    assert {"gp3", "efs-ap"} <= set(classes)
    assert classes["efs-ap"]["inputs"]["parameters"]["provisioningMode"] == "efs-ap"
    assert classes["efs-ap"]["inputs"]["parameters"]["fileSystemId"]
    assert classes["gp3"]["inputs"]["volumeBindingMode"] == "WaitForFirstConsumer"
    driver_of = {"efs-ap": f"mlc-{stack}-storage-aws-efs-csi-driver",
                 "": f"mlc-{stack}-storage-aws-mountpoint-s3-csi-driver"}
    fsx_claims = [storage["fsxLustre"].get("claimName", "fsx-lustre")] if "fsxLustre" in storage else []
    claims = [r for r in resources_of(plan, "kubernetes:core/v1:PersistentVolumeClaim") if "-storage-" in r["name"]]
    assert len(claims) == (len(storage.get("sharedVolumes", [])) + sum(bool(b.get("mount")) for b in storage["buckets"])
                           + len(fsx_claims))
    for claim in claims:
        driver = (f"mlc-{stack}-storage-aws-fsx-csi-driver" if claim["inputs"]["metadata"]["name"] in fsx_claims
                  else driver_of[claim["inputs"]["spec"]["storageClassName"]])
        assert driver in claim["options"]["dependsOn"], claim["name"]
    volumes = [r for r in resources_of(plan, "kubernetes:core/v1:PersistentVolume") if "-storage-" in r["name"]
               and r["inputs"]["spec"]["csi"]["driver"] != "fsx.csi.aws.com"]  # FSx: tests/storage/test_fsx_plan.py
    handles = [v["inputs"]["spec"]["csi"]["volumeHandle"] for v in volumes]
    assert len(handles) == len(set(handles))
    for volume in volumes:
        assert volume["inputs"]["spec"]["csi"]["driver"] == "s3.csi.aws.com"
        assert "read-only" in volume["inputs"]["spec"]["mountOptions"]


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "onprem"])
def test_storage_kubernetes_objects_are_schema_valid(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    version = plan["outputs"]["kubernetesVersion"]
    subset = {"resources": storage_resources(plan)}
    assert any(r["type"].startswith("kubernetes:") for r in subset["resources"])
    assert validate_kubernetes_objects(subset, version) == []


def test_prod_file_system_and_buckets_are_protected_and_retained(stack_plan) -> None:
    plan = stack_plan("prod")
    stateful = resources_of(plan, "aws:efs/fileSystem:FileSystem") + resources_of(plan, "aws:s3/bucket:Bucket")
    assert len(stateful) == 4
    for resource in stateful:
        assert resource["options"]["protect"] is True and resource["options"]["retainOnDelete"] is True
    for bucket in resources_of(plan, "aws:s3/bucket:Bucket"):
        assert bucket["inputs"]["forceDestroy"] is False


@pytest.mark.parametrize("stack", ["dev", "staging", "onprem"])
def test_unprotected_stacks_destroy_everything(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    for resource in storage_resources(plan):
        assert resource["options"]["protect"] is False and resource["options"]["retainOnDelete"] is False
    for bucket in resources_of(plan, "aws:s3/bucket:Bucket"):
        assert bucket["inputs"]["forceDestroy"] is True


def test_onprem_cos_buckets_flex_driver_and_annotated_claims(stack_plan) -> None:
    plan = stack_plan("onprem")
    [provider] = [r for r in storage_resources(plan) if r["type"] == "pulumi:providers:aws"]
    assert provider["inputs"]["accessKey"] == SECRET_MARK and provider["inputs"]["secretKey"] == SECRET_MARK
    assert "cloud-object-storage" in provider["inputs"]["endpoints"]
    buckets = resources_of(plan, "aws:s3/bucket:Bucket")
    assert buckets and all(b["provider"] == provider["name"] for b in buckets)
    assert not resources_of(plan, "aws:s3/bucketPolicy:BucketPolicy")  # COS has no bucket policies
    [release] = [r for r in resources_of(plan, "kubernetes:helm.sh/v3:Release")
                 if r["inputs"]["chart"] == "ibm-object-storage-plugin"]
    assert release["inputs"]["version"] and release["inputs"]["repositoryOpts"]["repo"].startswith("https://")
    [driver_secret] = [r for r in resources_of(plan, "kubernetes:core/v1:Secret")
                       if r["inputs"]["type"] == "ibm/ibmc-s3fs"]
    claim = one(plan, "mlc-onprem-storage-pvc-cos-datasets")
    annotations = claim["inputs"]["metadata"]["annotations"]
    assert annotations["ibm.io/bucket"] == "ml-lab-a100-datasets"
    assert annotations["ibm.io/secret-name"] == driver_secret["inputs"]["metadata"]["name"]
    assert annotations["ibm.io/auto-create-bucket"] == annotations["ibm.io/auto-delete-bucket"] == "false"
    assert {"ibm.io/endpoint", "ibm.io/region"} <= set(annotations)
    assert release["name"] in claim["options"]["dependsOn"]
    assert not resources_of(plan, "aws:eks/addon:Addon")


@pytest.mark.parametrize("stack", ["onprem", "dev"])
def test_no_secret_in_plaintext(stack_plan, stack: str) -> None:
    text = json.dumps(stack_plan(stack))
    assert OFFLINE_SECRET not in text
    for secret in resources_of(stack_plan(stack), "kubernetes:core/v1:Secret"):
        assert secret["inputs"]["stringData"] == SECRET_MARK or all(
            value == SECRET_MARK for value in secret["inputs"]["stringData"].values())


def test_onprem_csi_s3_driver_alternative(plan_config) -> None:
    storage = stack_values("onprem")["ml-cluster:storage"]
    storage["cos"]["driver"] = "csi-s3"
    plan = plan_config("onprem", {"ml-cluster:storage": storage})
    releases = {r["inputs"]["chart"] for r in resources_of(plan, "kubernetes:helm.sh/v3:Release")}
    assert "csi-s3" in releases and "ibm-object-storage-plugin" not in releases
    [volume] = [r for r in resources_of(plan, "kubernetes:core/v1:PersistentVolume") if "-storage-" in r["name"]]
    assert volume["inputs"]["spec"]["csi"]["driver"] == "ru.yandex.s3.csi"
    assert validate_kubernetes_objects({"resources": storage_resources(plan)}, "1.31") == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_storage_output_gives_verify_stack_what_it_checks(stack_plan, stack: str) -> None:
    plan = stack_plan(stack)
    outputs = plan["outputs"]
    efs = outputs["storage"]["efs"]
    assert efs["subnetIds"] == outputs["privateSubnetIds"]
    assert efs["nodeSecurityGroupId"] == outputs["nodeSecurityGroupId"]
    [rule] = [r for r in storage_resources(plan) if r["type"].startswith("aws:vpc/securityGroupIngressRule")
              and "-efs-" in r["name"]]
    assert efs["securityGroupId"] == rule["inputs"]["securityGroupId"]
    [fs_class] = [r for r in resources_of(plan, "kubernetes:storage.k8s.io/v1:StorageClass")
                  if r["inputs"]["provisioner"] == "efs.csi.aws.com"]
    assert efs["fileSystemId"] == fs_class["inputs"]["parameters"]["fileSystemId"]
    assert sorted(outputs["storage"]["buckets"].values()) == sorted(
        b["inputs"]["bucket"] for b in resources_of(plan, "aws:s3/bucket:Bucket"))
