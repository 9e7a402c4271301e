"""A new stack file from the account's facts: what only the user knows (account, region, zones, the admin role)
comes in as arguments, everything else is a small dev-shaped default that runs the example Jobs under
workloads/jobs/ (an A10G pool, the `datasets`/`checkpoints` buckets, the EFS claims they mount). For a stack on an
EKS cluster that already runs, the cluster's DescribeCluster answer gives the region, account, VPC, subnets and
version instead (render_existing_stack_file).

Pure: the facts in, the YAML text out, validated by the same schema `pulumi up` uses before anything is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from infra.account.existing import HelmRelease, helm_releases
from infra.account.kubeapi import KubeApi, KubeApiError
from infra.config import ClusterConfig
from infra.config.charts import DEVICE_PLUGIN, KUBE_PROMETHEUS_STACK, KUEUE, StackChart
from infra.config.names import check_stack_name
from infra.config.nodepools import DevicePluginConfig
from infra.config.nodes import AutoscalerConfig
from infra.config.placeholders import placeholder_problems
from infra.config.schema import ConfigError, parse_stack_config
from infra.config.support import EKS_DEFAULT_VERSION
from infra.existing_cluster import FoundCluster, existing_cluster_problems

ZONES = 3  # EKS needs two; three spreads the node groups and EFS mount targets


@dataclass(frozen=True)
class NewStackFacts:
    stack: str
    account_id: str
    region: str
    availability_zones: tuple[str, ...]
    admin_role_arn: str
    researcher_role_arn: str | None = None
    public_access_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    deploy_runner_labels: tuple[str, ...] = field(default=())  # self-hosted runner labels; () = GitHub-hosted
    kubernetes_version: str = EKS_DEFAULT_VERSION
    vpc_cidr: str = "10.0.0.0/16"


def _flow(value: object) -> str:
    """A YAML flow value (JSON is YAML) on one line."""
    return json.dumps(value)


def render_stack_file(facts: NewStackFacts) -> str:
    """The stack file's text. Raises ConfigError (one line per problem) if the facts do not make a deployable
    stack: a bad name, an ARN or CIDR the schema refuses, or a placeholder left in an argument."""
    problems = check_stack_name(facts.stack)
    if problems:
        raise ConfigError(problems)
    zones = list(facts.availability_zones[:ZONES])
    if not re.fullmatch(r"\d{12}", facts.account_id):
        raise ConfigError([("arguments", f"--account {facts.account_id!r} is not a 12-digit AWS account id")])
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", facts.region):
        raise ConfigError([("arguments", f"--region {facts.region!r} is not an AWS region like us-west-2")])
    # Every value the user gave goes in as a JSON string (valid YAML): no argument can change the file's shape.
    access = f"      - {{principalArn: {_flow(facts.admin_role_arn)}, policy: cluster-admin}}"
    if facts.researcher_role_arn:
        access += (f"\n      - {{principalArn: {_flow(facts.researcher_role_arn)}, policy: edit, "
                   "namespaces: [training]}")
    deploy = (f"  ml-cluster:deploy:\n    runner: self-hosted\n    labels: {_flow(list(facts.deploy_runner_labels))}\n"
              if facts.deploy_runner_labels else
              "  ml-cluster:deploy:\n    runner: github-hosted  # needs the public endpoint open to it (0.0.0.0/0)\n")
    header = f"""\
