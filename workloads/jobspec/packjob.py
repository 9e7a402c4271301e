"""A dataset pack on the cluster: an Indexed Job of N slices and its publish Job (`submit pack`), pure manifests.

    slices   batch/v1 Job, completionMode Indexed, completions = parallelism = N: pod I runs
             `python -m workloads.data pack SRC s3://DEST --shard-count N` (I from JOB_COMPLETION_INDEX, which the
             Job controller sets in every pod of an Indexed Job)
    publish  batch/v1 Job, one pod: `pack SRC s3://DEST --publish --wait S`, which waits (at most S) for every
             shard's record, then verifies and publishes the manifest; created beside the slices, so it needs no
             controller to start it

Retries are per index (backoffLimitPerIndex, Kubernetes 1.33 GA): a slice that fails is retried on its own and
resumes from its completed shards; a config error (exit 2) fails that index at once (FailIndex); a Spot reclaim,
a preemption or a drain (DisruptionTarget) is retried without counting. Other slices go on (maxFailedIndexes = N),
so the publish step's error names every shard still missing.

Placement: CPU pools only. Kueue gives the pods the `cpu` flavor: a GPU flavor carries the nvidia.com/gpu
NoSchedule taint as a nodeTaint, and Kueue skips a flavor whose taints the pod does not tolerate
(kubernetes-sigs/kueue v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go:1238-1245); the required node
affinity `<prefix>/gpu-type DoesNotExist` keeps them off GPU nodes without Kueue too. Credentials: on AWS S3 the
packs' own service account (EKS Pod Identity; its role reads every stack bucket and writes only those marked
`packInto`, infra/packing.py), or the Jobs' account where the stack has none; the object store's HMAC Secret and
endpoint when the buckets are there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from workloads.cli import GIB, parse_size
from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.controllers.indexed_job import ignore_disruption_target
from workloads.jobspec.defaults import (
    METRICS_ADDR_ENV,
    TMP_MOUNT,
    TMP_VOLUME,
    app_labels,
    required_node_affinity,
    restricted_container,
    restricted_pod,
    run_once_pod,
)
from workloads.jobspec.fields import CONFIG_ERROR_EXIT_CODE, STAGE_METRICS_PORT, JobSpecError
from workloads.jobspec.queue import KUEUE_QUEUE_LABEL, queue_annotation
from workloads.k8snames import is_dns1035_label
from workloads.quantity import format_bytes

PACK_CONTAINER = "pack"
# A slice serves its progress (images, shards done: what `submit watch` reads through the pod proxy) on the
# stager's port, which the stack's NetworkPolicies already open to its monitoring namespace.
PACK_METRICS_PORT = STAGE_METRICS_PORT
SCRATCH_DIR = "/scratch"


@dataclass(frozen=True)
class PackJobSpec:
    name: str
    source: str  # s3://bucket/prefix (class folders) or s3://bucket/path/list.csv|.jsonl
    dest: str  # s3://bucket/prefix
    slices: int
    image: str
    layout: Literal["decoded", "encoded", "records"] = "decoded"  # records: tables packed by `pack-tables`
    fields: str | None = None  # records: the fields, a JSON list (pack-tables --fields)
    map_hook: str | None = None  # records: module:function in the image (pack-tables --map)
    image_columns: tuple[str, ...] = ()  # records: columns naming images under `images`
    images: str | None = None  # records: s3:// prefix of the images (default: source)
    shard_rows: int = 4096  # records: rows per shard
    image_size: int = 256
    shard_size: str = "1GiB"
    cpu_millicores: int = 4000  # per slice pod; its decoding processes
    memory: str = "8GiB"
    backoff_limit_per_index: int = 3
    active_deadline_seconds: int = 86_400
    publish_wait_seconds: int = 86_400
    ttl_seconds_after_finished: int = 7 * 86_400
    queue: str | None = None  # None: the stack's default LocalQueue when it runs Kueue


def _bucket(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


def pack_service_account(spec: PackJobSpec, facts: ClusterFacts) -> str:
    """The packs' own account (its role writes only the stack's packInto buckets) for a pack into AWS S3 where the
    stack has one; otherwise the Jobs' account (COS: the HMAC Secret is the credential)."""
    if facts.pack_service_account is None or facts.in_object_store(_bucket(spec.dest)):
        return facts.job_service_account
    if _bucket(spec.dest) not in facts.pack_buckets:
        raise JobSpecError("dest", f"{_bucket(spec.dest)} is not a bucket packs may write on stack {facts.stack} "
                                   f"(those with packInto: true in storage.buckets: "
                                   f"{', '.join(facts.pack_buckets)})")
    return facts.pack_service_account


