"""Preflight rows for a stack's FSx for Lustre file system, asked of the account before `pulumi up`: the FSx CSI
add-on is offered for the cluster's Kubernetes version (EKS DescribeAddonVersions), and the account's Lustre storage
quota holds the Lustre file systems it already has in the region plus this one (Service Quotas ListServiceQuotas,
FSx DescribeFileSystems). Read-only calls. Rows are (status, name, detail, fix) tuples; infra.account.preflight
makes them its Check rows.

What no API answers, so no row claims it: whether the file system's availability zone offers PERSISTENT_2 (FSx has
no offerings call; a zone without it fails CreateFileSystem). The quota is found by its name (a Service Quotas
entry of service code `fsx` whose name mentions Lustre and storage capacity), not by a quota code, because the codes
could not be checked from here: a row says which quota it read, or that it found none.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from infra.config.addons import FSX_CSI_DRIVER
from infra.config.fsx import FsxLustreConfig

Row = tuple[str, str, str, str]  # status, name, detail, fix
_ERRORS = (BotoCoreError, ClientError, ResponseParserError)


def _why(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        return f"{error.get('Code') or 'error'}: {error.get('Message') or exc}"
    return f"{type(exc).__name__}: {exc}"


def addon_row(eks: Any, kubernetes_version: str) -> Row:
    """The FSx CSI add-on has a version for the cluster's Kubernetes minor."""
    name = f"add-on {FSX_CSI_DRIVER}"
    try:
        addons = eks.describe_addon_versions(addonName=FSX_CSI_DRIVER,
                                             kubernetesVersion=kubernetes_version).get("addons") or []
    except _ERRORS as exc:
        return ("WARN", name, f"eks:DescribeAddonVersions failed: {_why(exc)}", "grant eks:DescribeAddonVersions")
    versions = [item for addon in addons for item in addon.get("addonVersions") or []]
    if not versions:
        return ("FAIL", name, f"not offered for Kubernetes {kubernetes_version}",
                "pick a kubernetesVersion the add-on supports (aws eks describe-addon-versions --addon-name "
                f"{FSX_CSI_DRIVER})")
    default = next((item.get("addonVersion") for item in versions
                    if any(c.get("defaultVersion") for c in item.get("compatibilities") or [])), None)
    return ("PASS", name, f"{len(versions)} version(s) for Kubernetes {kubernetes_version}"
            + (f", default {default}" if default else ""), "")


def _lustre_storage_quotas(quotas: Any) -> list[dict[str, Any]]:
    found = []
    for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode="fsx"):
        for quota in page.get("Quotas") or []:
            title = str(quota.get("QuotaName") or "").lower()
            if "lustre" in title and "storage capacity" in title:
                found.append(quota)
    return found


def _lustre_gib_in_region(fsx: Any, stack: str) -> tuple[int, bool]:
    """GiB of the region's Lustre file systems, and whether one of them is this stack's already (tagged stack=)."""
    total, ours = 0, False
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for system in page.get("FileSystems") or []:
            if system.get("FileSystemType") != "LUSTRE":
                continue
            total += int(system.get("StorageCapacity") or 0)
            tags = {tag.get("Key"): tag.get("Value") for tag in system.get("Tags") or []}
            ours = ours or (tags.get("stack") == stack and tags.get("project") == "ml-cluster")
    return total, ours


def quota_rows(quotas: Any, fsx: Any, config: FsxLustreConfig, stack: str, region: str) -> list[Row]:
    """Each Lustre storage-capacity quota against the region's Lustre GiB plus this file system (unless it exists)."""
    try:
        found = _lustre_storage_quotas(quotas)
        existing, ours = _lustre_gib_in_region(fsx, stack)
    except _ERRORS as exc:
        return [("WARN", "quota fsx lustre storage", f"cannot read: {_why(exc)}",
                 "grant servicequotas:ListServiceQuotas and fsx:DescribeFileSystems")]
    if not found:
        return [("WARN", "quota fsx lustre storage", "no Service Quotas entry of service code fsx names Lustre "
                 "storage capacity", "check FSx for Lustre's storage quota in the Service Quotas console")]
    needed = existing + (0 if ours else config.storage_capacity)
    rows: list[Row] = []
    for quota in found:
        value = int(float(quota.get("Value") or 0))
        detail = (f"{quota.get('QuotaName')}: {value} GiB; the region's Lustre file systems hold {existing} GiB"
                  + ("" if ours else f", this stack adds {config.storage_capacity}"))
        fix = (f"aws service-quotas request-service-quota-increase --region {region} --service-code fsx "
               f"--quota-code {quota.get('QuotaCode')} --desired-value {needed}")
        rows.append(("FAIL" if needed > value else "PASS", f"quota {quota.get('QuotaCode')}", detail, fix))
    return rows


def fsx_rows(eks: Any, quotas: Any, fsx: Any, config: FsxLustreConfig, kubernetes_version: str, stack: str,
             region: str) -> list[Row]:
    return [addon_row(eks, kubernetes_version), *quota_rows(quotas, fsx, config, stack, region)]