# {facts.stack}: written by scripts/new_stack.py for account {facts.account_id} in {facts.region}. Edit freely;
# check offline with `make plan STACK={facts.stack}`. Dev-shaped: unprotected (destroy removes everything), one GPU
# pool that scales from zero. For production data set ml-cluster:protected: true.
"""
    cluster = f"""\
  ml-cluster:network:
    create:
      cidr: {facts.vpc_cidr}
      availabilityZones: {_flow(zones)}
      natGateways: single
  ml-cluster:cluster:
    name: ml-{facts.stack}
    kubernetesVersion: "{facts.kubernetes_version}"
    endpointPublicAccess: true
    endpointPrivateAccess: true
    publicAccessCidrs: {_flow(list(facts.public_access_cidrs))}
    accessEntries:
{access}
{deploy}"""
    return _checked(_stack_file(header, facts.stack, facts.region, facts.account_id, cluster, new_cluster=True))


def _external(release: HelmRelease) -> str:
    return (f"{{external: {{version: {_flow(release.version)}, release: {_flow(release.name)}, "
            f"namespace: {_flow(release.namespace)}}}}}")


def _running(releases: tuple[HelmRelease, ...], chart: StackChart) -> list[HelmRelease]:
    return [r for r in releases if r.chart == chart.chart and r.status == "deployed"]


def adopted_lines(releases: tuple[HelmRelease, ...]) -> tuple[str, str]:
    """(the gpu.devicePlugin value, comment lines) from the Helm releases a cluster runs. The cluster's NVIDIA
    device plugin is adopted outright: the stack's own would be a second DaemonSet on the same GPUs, which preflight
    refuses. Kueue and kube-prometheus-stack stay commented: a new stack turns neither on, and adopting a shared
    Kueue adds the stack's queues to it, which is the user's call."""
    plugin = f"{{chartVersion: {DevicePluginConfig().chart_version}}}"
    notes: list[str] = []
    for chart in (DEVICE_PLUGIN, KUEUE, KUBE_PROMETHEUS_STACK):
        found = _running(releases, chart)
        if len(found) > 1:
            notes.append(f"  # {chart.chart} runs as {', '.join(f'{r.name} in {r.namespace}' for r in found)}: "
                         f"adopt one (ml-cluster:{chart.key}.external, docs/operations.md)")
        elif found and chart is DEVICE_PLUGIN:
            plugin = f"{_external(found[0])}  # the cluster's own, adopted"
        elif found:
            section = "ml-cluster:kueue" if chart is KUEUE else "ml-cluster:monitoring"
            notes.append(f"  # the cluster runs {chart.chart} {found[0].version}; to build on it:\n"
                         f"  #   {section}: {{enabled: true, external: {{version: {_flow(found[0].version)}, "
                         f"release: {_flow(found[0].name)}, namespace: {_flow(found[0].namespace)}}}}}")
    return plugin, "".join(note + "\n" for note in notes)


def cluster_releases(kube: KubeApi) -> tuple[tuple[HelmRelease, ...], str]:
    """The Helm releases the cluster runs, or () and a comment line saying why they were not read."""
    try:
        return tuple(helm_releases(kube)), ""
    except KubeApiError as exc:
        return (), (f"  # Helm releases not read ({exc.why}): `make preflight` lists the ones to adopt "
                    "(external:)\n")


def _stack_file(header: str, stack: str, region: str, account_id: str, cluster: str, *, new_cluster: bool,
                device_plugin: str = "", adopted: str = "") -> str:
    """A stack file: `header`, the account, `cluster` (the network and cluster sections, each line ended), then the
    small dev-shaped pools and storage every new stack starts with. A new cluster also gets a system pool, the
    default StorageClass and a note on Kueue and monitoring; a cluster that already runs keeps its own default
    StorageClass."""
    system_pool = "    - {name: system, instanceTypes: [m6i.large], minSize: 2, desiredSize: 2, maxSize: 3}\n"
    optional = """\
  # Gang admission and team quotas (Kueue) and metrics with alerts and the dashboard are off in a new stack; turn
  # them on here (docs/architecture.md, Kueue; docs/monitoring.md):
  #   ml-cluster:kueue: {enabled: true}
  #   ml-cluster:monitoring: {enabled: true}
"""
    gp3 = "{name: gp3, default: true}" if new_cluster else \
        "{name: gp3, default: false}  # the cluster keeps its own default StorageClass"
    return f"""\
{header}config:
  aws:region: {region}
  ml-cluster:accountId: "{account_id}"  # a real run refuses credentials for any other account
  ml-cluster:platform: eks
  ml-cluster:protected: false
  ml-cluster:tags:
    environment: {stack}
{cluster}  ml-cluster:nodePools:
{system_pool if new_cluster else ""}\
    - {{name: gpu-a10g, instanceTypes: [g5.xlarge], capacityType: SPOT, minSize: 0, desiredSize: 0, maxSize: 2,
       gpu: true, diskSizeGib: 100}}
  ml-cluster:gpu:
    devicePlugin: {device_plugin or f"{{chartVersion: {DevicePluginConfig().chart_version}}}"}
    dcgmExporter: {{enabled: false}}
  ml-cluster:nodes:
    autoscaler: {{chartVersion: {AutoscalerConfig().chart_version}, scaleDownUnneededTime: 5m}}
{optional if new_cluster else adopted}\
  ml-cluster:storage:
    efs: {{throughputMode: elastic, backup: false}}
    gp3: {gp3}
    buckets:
      - {{name: datasets, mount: true}}
      - {{name: checkpoints, scratchPrefixes: [tmp/], scratchExpiryDays: 3}}
    sharedVolumes:
      - {{name: checkpoints-efs, storageClass: efs-ap, size: 500Gi}}
      - {{name: datasets-efs, storageClass: efs-ap, size: 200Gi}}
