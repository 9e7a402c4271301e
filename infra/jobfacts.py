"""The job facts, published in the cluster: what `python -m workloads.submit` needs to render a spec (pools, queues,
buckets, claims, the image repository, the teams), as a ConfigMap in the Jobs' namespace and in each team's.

`submit` reads it through the current kubeconfig context (`aws eks update-kubeconfig` is enough), so a team member
with view or edit on their namespace, and no access to the Pulumi backend or its KMS key, can render, submit,
watch and delete their runs. The built-in `view` and `edit` ClusterRoles the teams are bound to include ConfigMaps
(infra/tenancy.py), so no Role of its own is needed. The facts hold names, not secrets (the COS HMAC keys stay in
their Secret; the facts only name it). The `jobFacts` stack output stays, for `--facts FILE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.context import ClusterInfo, StackContext, stack_labels
from workloads.cluster_facts import ClusterFacts, facts_config_map, facts_namespaces


@dataclass(frozen=True)
class JobFactsArgs:
    cluster: ClusterInfo
    facts: ClusterFacts
    # namespace name -> the resource that creates it (the Jobs' namespace, the teams' namespaces)
    namespaces: Mapping[str, pulumi.Resource]


class JobFacts(pulumi.ComponentResource):
    """One ConfigMap of the job facts per namespace where Jobs run."""

    def __init__(self, ctx: StackContext, args: JobFactsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:JobFacts", ctx.name("jobs", "facts"), None, opts)
        self.config_maps: dict[str, k8s.core.v1.ConfigMap] = {}
        labels = stack_labels(ctx.stack, ctx.label_prefix)
        for namespace in facts_namespaces(args.facts):
            manifest = facts_config_map(args.facts, namespace, labels)
            needs = [args.namespaces[namespace]] if namespace in args.namespaces else []
            self.config_maps[namespace] = k8s.core.v1.ConfigMap(
                ctx.name("jobs", f"facts-{namespace}"), metadata=manifest["metadata"], data=manifest["data"],
                opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider, depends_on=needs))
        self.register_outputs({"namespaces": sorted(self.config_maps)})


def publish_job_facts(ctx: StackContext, cluster: ClusterInfo, facts: ClusterFacts, jobs_namespace: pulumi.Resource,
                      team_namespaces: Mapping[str, pulumi.Resource]) -> JobFacts:
    """The stack's hook: `team_namespaces` maps a team's name to the resource of its namespace."""
    teams = facts.teams or {}
    namespaces = {facts.namespace: jobs_namespace,
                  **{teams[team].namespace: resource for team, resource in team_namespaces.items() if team in teams}}
    return JobFacts(ctx, JobFactsArgs(cluster=cluster, facts=facts, namespaces=namespaces))
