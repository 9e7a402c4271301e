"""NetworkPolicies for the training namespace: nothing reaches a training pod unless a rule below lets it.

- `default-deny-ingress` selects every pod of the namespace and allows no ingress.
- A multi-node Job gets its own policy: its pods accept traffic from each other only (torchrun's c10d
  rendezvous on RENDEZVOUS_PORT, and NCCL/Gloo, which pick ephemeral ports, so all ports within the gang).
- Metrics scraping, where a monitoring namespace is named: from that namespace's pods to the named ports.
- Egress, when restricted (EgressRules): cluster DNS, the namespace's own pods, the EKS Pod Identity agent, and
  the given CIDRs on the given ports. Open otherwise: a policy names addresses, not host names, so the object
  store's and the registry's ranges must come from the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.spec import TrainingJobSpec

# The EKS Pod Identity agent answers credential requests on this link-local address (port 80) on every node.
POD_IDENTITY_AGENT = "169.254.170.23/32"


@dataclass(frozen=True)
class EgressRules:
    cidrs: tuple[str, ...]
    ports: tuple[int, ...] = (443,)
    pod_identity_agent: bool = True  # EKS: credentials come from the node-local agent


def _egress_policy(namespace: str, labels: dict[str, str], rules: EgressRules) -> dict[str, Any]:
    dns = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    egress: list[dict[str, Any]] = [dns, {"to": [{"podSelector": {}}]}]
    if rules.pod_identity_agent:
        egress.append({"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT}}], "ports": [{"protocol": "TCP", "port": 80}]})
    egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in rules.cidrs],
                   "ports": [{"protocol": "TCP", "port": port} for port in rules.ports]})
    return _policy("restrict-egress", namespace, labels, {"podSelector": {}, "policyTypes": ["Egress"],
                                                          "egress": egress})


def _policy(name: str, namespace: str, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def namespace_network_policies(
    namespace: str, labels: dict[str, str], metrics_namespace: str | None = None, metrics_ports: tuple[int, ...] = (),
    egress: EgressRules | None = None,
) -> list[dict[str, Any]]:
    """The namespace-wide policies: deny all ingress, let the monitoring namespace scrape (optional), restrict egress
    (optional)."""
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
    if egress is not None:
        policies.append(_egress_policy(namespace, labels, egress))
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
