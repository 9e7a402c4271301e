"""Config rules that come from upstream behaviour: add-on version strings, Pod Identity minimums,
IAM principals for access entries, Bottlerocket RAID0 without instance store, the autoscaler's GPU label."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.config.cluster import AccessEntryConfig
from infra.config.errors import ConfigError
from infra.config.storage import CosConfig, StorageConfig
from infra.nodes.poolplan import plan_node_pools
from infra.nodes.scaling.template import ACCELERATOR_LABEL, accelerator_label_value
from infra.storage.drivers import IBM_COS_CHART, ibm_cos_values
from scripts.render_charts import rendered_objects
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool

UPSTREAM = Path(__file__).parent / "upstream"


@pytest.mark.parametrize("version", ["v2.0.0-eksbuild.1", "v2.6.0-eksbuild.3"])
def test_addon_versions_take_eks_build_strings(version: str) -> None:
    config = StorageConfig.model_validate({"addonVersions": {"aws-mountpoint-s3-csi-driver": version}})
    assert config.addon_versions == {"aws-mountpoint-s3-csi-driver": version}


@pytest.mark.parametrize("version", ["2.0.0", "v2.0.0", "v2.0-eksbuild.1", "latest", "v2.0.0-eksbuild."])
def test_addon_versions_reject_what_eks_does_not_list(version: str) -> None:
    with pytest.raises(ValidationError, match="eksbuild"):
        StorageConfig.model_validate({"addonVersions": {"aws-efs-csi-driver": version}})


def test_mountpoint_below_v2_cannot_use_pod_identity() -> None:
    with pytest.raises(ValidationError, match="Pod Identity needs driver v2.0.0"):
        StorageConfig.model_validate({"addonVersions": {"aws-mountpoint-s3-csi-driver": "v1.15.0-eksbuild.1"}})


@pytest.mark.parametrize("arn", ["arn:aws:iam::111122223333:role/admins", "arn:aws:iam::111122223333:user/ci",
                                 "arn:aws:iam::111122223333:role/path/to/role"])
def test_access_entries_take_iam_principals(arn: str) -> None:
    assert AccessEntryConfig.model_validate({"principalArn": arn}).principal_arn == arn


@pytest.mark.parametrize("arn", ["arn:aws:sts::111122223333:assumed-role/admins/session-1",
                                 "arn:aws:iam::111122223333:assumed-role/admins/s"])
def test_access_entries_reject_sts_sessions(arn: str) -> None:
    with pytest.raises(ValidationError):
        AccessEntryConfig.model_validate({"principalArn": arn})


def test_bottlerocket_raid0_without_instance_store_is_a_config_error() -> None:
    pool = {"name": "br", "instanceTypes": ["m6i.large"], "amiFamily": "bottlerocket",
            "localStorage": {"mode": "raid0", "gib": 100}}
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(eks_config([pool]), fixture_lookup)
    assert "would not boot" in str(caught.value) and "localStorage.mode" in str(caught.value)


def test_al2023_raid0_with_size_still_plans() -> None:
    pool = {"name": "cpu", "instanceTypes": ["m6i.large"], "localStorage": {"mode": "raid0", "gib": 100}}
    [plan] = plan_node_pools(eks_config([pool]), fixture_lookup)
    assert plan.nvme_gib == 100


def test_gpu_pools_carry_the_autoscaler_gpu_label_and_cpu_pools_do_not() -> None:
    gpu, cpu = plan_node_pools(eks_config([gpu_pool("a10g", ["g5.xlarge"]),
                                           {"name": "cpu", "instanceTypes": ["m6i.large"]}]), fixture_lookup)
    assert gpu.labels[ACCELERATOR_LABEL] == "nvidia-a10g" and ACCELERATOR_LABEL not in cpu.labels


def test_accelerator_values_are_the_autoscalers_spelling() -> None:
    assert [accelerator_label_value(t) for t in ("a10g", "a100", "v100", "t4", "h100", "h200", "l40s")] == \
        ["nvidia-a10g", "nvidia-tesla-a100", "nvidia-tesla-v100", "nvidia-tesla-t4", "nvidia-h100", "nvidia-h200",
         "nvidia-l40s"]


@pytest.mark.parametrize(("worker_os", "daemonsets"), [("debian", ["ibmcloud-object-storage-driver"]),
                                                         ("redhat", ["ibmcloud-object-storage-driver",
                                                                     "ibmcloud-object-storage-driver-coreos"])])
def test_ibm_values_render_public_images_and_the_kubelets_flex_directory(worker_os: str,
                                                                         daemonsets: list[str]) -> None:
    cos = CosConfig.model_validate({"endpoint": "https://s3.example.com", "workerOs": worker_os})
    values = ibm_cos_values(cos)
    assert values["platform"] == "K8S" and values["workerOS"] == worker_os and values["provider"] == "IPI"
    assert values["cos"] == {"endpoint": "https://s3.example.com", "storageClass": "us-south-smart"}
    release = {"name": "cos", "inputs": {"chart": IBM_COS_CHART.chart, "version": IBM_COS_CHART.version,
                                         "values": values, "name": "cos", "namespace": "kube-system"}}
    rendered = rendered_objects(release, UPSTREAM)
    images = [c["image"] for d in rendered for c in d.get("spec", {}).get("template", {}).get("spec", {})
              .get("containers", []) if d["kind"] in ("DaemonSet", "Deployment") and "object-storage" in c["image"]]
    assert images and all(image.startswith("icr.io/cpopen/") for image in images), images
    assert sorted(d["metadata"]["name"] for d in rendered if d["kind"] == "DaemonSet") == daemonsets
    [driver] = [d for d in rendered if d["kind"] == "DaemonSet" and d["metadata"]["name"] == daemonsets[0]]
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in driver["spec"]["template"]["spec"]["volumes"]}
    assert paths["kube-driver"] == "/usr/libexec/kubernetes"
    assert {"operator": "Exists"} in driver["spec"]["template"]["spec"]["tolerations"]
    assert not [d for d in rendered if d["kind"] == "SecurityContextConstraints"]
    classes = {d["metadata"]["name"]: d["parameters"] for d in rendered if d["kind"] == "StorageClass"}
    assert classes["ibmc-s3fs-cos"]["ibm.io/object-store-endpoint"] == "https://s3.example.com"
