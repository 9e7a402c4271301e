"""The ProvisioningRequest CRD prod applies for Kueue's admission check comes from the repository, not from the
network at `pulumi up`: the ConfigFile names a vendored file (byte-identical to cluster-autoscaler-1.35.2's), the
CRD validates strictly for the cluster's Kubernetes, and a ProvisioningRequest of the shape Kueue creates validates
against it."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from infra.config.queueing import PROVISIONING_CHECK
from infra.nodes.scaling.autoscaler import PROVISIONING_REQUEST_CRD
from tests.monitoring.crds import render_charts

ROOT = Path(__file__).resolve().parents[2]  # the directory of Pulumi.yaml: Pulumi runs the program there
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
# git's blob id of cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml at
# kubernetes/autoscaler tag cluster-autoscaler-1.35.2 (`git rev-parse cluster-autoscaler-1.35.2:<path>`).
UPSTREAM_BLOB = "63666dce092842c9dd79288b55e33dee13411fb7"


@functools.cache
def crd() -> dict[str, Any]:
    [document] = list(yaml.safe_load_all((ROOT / PROVISIONING_REQUEST_CRD).read_text()))
    return document


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_prod_applies_the_crd_from_a_file_of_the_project(stack_plan: Any) -> None:
    plan = stack_plan("prod")
    [config_file] = [r for r in plan["resources"] if r["type"] == CONFIG_FILE]
    assert config_file["name"] == "mlc-prod-gpu-provisioningrequest-crd"
    file = config_file["inputs"]["file"]
    assert "://" not in file and not Path(file).is_absolute()
    assert (ROOT / file).is_file() and (ROOT / "Pulumi.yaml").is_file()
    assert git_blob_id((ROOT / file).read_bytes()) == UPSTREAM_BLOB  # vendored unchanged


def test_the_vendored_crd_is_valid_and_validates_what_kueue_asks_for() -> None:
    document = crd()
    assert document["kind"] == "CustomResourceDefinition"
    assert document["metadata"]["name"] == "provisioningrequests.autoscaling.x-k8s.io"
    kubernetes_validate.validate(document, "1.35", strict=True)  # prod's Kubernetes
    schemas = render_charts().crd_schemas(document)
    assert set(schemas) == {("autoscaling.x-k8s.io/v1", "ProvisioningRequest"),
                            ("autoscaling.x-k8s.io/v1beta1", "ProvisioningRequest")}
    request = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
               "metadata": {"name": f"job-ddp-{PROVISIONING_CHECK}-1", "namespace": "training"},
               "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                        "podSets": [{"count": 2, "podTemplateRef": {"name": "ppt-job-ddp-main"}}],
                        "parameters": {"ValidUntilSeconds": "600"}}}
    assert render_charts().validate_custom(request, schemas) == []
    no_count = {**request, "spec": {**request["spec"], "podSets": [{"podTemplateRef": {"name": "x"}}]}}
    assert render_charts().validate_custom(no_count, schemas)