def check_pack_spec(spec: PackJobSpec, facts: ClusterFacts) -> int:
    """Raise JobSpecError naming the field; returns the shard size in bytes."""
    if not is_dns1035_label(spec.name, max_length=40):
        raise JobSpecError("name", f"{spec.name!r}: lowercase letters, digits and '-', at most 40, starting with a "
                                   "letter")
    for field, uri in (("source", spec.source), ("dest", spec.dest)):
        if not uri.startswith("s3://") or not _bucket(uri):
            raise JobSpecError(field, f"{uri!r} is not an s3://bucket/prefix URI")
    if facts.in_object_store(_bucket(spec.source)) != facts.in_object_store(_bucket(spec.dest)):
        raise JobSpecError("dest", "source and dest must be in the same object store (one endpoint per pod)")
    if not 1 <= spec.slices <= 1000:
        raise JobSpecError("slices", f"{spec.slices}: 1..1000")
    if not 1 <= spec.image_size <= 8192:
        raise JobSpecError("imageSize", f"{spec.image_size}: 1..8192")
    if not 500 <= spec.cpu_millicores <= 256_000:
        raise JobSpecError("cpu", f"{spec.cpu_millicores}m: 500m..256")
    try:
        shard_bytes = parse_size(spec.shard_size, 1 << 10, 64 << 30)
    except argparse.ArgumentTypeError as exc:
        raise JobSpecError("shardSize", str(exc)) from None
    try:
        parse_size(spec.memory, 1 << 30, 4 << 40)
    except argparse.ArgumentTypeError as exc:
        raise JobSpecError("memory", str(exc)) from None
    if not any(pool.gpu_type is None for pool in facts.pools):
        raise JobSpecError("slices", f"stack {facts.stack} has no CPU pool to pack on")
    if facts.local_queues is not None and spec.queue is not None and spec.queue not in facts.local_queues:
        raise JobSpecError("queue", f"{spec.queue} is not a LocalQueue of stack {facts.stack}")
    pack_service_account(spec, facts)
    return shard_bytes


def pack_job_name(spec: PackJobSpec) -> str:
    digest = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:8]
    return f"pack-{spec.name}-{digest}"