"""


def _checked(text: str) -> str:
    """`text` if it is a stack file `pulumi up` would take; else ConfigError, one line per problem: a placeholder
    first (the most specific message for an example value), then what the schema refuses (an ARN, a CIDR, a zone,
    a subnet id)."""
    values = yaml.safe_load(text)["config"]
    left = placeholder_problems(values, deploying=True)
    if left:
        raise ConfigError(left)
    parse_stack_config(values)
    return text


@dataclass(frozen=True)
class ExistingStackFacts:
    """A stack on an EKS cluster that already runs, from its DescribeCluster answer (checked field by field)."""

    stack: str
    cluster: FoundCluster
    public_subnet_ids: frozenset[str] = frozenset()  # known only live (EC2 says which subnets map public IPs)
    admin_role_arn: str | None = None  # an access entry for it (not the cluster's creator: it has one already)
    researcher_role_arn: str | None = None
    source: str = "DescribeCluster"  # the file or call the facts came from, for the header
    releases: tuple[HelmRelease, ...] = ()  # the Helm releases it runs (read live only)
    releases_note: str = ""  # comment lines: why they were not read


def render_existing_stack_file(facts: ExistingStackFacts) -> str:
    """The stack file for cluster.existing: network.existing (the cluster's VPC and subnets), the cluster's name,
    version and region, and the same small dev-shaped pools and storage as a new stack. Raises ConfigError (one
    line per problem) where the cluster cannot be a base (not ACTIVE, no access entries) or the file would not
    parse."""
    problems = check_stack_name(facts.stack)
    if problems:
        raise ConfigError(problems)
    found = facts.cluster
    cluster_cfg = ClusterConfig(name=found.name, kubernetes_version=found.version, existing=True)
    unfit = existing_cluster_problems(found, cluster_cfg, found.vpc_id)
    if unfit:
        raise ConfigError([(facts.source, why) for _, why in unfit])
    account = found.arn.split(":")[4]
    private = [subnet for subnet in found.subnet_ids if subnet not in facts.public_subnet_ids]
    public = [subnet for subnet in found.subnet_ids if subnet in facts.public_subnet_ids]
    if not private:
        raise ConfigError([(facts.source, f"cluster {found.name} has no private subnet for the stack's nodes "
                                          "(all of its subnets map public IPs)")])
    subnet_note = ("the cluster's subnets that map no public IP (EC2)" if facts.public_subnet_ids or public else
                   "the cluster's subnets as DescribeCluster lists them: keep only private ones")
    entries = [f"      - {{principalArn: {_flow(arn)}, policy: {policy}{extra}}}" for arn, policy, extra in (
        (facts.admin_role_arn, "cluster-admin", ""), (facts.researcher_role_arn, "edit", ", namespaces: [training]"))
        if arn]
    access = ("    accessEntries:\n" + "\n".join(entries) + "\n") if entries else ""
    header = f"""\
# {facts.stack}: written by scripts/new_stack.py from {facts.source} of EKS cluster {found.name} ({found.arn}).
# The stack lays itself onto that cluster and never creates, changes or deletes it, its VPC, subnets or node groups
# (docs/operations.md, "Use an existing EKS cluster"). Run `make preflight STACK={facts.stack}` before `make up`:
# it finds add-ons, Helm releases and autoscaled node groups already there. Dev-shaped: unprotected, one GPU pool
# that scales from zero.
"""
    cluster = f"""\
  ml-cluster:network:
    existing:  # the cluster's VPC; the nodes also join its security group {found.cluster_security_group_id}
      vpcId: {found.vpc_id}
      privateSubnetIds: {_flow(private)}  # {subnet_note}
      publicSubnetIds: {_flow(public)}
  ml-cluster:cluster:
    name: {found.name}
    existing: true
    kubernetesVersion: "{found.version}"  # what the cluster runs (checked against it at every plan)
{access}"""
    plugin, adopted = adopted_lines(facts.releases)
    return _checked(_stack_file(header, facts.stack, found.region, account, cluster, new_cluster=False,
                                device_plugin=plugin, adopted=facts.releases_note + adopted))
