"""NetworkPolicies for the training namespace: nothing reaches a training pod unless a rule below lets it.

- `default-deny-ingress` selects every pod of the namespace and allows no ingress.
- A multi-node Job gets its own policy: its pods accept traffic from each other only (torchrun's c10d
  rendezvous on RENDEZVOUS_PORT, and NCCL/Gloo, which pick ephemeral ports, so all ports within the gang).
- Metrics scraping, where a monitoring namespace is named: from that namespace's pods to the named ports.
Egress is left open: the pods need DNS, the registry and S3/COS, whose addresses a policy cannot pin.
"""

from __future__ import annotations

from typing import Any

from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.spec import TrainingJobSpec


def _policy(name: str, namespace: str, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def namespace_network_policies(
    namespace: str, labels: dict[str, str], metrics_namespace: str | None = None, metrics_ports: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """The namespace-wide policies: deny all ingress, then (optionally) let the monitoring namespace scrape."""
    policies = [_policy("default-deny-ingress", namespace, labels, {"podSelector": {}, "policyTypes": ["Ingress"]})]
    if metrics_namespace and metrics_ports:
        policies.append(
            _policy("allow-metrics-scrape", namespace, labels, {
                "podSelector": {},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{"namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": metrics_namespace}}}],
                    "ports": [{"protocol": "TCP", "port": port} for port in metrics_ports],
                }],
            })
        )
    return policies


def job_network_policy(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str,
                       labels: dict[str, str]) -> dict[str, Any] | None:
    """For a multi-node Job: its pods may reach each other on any TCP port, and nothing else may reach them."""
    if spec.nodes < 2:
        return None
    gang = {"matchLabels": {"app.kubernetes.io/instance": job_name}}
    return _policy(job_name, facts.namespace, labels, {
        "podSelector": gang,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": gang}], "ports": [{"protocol": "TCP"}]}],
    })
