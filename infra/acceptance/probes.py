"""The steps no CLI of the project does alone, each a wait with a deadline over the kubernetes client or boto3:

- burn_in_labels: the GPU pool's nodes come up (the all-reduce Job asked for them) and the burn-in labels each
  `<prefix>/gpu-health=passed` (workloads.health.verdict); a node labelled failed fails the step at once;
- chaos: a gang trains (`submit status --json`: Running with progress), one EC2 instance under it is terminated
  (boto3), and the run's incident (workloads.incidents, as `submit status` reads it) shows the resume;
- leftovers: after `pulumi destroy`, nothing billable carries the stack's tags (Resource Groups Tagging API) or
  runs in its cluster's name (EC2 instances, EBS volumes by the stack's or the cluster's tags: the gp3 class's carry
  the stack's); polled, since the tag index lags.

Pure helpers first (what a status, a node or a tag search means); the probes that call out are below them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from infra.acceptance.runner import DEADLINE_EXIT, ProbeFn, ProbeOutcome
from infra.acceptance.stackstate import stack_state_probe
from workloads.health.verdict import PASSED, REASON_ANNOTATION
from workloads.incidents import Incident, incident_line

POLL_S = 20.0
STATUS_TIMEOUT_S = 120.0
# Terminated instances and deleted volumes or NAT gateways stay visible for a while; they bill nothing.
GONE_STATES = {"terminated", "deleted", "deleting", "failed"}


# --- pure helpers --------------------------------------------------------------------------------------------------

def instance_id(provider_id: str | None) -> str | None:
    """`aws:///us-west-2a/i-0123456789abcdef0` -> `i-0123456789abcdef0` (a Node's spec.providerID on EKS)."""
    tail = (provider_id or "").rsplit("/", 1)[-1]
    return tail if provider_id and provider_id.startswith("aws://") and tail.startswith("i-") else None


def training(status: Mapping[str, Any]) -> bool:
    """`submit status --json`: the run is Running and its pods report progress (the trainer's metrics)."""
    return status.get("phase") == "Running" and bool(status.get("progress"))


def resumed(status: Mapping[str, Any], after: float) -> tuple[int, Incident] | None:
    """(its number, the incident) of the first incident that began after `after` (Unix time, less a minute of
    clock skew with the API server) and has resumed, from `submit status --json`."""
    for number, raw in enumerate(status.get("incidents") or [], start=1):
        if not isinstance(raw, dict):
            continue
        try:
            incident = Incident(**raw)
        except TypeError:
            continue
        if incident.started_at >= after - 60 and incident.resumed_step is not None:
            return number, incident
    return None


def burn_in_state(nodes: Iterable[Mapping[str, Any]], label: str) -> tuple[list[str], list[str], list[str]]:
    """(passed, failed with reasons, waiting) node names of a pool, from the Node objects (as JSON)."""
    passed, failed, waiting = [], [], []
    prefix = label.rsplit("/", 1)[0]
    for node in nodes:
        metadata = node.get("metadata") or {}
        name = metadata.get("name", "?")
        value = (metadata.get("labels") or {}).get(label)
        if value == PASSED:
            passed.append(name)
        elif value is not None:
            reason = (metadata.get("annotations") or {}).get(f"{prefix}/{REASON_ANNOTATION}", "")
            failed.append(f"{name} ({label}={value}: {reason.splitlines()[0] if reason else 'no reason recorded'})")
        else:
            waiting.append(name)
    return passed, failed, waiting


def billable(tagged: Iterable[str], instances: Iterable[Mapping[str, Any]],
             volumes: Iterable[Mapping[str, Any]], states: Mapping[str, str]) -> list[str]:
    """What is left and bills: tagged ARNs (less those whose EC2 state says gone, and those the instance and
    volume searches list themselves), instances not terminated, volumes not deleted."""
    instances, volumes = list(instances), list(volumes)
    described = {i["InstanceId"] for i in instances} | {v["VolumeId"] for v in volumes}
    left = [arn for arn in tagged
            if arn.rsplit("/", 1)[-1] not in described and states.get(arn.rsplit("/", 1)[-1]) not in GONE_STATES]
    left += [f"instance {i['InstanceId']}" for i in instances
             if (i.get("State") or {}).get("Name") not in GONE_STATES]
    left += [f"volume {v['VolumeId']}" for v in volumes if v.get("State") not in GONE_STATES]
    return sorted(set(left))


# --- the probes ----------------------------------------------------------------------------------------------------

def _kubernetes(stack: str) -> Any:
    from kubernetes import client

    from workloads.kubeconfig import load_kubernetes_config, resolve_kubeconfig

    load_kubernetes_config(resolve_kubeconfig(None, stack, os.environ, Path.home()), None)
    return client.CoreV1Api()


def burn_in_probe(stack: str, sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> ProbeFn:
    def probe(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
        core = _kubernetes(stack)
        want, began = int(args["nodes"]), clock()
        selector = f"{args['pool_label']}={args['pool']}"
        while True:
            items = core.list_node(label_selector=selector, _request_timeout=30).items
            nodes = [core.api_client.sanitize_for_serialization(item) for item in items]
            passed, failed, waiting = burn_in_state(nodes, args["label"])
            log.write(f"{clock() - began:7.0f}s {selector}: {len(passed)} passed, {len(failed)} failed, "
                      f"{len(waiting)} waiting\n")
            log.flush()
            figures = {"burn_in_nodes": len(nodes), "burn_in_passed": len(passed),
                       "burn_in_seconds": round(clock() - began, 1)}
            if failed:
                return ProbeOutcome(1, figures, f"burn-in failed on {'; '.join(failed)}")
            if len(passed) >= want:
                return ProbeOutcome(0, figures)
            if clock() - began + POLL_S > deadline_s:
                return ProbeOutcome(DEADLINE_EXIT, figures, f"after {deadline_s:g} s: {len(passed)} of {want} node(s) "
                                                            f"of pool {args['pool']} labelled {args['label']}=passed")
            sleep(POLL_S)
    return probe


def submit_status(python: str, stack: str, namespace: str, job: str) -> dict[str, Any]:
    done = subprocess.run([python, "-m", "workloads.submit", "--stack", stack, "-n", namespace, "status", job,
                           "--json"], capture_output=True, text=True, timeout=STATUS_TIMEOUT_S, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError((done.stderr.strip().splitlines() or [f"submit status exited {done.returncode}"])[-1])
    status = json.loads(done.stdout)
    return status if isinstance(status, dict) else {}


def _gang_instance(core: Any, namespace: str, job: str) -> tuple[str, str] | None:
    """(node, instance id) of a running pod of the gang (index 0's pod is kept: its log holds the events)."""
    for selector in (f"batch.kubernetes.io/job-name={job}", f"jobset.sigs.k8s.io/jobset-name={job}"):
        pods = core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=30).items
        running = sorted((pod for pod in pods if pod.status.phase == "Running" and pod.spec.node_name),
                         key=lambda pod: pod.metadata.name, reverse=True)
        for pod in running:
            node = core.read_node(pod.spec.node_name, _request_timeout=30)
            found = instance_id(node.spec.provider_id)
            if found:
                return pod.spec.node_name, found
    return None


def chaos_probe(stack: str, region: str, python: str, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> ProbeFn:
    def probe(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
        import boto3

        job, namespace, began = args["job"], args["namespace"], clock()
        left = lambda: deadline_s - (clock() - began)  # noqa: E731

        def wait(what: str, done: Callable[[dict[str, Any]], Any]) -> Any:
            while left() > 0:
                status = submit_status(python, stack, namespace, job)
                log.write(f"{clock() - began:7.0f}s {what}: {status.get('phase')} "
                          f"{status.get('reason') or ''}\n")
                log.flush()
                if status.get("phase") in ("Failed", "Succeeded"):
                    raise RuntimeError(f"{job} ended ({status.get('phase')}) while waiting for {what}")
                found = done(status)
                if found:
                    return found
                sleep(min(POLL_S, max(left(), 0)))
            return None

        try:
            if not wait("training", training):
                return ProbeOutcome(DEADLINE_EXIT, note=f"{job} did not train within {deadline_s:g} s")
            target = _gang_instance(_kubernetes(stack), namespace, job)
            if target is None:
                return ProbeOutcome(1, note=f"{job}: no running pod on an EC2 node to terminate")
            node, instance = target
            killed_at = wall()
            boto3.session.Session(region_name=region).client("ec2").terminate_instances(InstanceIds=[instance])
            log.write(f"terminated {instance} (node {node}) at {killed_at:.0f}\n")
            found = wait("resume", lambda status: resumed(status, killed_at))
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            return ProbeOutcome(1, note=f"chaos: {exc}")
        figures = {"terminated_instance": instance, "terminated_node": node}
        if found is None:
            return ProbeOutcome(DEADLINE_EXIT, figures, f"{job} did not resume within {deadline_s:g} s of the start")
        number, incident = found
        return ProbeOutcome(0, {**figures, "incident": incident_line(number, incident),
                                "time_to_resume_s": incident.time_to_resume_s,
                                "steps_lost": incident.steps_lost,
                                "wall_to_resume_s": round(wall() - killed_at, 1)})
    return probe


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> list[Any]:
    return [item for page in client.get_paginator(operation).paginate(**kwargs) for item in page.get(key, [])]


def find_leftovers(client: Callable[[str], Any], stack: str, project: str, cluster: str) -> list[str]:
    tagging, ec2 = client("resourcegroupstaggingapi"), client("ec2")
    searches: list[list[dict[str, Any]]] = [[{"Key": "project", "Values": [project]},
                                             {"Key": "stack", "Values": [stack]}]]
    if cluster:
        searches += [[{"Key": f"kubernetes.io/cluster/{cluster}"}],
                     [{"Key": "eks:cluster-name", "Values": [cluster]}]]
    arns = {m["ResourceARN"] for tags in searches
            for m in _pages(tagging, "get_resources", "ResourceTagMappingList", TagFilters=tags)}
    instances: list[Mapping[str, Any]] = []
    # The gp3 class's volumes carry the stack's tags (its tagSpecification parameters); the nodes' and the driver's
    # with a cluster id, the cluster's. Their states tell a deleted volume from a left one.
    volume_searches = [[{"Name": "tag:project", "Values": [project]}, {"Name": "tag:stack", "Values": [stack]}]]
    if cluster:
        instances = [i for r in _pages(ec2, "describe_instances", "Reservations",
                                       Filters=[{"Name": "tag:eks:cluster-name", "Values": [cluster]}])
                     for i in r.get("Instances", [])]
        volume_searches.append([{"Name": f"tag:kubernetes.io/cluster/{cluster}", "Values": ["owned"]}])
    volumes = list({v["VolumeId"]: v for filters in volume_searches
                    for v in _pages(ec2, "describe_volumes", "Volumes", Filters=filters)}.values())
    gateways = _pages(ec2, "describe_nat_gateways", "NatGateways",
                      Filter=[{"Name": "tag:stack", "Values": [stack]}])
    states = {g["NatGatewayId"]: g.get("State", "") for g in gateways}
    states |= {i["InstanceId"]: (i.get("State") or {}).get("Name", "") for i in instances}
    states |= {v["VolumeId"]: v.get("State", "") for v in volumes}
    return billable(arns, instances, volumes, states)


def leftovers_probe(region: str, project: str, sleep: Callable[[float], None] = time.sleep,
                    client: Callable[[str], Any] | None = None,
                    clock: Callable[[], float] = time.monotonic) -> ProbeFn:
    def probe(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
        if client is None:
            import boto3

            session = boto3.session.Session(region_name=region)
            make: Callable[[str], Any] = session.client
        else:
            make = client
        began = clock()
        while True:
            left = find_leftovers(make, args["stack"], project, args.get("cluster", ""))
            log.write(f"{clock() - began:7.0f}s {len(left)} billable resource(s) left\n")
            log.writelines(f"  {item}\n" for item in left)
            log.flush()
            figures = {"leftovers": len(left), "leftover_ids": ", ".join(left[:20]) or None}
            if not left:
                return ProbeOutcome(0, figures)
            if clock() - began + POLL_S > deadline_s:
                return ProbeOutcome(1, figures, f"{len(left)} billable resource(s) left after destroy: "
                                                f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}")
            sleep(POLL_S)
    return probe


def real_probes(stack: str, region: str, python: str, project: str) -> dict[str, ProbeFn]:
    return {"burn_in_labels": burn_in_probe(stack), "chaos": chaos_probe(stack, region, python),
            "leftovers": leftovers_probe(region, project), "stack_state": stack_state_probe()}


__all__: Sequence[str] = ["billable", "burn_in_state", "instance_id", "real_probes", "resumed", "training"]
