"""prod's FSx for Lustre as planned offline: the file system, its security group rules, the data repository
associations, the add-on, the static PV/PVC, the multi-node Job that checkpoints to it, protection and cost."""

from __future__ import annotations

from datetime import date
from typing import Any

from infra.plan.cost import estimate
from infra.plan.holdings import price_queries
from infra.plan.prices import fixture_prices
from tests.conftest import resources_of

FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"


def _by_name(plan: dict[str, Any], token: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in resources_of(plan, token)}


def test_prod_file_system_is_persistent_2_in_the_p5_zone_and_protected(stack_plan) -> None:
    plan = stack_plan("prod")
    [fs] = resources_of(plan, FS)
    inputs = fs["inputs"]
    assert (inputs["deploymentType"], inputs["storageCapacity"], inputs["perUnitStorageThroughput"]) == (
        "PERSISTENT_2", 4800, 250)
    assert inputs["metadataConfiguration"] == {"mode": "AUTOMATIC"} and inputs["fileSystemTypeVersion"] == "2.15"
    assert inputs["subnetIds"] == "subnet-0a1b2c3d4e5f60001"  # the first private subnet of us-east-1a
    assert inputs["skipFinalBackup"] is False and inputs["automaticBackupRetentionDays"] == 14
    assert fs["options"]["protect"] is True and fs["options"]["retainOnDelete"] is True
    for dra in resources_of(plan, DRA):
        assert dra["options"]["protect"] is True and dra["inputs"]["deleteDataInFilesystem"] is False


def test_lustre_ports_from_the_nodes_and_itself_only(stack_plan) -> None:
    plan = stack_plan("prod")
    [fs] = resources_of(plan, FS)
    [group] = fs["inputs"]["securityGroupIds"]
    nodes = plan["outputs"]["storage"]["efs"]["nodeSecurityGroupId"]
    for token in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                  "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"):
        rules = {(r["inputs"]["fromPort"], r["inputs"]["toPort"], r["inputs"]["referencedSecurityGroupId"])
                 for r in resources_of(plan, token) if r["inputs"]["securityGroupId"] == group}
        assert rules == {(988, 988, nodes), (1018, 1023, nodes), (988, 988, group), (1018, 1023, group)}


def test_associations_link_datasets_and_checkpoints_with_their_policies(stack_plan) -> None:
    plan = stack_plan("prod")
    by_path = {r["inputs"]["fileSystemPath"]: r["inputs"] for r in resources_of(plan, DRA)}
    assert set(by_path) == {"/datasets", "/checkpoints"}
    assert by_path["/datasets"]["dataRepositoryPath"] == "s3://mlc-prod-datasets-111122223333/"
    assert by_path["/datasets"]["s3"] == {"autoImportPolicy": {"events": ["NEW", "CHANGED", "DELETED"]}}
    assert by_path["/checkpoints"]["s3"]["autoExportPolicy"] == {"events": ["NEW", "CHANGED", "DELETED"]}
    [fs] = resources_of(plan, FS)
    assert {inputs["fileSystemId"] for inputs in by_path.values()} == {plan["outputs"]["storage"]["fsxLustre"][
        "fileSystemId"]} and fs["name"] == "mlc-prod-storage-fsx-fs"


def test_static_volume_the_job_checkpoints_to(stack_plan) -> None:
    plan = stack_plan("prod")
    [addon] = [r for r in resources_of(plan, "aws:eks/addon:Addon") if r["inputs"]["addonName"] == "aws-fsx-csi-driver"]
    volume = _by_name(plan, "kubernetes:core/v1:PersistentVolume")["mlc-prod-storage-pv-fsx-lustre"]
    spec = volume["inputs"]["spec"]
    fsx = plan["outputs"]["storage"]["fsxLustre"]
    assert spec["csi"] == {"driver": "fsx.csi.aws.com", "volumeHandle": fsx["fileSystemId"],
                           "volumeAttributes": {"dnsname": fsx["dnsName"], "mountname": fsx["mountName"]}}
    assert fsx["dnsName"].endswith(".fsx.us-east-1.amazonaws.com") and len(fsx["mountName"]) == 8
    assert spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["us-east-1a"]
    assert spec["persistentVolumeReclaimPolicy"] == "Retain" and volume["options"]["protect"] is True
    claim = _by_name(plan, "kubernetes:core/v1:PersistentVolumeClaim")["mlc-prod-storage-pvc-fsx-lustre"]
    assert claim["inputs"]["metadata"]["namespace"] == "training" and addon["name"] in claim["options"]["dependsOn"]
    job = _by_name(plan, "kubernetes:batch/v1:Job")["mlc-prod-jobs-resnet50-ddp"]
    pod = job["inputs"]["spec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "fsx-lustre"}} in pod["volumes"]
    [trainer] = [c for c in pod["containers"] if any(m["name"] == "checkpoints" for m in c.get("volumeMounts", []))]
    assert "/fsx/checkpoints/resnet50-ddp" in trainer["args"] or "/fsx/checkpoints/resnet50-ddp" in " ".join(
        trainer.get("command", []) + trainer.get("args", []))


def test_the_file_system_is_a_cost_line(stack_plan) -> None:
    plan = stack_plan("prod")
    report = estimate(plan, fixture_prices(price_queries(plan)), "fixture", date(2026, 11, 26))
    [line] = [line for line in report.lines if line.item == "FSx for Lustre"]
    assert line.unit_price == 0.21 and line.unit == "GB-month"
    monthly = line.hourly[0] * 730
    assert abs(monthly - 4800 * 1.073741824 * 0.21) < 0.01  # GiB x GB/GiB x USD/GB-month, about USD 1082