def render_pack_job(spec: PackJobSpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """[the slices' Indexed Job, the publish Job]. Raises JobSpecError (field name) for a spec that cannot run."""
    shard_bytes = check_pack_spec(spec, facts)
    name = pack_job_name(spec)
    queue = spec.queue if spec.queue is not None else (facts.local_queue if facts.kueue else None)
    # Scratch holds the shard being written and the two being uploaded (ShardStream's in_flight), plus 1 GiB.
    scratch = 3 * shard_bytes + GIB
    memory = parse_size(spec.memory, 1 << 30, 4 << 40)
    tool, pack_args = ("pack", [spec.source, spec.dest, "--layout", spec.layout, "--size", str(spec.image_size),
                                "--shard-size", f"{shard_bytes}B", "--no-progress"])
    if spec.layout == "records":
        tool, pack_args = "pack-tables", _tables_args(spec)
    env: list[dict[str, Any]] = []
    env_from: list[dict[str, Any]] = []
    if facts.in_object_store(_bucket(spec.dest)):
        if facts.object_store_endpoint:
            pack_args += ["--endpoint-url", facts.object_store_endpoint]
        if facts.object_store_secret:
            env_from = [{"secretRef": {"name": facts.object_store_secret}}]
    elif facts.region:
        env = [{"name": "AWS_REGION", "value": facts.region}]
    workers = max(1, spec.cpu_millicores // 1000)
    slices = _job(spec, facts, name, queue, component="pack",
                  command=["python", "-m", "workloads.data", tool, *pack_args, "--shard-count", str(spec.slices),
                           "--workers", str(workers), "--scratch", SCRATCH_DIR],
                  cpu=spec.cpu_millicores, memory=memory, scratch=scratch,
                  env=[*env, {"name": "PACK_METRICS_PORT", "value": str(PACK_METRICS_PORT)},
                       METRICS_ADDR_ENV], env_from=env_from)
    slices["spec"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "metrics-pack", "containerPort": PACK_METRICS_PORT, "protocol": "TCP"}]
    slices["spec"].update({"completionMode": "Indexed", "completions": spec.slices, "parallelism": spec.slices,
                           "backoffLimitPerIndex": spec.backoff_limit_per_index, "maxFailedIndexes": spec.slices,
                           "activeDeadlineSeconds": spec.active_deadline_seconds})
    slices["spec"]["podFailurePolicy"]["rules"].insert(0, {
        "action": "FailIndex",
        "onExitCodes": {"containerName": PACK_CONTAINER, "operator": "In", "values": [CONFIG_ERROR_EXIT_CODE]}})
    publish = _job(spec, facts, f"{name}-publish", queue, component="pack-publish",
                   command=["python", "-m", "workloads.data", tool, *pack_args, "--publish", "--wait",
                            str(spec.publish_wait_seconds), "--scratch", SCRATCH_DIR],
                   cpu=1000, memory=max(2 * GIB, memory // 4), scratch=GIB, env=env, env_from=env_from)
    publish["spec"].update({"backoffLimit": 3, "activeDeadlineSeconds": spec.publish_wait_seconds + 3600})
    publish["spec"]["podFailurePolicy"]["rules"].insert(0, {
        "action": "FailJob",
        "onExitCodes": {"containerName": PACK_CONTAINER, "operator": "In", "values": [CONFIG_ERROR_EXIT_CODE]}})
    return [slices, publish]


def _tables_args(spec: PackJobSpec) -> list[str]:
    """pack-tables' arguments of a records pack (Parquet, Arrow IPC, JSONL, npy tables under `source`)."""
    if not spec.fields:
        raise JobSpecError("fields", "a records pack declares its fields (a JSON list, as pack-tables --fields)")
    if spec.images is not None and not spec.images.startswith("s3://"):
        raise JobSpecError("images", f"{spec.images!r} is not an s3://bucket/prefix URI")
    if not 1 <= spec.shard_rows <= 1 << 24:
        raise JobSpecError("shardRows", f"{spec.shard_rows}: 1..{1 << 24}")
    args = [spec.source, spec.dest, "--fields", spec.fields, "--shard-rows", str(spec.shard_rows), "--no-progress"]
    if spec.map_hook:
        args += ["--map", spec.map_hook]
    for column in spec.image_columns:
        args += ["--image-column", column]
    if spec.images:
        args += ["--images", spec.images]
    return args


def _job(spec: PackJobSpec, facts: ClusterFacts, name: str, queue: str | None, *, component: str,
         command: list[str], cpu: int, memory: int, scratch: int, env: list[dict[str, Any]],
         env_from: list[dict[str, Any]]) -> dict[str, Any]:
    prefix = facts.label_prefix
    labels = app_labels("ml-cluster-pack", component, facts.stack, prefix, instance=name,
                        managed_by="ml-cluster-submit")
    resources = {"cpu": f"{cpu}m", "memory": format_bytes(memory), "ephemeral-storage": format_bytes(scratch + GIB)}
    container: dict[str, Any] = {
        "name": PACK_CONTAINER,
        "image": spec.image,
        "command": command,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": restricted_container(),
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_DIR}, TMP_MOUNT],
    }
    if env:
        container["env"] = env
    if env_from:
        container["envFrom"] = env_from
    job_labels = dict(labels)
    annotations = {"pulumi.com/skipAwait": "true"}
    if queue is not None:
        job_labels[KUEUE_QUEUE_LABEL] = queue
        annotations[queue_annotation(prefix)] = queue
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": facts.namespace, "labels": job_labels, "annotations": annotations},
        "spec": {
            "suspend": queue is not None,  # Kueue unsuspends it once admitted
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            # A Spot reclaim, a preemption or a drain: retried, not counted (the rerun resumes).
            "podFailurePolicy": {"rules": [ignore_disruption_target()]},
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    # SIGTERM: the packer removes its temporaries and stops; complete shards stay, with records.
                    **run_once_pod(pack_service_account(spec, facts), 60),
                    "securityContext": restricted_pod(),
                    "affinity": required_node_affinity({"key": f"{prefix}/gpu-type", "operator": "DoesNotExist"}),
                    "containers": [container],
                    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": format_bytes(scratch)}},
                                {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }
