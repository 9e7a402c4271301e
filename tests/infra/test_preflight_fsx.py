"""preflight's FSx for Lustre rows against the EKS, Service Quotas and FSx request/response shapes (botocore's
Stubber checks both against the service models): the add-on offered for the Kubernetes version, and the Lustre
storage quota against the region's Lustre file systems plus this one."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.stub import Stubber

from infra.account.preflight_fsx import addon_row, quota_rows
from infra.config.fsx import FsxLustreConfig

CONFIG = FsxLustreConfig.model_validate({"storageCapacity": 4800, "availabilityZone": "us-east-1a",
                                         "nodePools": ["gpu-h100"]})
QUOTA = {"ServiceCode": "fsx", "QuotaCode": "L-LUSTRE01", "QuotaName": "Total Lustre storage capacity per Region",
         "Value": 100800.0}  # a made-up code: the row prints whatever the answer names


def _client(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def _system(gib: int, tags: dict[str, str] | None = None, kind: str = "LUSTRE") -> dict[str, Any]:
    system: dict[str, Any] = {"FileSystemId": f"fs-{gib:017d}", "FileSystemType": kind, "StorageCapacity": gib}
    if tags:  # the model wants at least one tag where Tags is present
        system["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
    return system


def _quota_rows(quotas_answer: list[dict[str, Any]], systems: list[dict[str, Any]]) -> list[Any]:
    quotas, fsx = _client("service-quotas"), _client("fsx")
    with Stubber(quotas) as quota_stub, Stubber(fsx) as fsx_stub:
        quota_stub.add_response("list_service_quotas", {"Quotas": quotas_answer}, {"ServiceCode": "fsx"})
        fsx_stub.add_response("describe_file_systems", {"FileSystems": systems}, {})
        return quota_rows(quotas, fsx, CONFIG, "prod", "us-east-1")


def test_the_add_on_offered_for_the_version_passes_and_names_its_default() -> None:
    eks = _client("eks")
    with Stubber(eks) as stub:
        stub.add_response("describe_addon_versions", {"addons": [{"addonName": "aws-fsx-csi-driver", "addonVersions": [
            {"addonVersion": "v1.8.0-eksbuild.1", "compatibilities": [{"clusterVersion": "1.35",
                                                                       "defaultVersion": True}]},
            {"addonVersion": "v1.7.0-eksbuild.1", "compatibilities": [{"clusterVersion": "1.35",
                                                                       "defaultVersion": False}]}]}]},
            {"addonName": "aws-fsx-csi-driver", "kubernetesVersion": "1.35"})
        stub.add_response("describe_addon_versions", {"addons": []},
                          {"addonName": "aws-fsx-csi-driver", "kubernetesVersion": "1.99"})
        assert addon_row(eks, "1.35") == ("PASS", "add-on aws-fsx-csi-driver",
                                          "2 version(s) for Kubernetes 1.35, default v1.8.0-eksbuild.1", "")
        status, _, detail, fix = addon_row(eks, "1.99")
    assert (status, detail) == ("FAIL", "not offered for Kubernetes 1.99") and "describe-addon-versions" in fix


def test_the_quota_holds_the_regions_lustre_plus_this_file_system() -> None:
    rows = _quota_rows([QUOTA, {**QUOTA, "QuotaCode": "L-OTHER", "QuotaName": "Backups per file system"}],
                       [_system(96000), _system(2400, kind="OPENZFS")])
    # 96000 + 4800 = 100800: exactly the quota, so it passes (the backups quota is not a storage one)
    assert rows == [("PASS", "quota L-LUSTRE01", "Total Lustre storage capacity per Region: 100800 GiB; the region's "
                     "Lustre file systems hold 96000 GiB, this stack adds 4800",
                     "aws service-quotas request-service-quota-increase --region us-east-1 --service-code fsx "
                     "--quota-code L-LUSTRE01 --desired-value 100800")]
    # one more file system of 1200 GiB does not fit
    over = _quota_rows([QUOTA], [_system(96000), _system(1200)])
    assert over[0][0] == "FAIL" and over[0][3].endswith("--desired-value 102000")


def test_the_stacks_own_file_system_is_not_counted_twice_and_no_quota_is_a_warning() -> None:
    ours = _quota_rows([QUOTA], [_system(100800, {"project": "ml-cluster", "stack": "prod"})])
    assert ours[0][0] == "PASS" and "this stack adds" not in ours[0][2]
    assert _quota_rows([], [])[0][:2] == ("WARN", "quota fsx lustre storage")
