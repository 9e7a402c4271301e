"""verify_stack's FSx for Lustre rows against the FSx and EKS APIs' own request and response shapes (botocore's
Stubber validates both against the service models): the file system AVAILABLE at the PV's DNS name, each data
repository association AVAILABLE, the CSI add-on ACTIVE, and the static claims Bound."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

import boto3
from botocore.stub import Stubber

from infra.storage.verify import check_claims_bound, check_fsx

FS = "fs-0123456789abcdef0"
OUTPUTS = {"fileSystemId": FS, "dnsName": f"{FS}.fsx.us-east-1.amazonaws.com", "mountName": "abcdefgh",
           "associations": ["/checkpoints", "/datasets"],
           "claims": [{"namespace": "training", "name": "fsx-lustre"}]}


def _system(lifecycle: str = "AVAILABLE", dns: str = OUTPUTS["dnsName"]) -> dict[str, Any]:
    return {"FileSystemId": FS, "FileSystemType": "LUSTRE", "Lifecycle": lifecycle, "StorageCapacity": 4800,
            "DNSName": dns, "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "MountName": "abcdefgh"}}


def _association(path: str, lifecycle: str = "AVAILABLE", failure: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"AssociationId": f"dra-0123456789abcdef{len(path)}", "FileSystemId": FS,
                            "Lifecycle": lifecycle, "FileSystemPath": path,
                            "DataRepositoryPath": f"s3://mlc-prod{path}-111122223333/",
                            "CreationTime": datetime(2026, 11, 26)}
    if failure:
        item["FailureDetails"] = {"Message": failure}
    return item


def _run(system: dict[str, Any], associations: list[dict[str, Any]], addon_status: str = "ACTIVE") -> list[Any]:
    fsx = boto3.client("fsx", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    eks = boto3.client("eks", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(fsx) as fsx_stub, Stubber(eks) as eks_stub:
        fsx_stub.add_response("describe_file_systems", {"FileSystems": [system]}, {"FileSystemIds": [FS]})
        fsx_stub.add_response("describe_data_repository_associations", {"Associations": associations},
                              {"Filters": [{"Name": "file-system-id", "Values": [FS]}]})
        eks_stub.add_response("describe_addon", {"addon": {"addonName": "aws-fsx-csi-driver", "status": addon_status,
                                                           "addonVersion": "v1.8.0-eksbuild.1"}},
                              {"clusterName": "ml-prod", "addonName": "aws-fsx-csi-driver"})
        checks = check_fsx(fsx, eks, OUTPUTS, "ml-prod")
        fsx_stub.assert_no_pending_responses()
    return checks


def test_a_healthy_file_system_passes_every_row() -> None:
    checks = _run(_system(), [_association("/datasets"), _association("/checkpoints")])
    assert [(c.name, c.status) for c in checks] == [
        (f"fsx {FS}", "PASS"), ("fsx dra /checkpoints", "PASS"), ("fsx dra /datasets", "PASS"),
        ("addon aws-fsx-csi-driver", "PASS")]
    assert checks[0].detail == "AVAILABLE, 4800 GiB PERSISTENT_2"


def test_a_misconfigured_association_a_missing_one_and_a_degraded_add_on_fail() -> None:
    checks = _run(_system(), [_association("/checkpoints", "MISCONFIGURED", "bucket policy denies FSx")],
                  addon_status="DEGRADED")
    by_name = {c.name: c for c in checks}
    assert by_name["fsx dra /checkpoints"].status == "FAIL"
    assert "MISCONFIGURED" in by_name["fsx dra /checkpoints"].detail and "denies FSx" in by_name[
        "fsx dra /checkpoints"].detail
    assert by_name["fsx dra /datasets"].detail == "no data repository association at /datasets"
    assert by_name["addon aws-fsx-csi-driver"].status == "FAIL"


def test_a_file_system_still_creating_or_at_another_name_fails() -> None:
    checks = _run(_system("CREATING", "fs-other.fsx.us-east-1.amazonaws.com"), [])
    assert checks[0].status == "FAIL"
    assert checks[0].detail == (f"lifecycle CREATING; DNS name fs-other.fsx.us-east-1.amazonaws.com, the PV mounts "
                                f"{OUTPUTS['dnsName']}")


def test_static_claims_must_be_bound() -> None:
    phases = {("training", "fsx-lustre"): "Bound", ("team-a", "fsx-lustre"): "Pending"}
    core = SimpleNamespace(read_namespaced_persistent_volume_claim=lambda name, namespace: SimpleNamespace(
        status=SimpleNamespace(phase=phases[(namespace, name)])))
    checks = check_claims_bound(core, [("training", "fsx-lustre"), ("team-a", "fsx-lustre")])
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("pvc training/fsx-lustre", "PASS", "Bound"), ("pvc team-a/fsx-lustre", "FAIL", "Pending")]
