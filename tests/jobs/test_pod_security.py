"""Pod Security `restricted`, least privilege and a read-only root: on rendered pods, and on the real trainer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.facts import dev_facts, prod_facts
from tests.jobs.jobrules import validate_strict
from tests.jobs.pss import restricted_violations
from workloads.jobspec import TMP_DIR, EgressRules, namespace_network_policies, parse_spec, render_job

REPO = Path(__file__).resolve().parents[2]
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
S3_COPY = {"uri": "s3://mlc-dev-datasets/imagenet/", "staging": "copy", "stagedSize": "20Gi"}


def _pod(**fields: Any) -> dict[str, Any]:
    spec = parse_spec({"name": "resnet", "image": IMAGE, "gpus": 1, "dataset": S3_COPY, **fields})
    return render_job(spec, dev_facts())[0]["spec"]["template"]["spec"]


def test_a_rendered_pod_is_admitted_under_restricted() -> None:
    pod = _pod()
    assert restricted_violations(pod) == []
    for container in pod["containers"] + pod["initContainers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": TMP_DIR} in container["volumeMounts"]
        assert {"name": "HOME", "value": TMP_DIR} in container["env"]
        assert container["imagePullPolicy"] == "Always"  # a tag can be re-pointed
    assert pod["securityContext"]["runAsUser"] >= 10000
    assert pod["automountServiceAccountToken"] is False


def test_a_digest_is_pulled_once_and_the_read_only_root_can_be_opted_out() -> None:
    digest = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train@sha256:" + "a" * 64
    pod = _pod(image=digest, readOnlyRootFilesystem=False)
    assert {c["imagePullPolicy"] for c in pod["containers"] + pod["initContainers"]} == {"IfNotPresent"}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda pod: pod.update(hostNetwork=True), "Host Namespaces"),
        (lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "HostPath Volumes"),
        (lambda pod: pod["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}), "Volume Types"),
        (lambda pod: pod["containers"][0]["securityContext"].update(privileged=True), "Privileged Containers"),
        (lambda pod: pod["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
         "Privilege Escalation"),
        (lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
         "Capabilities"),
        (lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(drop=[]), "Capabilities"),
        (lambda pod: pod["containers"][0]["securityContext"].update(runAsNonRoot=False), "Running as Non-root"),
        (lambda pod: pod["securityContext"].update(runAsUser=0), "Running as Non-root user"),
        (lambda pod: pod["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
         "Seccomp"),
        (lambda pod: pod["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 1}]), "Host Ports"),
        (lambda pod: pod["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "Sysctls"),
        (lambda pod: pod["containers"][0]["securityContext"].update(procMount="Unmasked"), "/proc Mount Type"),
    ],
)
def test_the_checker_catches_each_rule(mutate: Any, rule: str) -> None:
    pod = copy.deepcopy(_pod())
    mutate(pod)
    assert any(problem.startswith(rule) for problem in restricted_violations(pod)), restricted_violations(pod)


def test_a_multi_node_gang_accepts_traffic_only_from_itself() -> None:
    spec = parse_spec({"name": "ddp", "image": IMAGE, "gpus": 8, "nodes": 2, "gpuType": "h100"})
    job, service, policy = render_job(spec, prod_facts())
    validate_strict(policy)
    gang = {"matchLabels": {"app.kubernetes.io/instance": job["metadata"]["name"]}}
    assert policy["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert policy["spec"]["podSelector"] == gang
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": gang}], "ports": [{"protocol": "TCP"}]}]
    template_labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels[key] == value for key, value in gang["matchLabels"].items())


def test_the_namespace_denies_ingress_and_lets_only_the_monitoring_namespace_scrape() -> None:
    deny, scrape = namespace_network_policies("training", {"app.kubernetes.io/part-of": "ml-cluster"},
                                              metrics_namespace="monitoring", metrics_ports=(9400,))
    for policy in (deny, scrape):
        validate_strict(policy)
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert scrape["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert namespace_network_policies("training", {}) == [deny | {"metadata": deny["metadata"] | {"labels": {}}}]



def test_suspension_is_the_callers_default_unless_the_spec_decides() -> None:
    spec = parse_spec({"name": "resnet", "image": IMAGE, "gpus": 1})
    submitted = render_job(spec, dev_facts())[0]
    deployed = render_job(spec, dev_facts(), suspended_by_default=True)[0]
    assert submitted["spec"]["suspend"] is False and deployed["spec"]["suspend"] is True
    assert submitted["metadata"]["name"] != deployed["metadata"]["name"]  # a changed Job is a new Job
    explicit = parse_spec({"name": "resnet", "image": IMAGE, "gpus": 1, "suspend": False})
    assert render_job(explicit, dev_facts(), suspended_by_default=True)[0] == submitted


def test_restricted_egress_allows_dns_the_namespace_the_agent_and_the_listed_ranges() -> None:
    (_, egress) = namespace_network_policies("training", {}, egress=EgressRules(cidrs=("52.92.0.0/17",)))
    validate_strict(egress)
    assert egress["spec"]["podSelector"] == {} and egress["spec"]["policyTypes"] == ["Egress"]
    rules = egress["spec"]["egress"]
    assert rules[0]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert rules[1] == {"to": [{"podSelector": {}}]}  # the gang's rendezvous and collectives
    assert rules[2] == {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}], "ports": [{"protocol": "TCP", "port": 80}]}
    assert rules[3] == {"to": [{"ipBlock": {"cidr": "52.92.0.0/17"}}], "ports": [{"protocol": "TCP", "port": 443}]}
