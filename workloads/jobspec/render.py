"""Spec + ClusterFacts -> the Job (and, multi-node, headless Service) manifests."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from typing import Any

from workloads.cli import size_arg
from workloads.cluster_facts import ClusterFacts
from workloads.health.verdict import HEALTH_LABEL, PASSED
from workloads.jobspec.fabric import gang_pools, job_fabric
from workloads.jobspec.network import job_network_policy
from workloads.jobspec.placement import candidate_pools, check_fits_node, ephemeral_bytes, resolve_resources
from workloads.jobspec.spec import (
    CACHE_START_TIMEOUT_S,
    CONFIG_ERROR_EXIT_CODE,
    DECODED_MOUNT,
    DISRUPTION_EXIT_CODE,
    GIB,
    HASH_LENGTH,
    NODE_LOST_TOLERATION_S,
    RENDEZVOUS_JOIN_TIMEOUT_S,
    RENDEZVOUS_PORT,
    RUN_AS_UID,
    STAGE_CONTAINER,
    STAGE_METRICS_PORT,
    STAGE_METRICS_PORT_NAME,
    STAGER_RESOURCES,
    STOP_MARGIN_S,
    TMP_DIR,
    TRAIN_CONTAINER,
    TRAIN_METRICS_PORT,
    JobSpecError,
    TrainingJobSpec,
    train_metrics_port_name,
)
from workloads.quantity import (
    format_bytes,
    format_millicores,
    quantity_bytes,
)

# Kueue's Job labels (kubernetes-sigs/kueue v0.19.2 pkg/controller/constants/constants.go:23 and :48).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def _labels(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": spec.name,
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/component": "training",
        "app.kubernetes.io/part-of": "ml-cluster",
        "app.kubernetes.io/managed-by": "ml-cluster",
        f"{facts.label_prefix}/stack": facts.stack,
    }


def _security_context(spec: TrainingJobSpec) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": spec.read_only_root_filesystem,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def gpu_health_affinity(label_prefix: str) -> dict[str, Any]:
    """Only nodes the GPU burn-in passed (workloads/health/verdict.py): an unchecked node has no label, a failed
    one `failed`. Required at scheduling, so a node that fails later keeps its running pods (its taint is
    NoSchedule); the burn-in never re-labels a node in service."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": f"{label_prefix}/{HEALTH_LABEL}", "operator": "In", "values": [PASSED]}]}]}}}


def _image_fields(spec: TrainingJobSpec, facts: ClusterFacts) -> dict[str, str]:
    if spec.image is not None:
        image = spec.image
    elif facts.image_repository is None:
        raise JobSpecError("imageTag", f"stack {facts.stack} has no image registry: give a full image reference")
    else:
        image = f"{facts.image_repository}:{spec.image_tag}"
    # A digest never changes: the node's copy is the image. A tag may be re-pointed: ask the registry each time.
    return {"image": image, "imagePullPolicy": "IfNotPresent" if "@sha256:" in image else "Always"}


# HOME moves to the writable /tmp: Python, torch and boto3 write caches and config under it.
_HOME_ENV = {"name": "HOME", "value": TMP_DIR}
# Metrics endpoints listen on every interface of the pod (their default is loopback); the namespace's NetworkPolicy
# admits only the monitoring namespace to these ports.
_METRICS_ADDR_ENV = {"name": "METRICS_ADDR", "value": "0.0.0.0"}
# Discovery by annotation, for a Prometheus configured the classic way (kubernetes_sd + prometheus.io/*): it names one
# port, local rank 0's. The PodMonitor (infra/monitoring/component.py) scrapes every rank and the stager by port name.
METRICS_LABEL = "metrics"
_TMP_MOUNT = {"name": "tmp", "mountPath": TMP_DIR}


def _object_store_env(facts: ClusterFacts, uri: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """(env, envFrom, endpoint) for a container that talks to the bucket of `uri`: the region on AWS S3 (the
    Jobs' role answers); the HMAC Secret and the endpoint on the S3-compatible store. One container talks to one
    store: the Secret's keys and endpoint would send an S3 request to COS."""
    bucket = uri.removeprefix("s3://").split("/", 1)[0]
    if facts.in_object_store(bucket):
        env_from = [{"secretRef": {"name": facts.object_store_secret}}] if facts.object_store_secret else []
        return [], env_from, facts.object_store_endpoint
    return ([{"name": "AWS_REGION", "value": facts.region}] if facts.region else []), [], None


def _stage_container(
    spec: TrainingJobSpec, facts: ClusterFacts, scratch_mount: dict[str, Any]
) -> dict[str, Any]:
    dataset = spec.dataset
    assert dataset is not None and dataset.staging != "none"
    container: dict[str, Any] = {
        "name": STAGE_CONTAINER,
        **_image_fields(spec, facts),
        "securityContext": _security_context(spec),
        "volumeMounts": [scratch_mount, _TMP_MOUNT],
        # Small and Burstable: staging is network-bound; the scratch bytes are in the train container's limit.
        "resources": {"requests": dict(STAGER_RESOURCES), "limits": dict(STAGER_RESOURCES)},
    }
    if dataset.uri is not None:
        command = [
            "python",
            "-m",
            "workloads.data",
            "stage",
            dataset.uri,
            dataset.mount_path,
            "--workers",
            str(dataset.stager_workers),
        ]
        env, env_from, endpoint = _object_store_env(facts, dataset.uri)
        if endpoint:
            command += ["--endpoint-url", endpoint]
        command += ["--metrics-port", str(STAGE_METRICS_PORT)]
        container["ports"] = [{"name": STAGE_METRICS_PORT_NAME, "containerPort": STAGE_METRICS_PORT,
                               "protocol": "TCP"}]
        if dataset.has_sidecar():
            # The cache: at most the budget on disk (whole GiB, rounded up: the headroom covers it), fetched in the
            # order the trainer plans to read; --linger: serve until the pod stops it (an exiting sidecar restarts).
            command += ["--budget", str(math.ceil(quantity_bytes(dataset.staged_size or "0") / GIB)), "--linger"]
            container["restartPolicy"] = "Always"  # native sidecar: runs beside the trainer, stops after it
        container["env"] = [_HOME_ENV, _METRICS_ADDR_ENV, *env]
        if env_from:
            container["envFrom"] = env_from
    else:
        command = ["cp", "-a", "/mnt/dataset-source/.", dataset.mount_path + "/"]
        container["volumeMounts"] = [
            scratch_mount,
            _TMP_MOUNT,
            {"name": "dataset-source", "mountPath": "/mnt/dataset-source", "readOnly": True},
        ]
    container["command"] = command
    return container


def _train_command(spec: TrainingJobSpec) -> list[str] | None:
    if spec.command is not None:
        return list(spec.command)
    if spec.nodes > 1 or spec.gpus > 1:
        # torchrun (in-process, through workloads.train.launch, which passes the workers' config-error and disruption
        # exit codes on: torchrun alone exits 1) reads its options from PET_* (set below); one process per GPU.
        return ["python", "-m", "workloads.train.launch", "--module", "workloads.train"]
    return None  # the image's entrypoint: python -m workloads.train


def _train_args(spec: TrainingJobSpec) -> list[str]:
    """The spec's args; for the project's entrypoint, preceded by the data and checkpoint paths it mounts.

    `--resume` is safe on a first run (no checkpoint: a fresh start) and makes a retried pod continue.
    """
    args = list(spec.args)
    if spec.command is not None:
        return args
    implied: list[str] = []
    if spec.dataset is not None and "--data" not in args:
        implied += ["--data", spec.dataset.mount_path]
    if spec.dataset is not None and spec.dataset.has_sidecar() and "--wait-for-data" not in args:
        # The sidecar writes the manifest once it has the first shards; the trainer may start before that.
        implied += ["--wait-for-data", str(CACHE_START_TIMEOUT_S)]
    if spec.dataset is not None and spec.dataset.decoded_size is not None and "--decode-cache" not in args:
        # In the trainer's size rule (a bare number is GiB), not the quantity's (a bare number is bytes).
        implied += ["--decode-cache", DECODED_MOUNT, "--decode-cache-size",
                    size_arg(quantity_bytes(spec.dataset.decoded_size))]
    checkpoint = spec.checkpoint
    if checkpoint is not None and checkpoint.claim_name is not None and "--checkpoint-dir" not in args:
        implied += ["--checkpoint-dir", checkpoint.mount_path]
    if checkpoint is not None and checkpoint.uri is not None and "--checkpoint-uri" not in args:
        implied += ["--checkpoint-uri", checkpoint.uri]  # written locally, mirrored there, pulled on a new node
    if checkpoint is not None and "--resume" not in args:
        implied.append("--resume")
    return implied + args


def _train_env(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in sorted(spec.env.items())]
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for name, ref in sorted(spec.secret_env.items())
    ]
    env.append({"name": "CONFIG_ERROR_EXIT_CODE", "value": str(CONFIG_ERROR_EXIT_CODE)})
    env.append({"name": "DISRUPTION_EXIT_CODE", "value": str(DISRUPTION_EXIT_CODE)})
    env.append(_HOME_ENV)
    env += [{"name": "METRICS_PORT", "value": str(TRAIN_METRICS_PORT)}, _METRICS_ADDR_ENV]
    if spec.dataset is not None:
        env.append({"name": "DATA_DIR", "value": spec.dataset.mount_path})
        env.append({"name": "DATA_STAGING", "value": spec.dataset.staging})
    if spec.checkpoint is not None:
        if spec.checkpoint.claim_name is not None:
            env.append({"name": "CHECKPOINT_DIR", "value": spec.checkpoint.mount_path})
        else:
            env.append({"name": "CHECKPOINT_URI", "value": spec.checkpoint.uri})
    nproc = max(spec.gpus, 1)
    if spec.nodes > 1:
        master = f"{job_name}-0.{job_name}.{facts.namespace}.svc"
        env += [
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
            {
                "name": "NODE_RANK",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            # elastic: torchrun's MIN:MAX, the c10d rendezvous completing with MIN+ nodes after the wait
            {"name": "PET_NNODES",
             "value": f"{spec.min_nodes}:{spec.nodes}" if spec.is_elastic() else str(spec.nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
            {"name": "PET_RDZV_BACKEND", "value": "c10d"},
            {"name": "PET_RDZV_ENDPOINT", "value": f"{master}:{RENDEZVOUS_PORT}"},
            {"name": "PET_RDZV_ID", "value": job_name},
            # A lost rank restarts every pod's workers at one re-formed rendezvous, which waits this long for all.
            {"name": "PET_MAX_RESTARTS", "value": str(spec.rank_restarts)},
            {"name": "PET_RDZV_CONF", "value": rendezvous_conf(spec)},
            {"name": "COLLECTIVE_TIMEOUT_SECONDS", "value": str(spec.collective_timeout_seconds)},
        ]
    elif spec.gpus > 1:
        env += [{"name": "PET_STANDALONE", "value": "1"}, {"name": "PET_NPROC_PER_NODE", "value": str(nproc)}]
    if spec.command is None and (spec.nodes > 1 or spec.gpus > 1):
        # torchrun's agent forwards SIGTERM to the workers, then SIGKILLs them after this (its default: 30 s)
        env.append({"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                    "value": str(max(1, spec.grace_seconds() - STOP_MARGIN_S))})
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        env += _object_store_env(facts, spec.checkpoint.uri)[0]
    return env


def rendezvous_conf(spec: TrainingJobSpec) -> str:
    """torchrun's --rdzv-conf: how long a pod waits for the gang, and (elastic) for the nodes past minNodes."""
    conf = f"join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S}"
    if spec.is_elastic():
        conf += f",last_call_timeout={spec.elastic_wait_seconds}"
    return conf


def _check_claims(spec: TrainingJobSpec, facts: ClusterFacts) -> None:
    """A claim the namespace does not have leaves the pod Pending forever: reject it up front."""
    if facts.volume_claims is None:
        return
    for field_name, claim in (("dataset.claimName", spec.dataset.claim_name if spec.dataset else None),
                              ("checkpoint.claimName", spec.checkpoint.claim_name if spec.checkpoint else None)):
        if claim and claim not in facts.volume_claims:
            known = ", ".join(sorted(facts.volume_claims)) or "none"
            raise JobSpecError(field_name, f"{claim} is not a claim in namespace {facts.namespace} of stack "
                                           f"{facts.stack} (claims: {known})")


def _resolve_buckets(spec: TrainingJobSpec, facts: ClusterFacts) -> TrainingJobSpec:
    """A dataset or checkpoint named by the stack's logical bucket gets its s3:// URI from the cluster facts."""
    update: dict[str, Any] = {}
    for field, target in (("dataset", spec.dataset), ("checkpoint", spec.checkpoint)):
        if target is None or target.bucket is None:
            continue
        known = facts.buckets or {}
        if target.bucket not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise JobSpecError(f"{field}.bucket", f"{target.bucket!r} is not a bucket of stack {facts.stack} "
                                                  f"(its buckets: {choices})")
        update[field] = target.model_copy(update={"uri": f"s3://{known[target.bucket]}/{target.prefix}"})
    return spec.model_copy(update=update) if update else spec


def _render_manifests(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> list[dict[str, Any]]:
    spec = _resolve_buckets(spec, facts)
    _check_claims(spec, facts)
    pools = gang_pools(spec, candidate_pools(spec, facts))
    fabric = job_fabric(spec, pools)
    cpu, memory = resolve_resources(spec, pools)
    check_fits_node(spec, pools, cpu, memory)
    ephemeral = ephemeral_bytes(spec)
    labels = _labels(spec, facts, job_name)
    prefix = facts.label_prefix

    limits: dict[str, str] = {
        "cpu": format_millicores(cpu),
        "memory": format_bytes(memory),
        "ephemeral-storage": format_bytes(ephemeral),
    }
    if spec.gpus > 0:
        limits["nvidia.com/gpu"] = str(spec.gpus)
    limits.update(fabric.limits)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.shm_bytes())}},
        {"name": "tmp", "emptyDir": {"sizeLimit": spec.ephemeral_storage}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, _TMP_MOUNT]
    if spec.ram_disk is not None:
        volumes.append(
            {
                "name": "ramdisk",
                "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.ram_disk_bytes())},
            }
        )
        mounts.append({"name": "ramdisk", "mountPath": spec.ram_disk.mount_path})

    init_containers: list[dict[str, Any]] = []
    dataset = spec.dataset
    if dataset is not None and dataset.staging != "none":
        # No medium: the emptyDir lives on the kubelet's disk, the NVMe RAID0 on nodes labelled disktype=nvme.
        volumes.append({"name": "dataset", "emptyDir": {"sizeLimit": format_bytes(spec.staged_bytes())}})
        scratch_mount = {"name": "dataset", "mountPath": dataset.mount_path}
        # The trainer writes its read plan for the cache into DEST/.cache/; a copied dataset is read-only.
        mounts.append({**scratch_mount, "readOnly": not dataset.has_sidecar()})
        if dataset.claim_name is not None:
            volumes.append(
                {
                    "name": "dataset-source",
                    "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True},
                }
            )
        init_containers.append(_stage_container(spec, facts, scratch_mount))
        if dataset.decoded_size is not None:
            volumes.append({"name": "decoded", "emptyDir": {"sizeLimit": format_bytes(spec.decoded_bytes())}})
            mounts.append({"name": "decoded", "mountPath": DECODED_MOUNT})
    elif dataset is not None:
        volumes.append(
            {"name": "dataset", "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True}}
        )
        mounts.append({"name": "dataset", "mountPath": dataset.mount_path, "readOnly": True})
    if spec.checkpoint is not None and spec.checkpoint.claim_name is not None:
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}}
        )
        mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint.mount_path})

    train: dict[str, Any] = {
        "name": TRAIN_CONTAINER,
        **_image_fields(spec, facts),
        # the spec's own env wins over the fabric's defaults (a user may tune libfabric or NCCL)
        "env": [*_train_env(spec, facts, job_name),
                *({"name": n, "value": v} for n, v in fabric.env if n not in spec.env and n not in spec.secret_env)],
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "securityContext": _security_context(spec),
        "volumeMounts": mounts,
    }
    command = _train_command(spec)
    if command is not None:
        train["command"] = command
    args = _train_args(spec)
    if args:
        train["args"] = args
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        object_env, object_env_from, endpoint = _object_store_env(facts, spec.checkpoint.uri)
        if endpoint:  # boto3 reads it: the trainer's checkpoint mirror talks to COS
            object_env.append({"name": "AWS_ENDPOINT_URL_S3", "value": endpoint})
        train["env"] = [*train["env"], *(e for e in object_env if e not in train["env"])]
        if object_env_from:
            train["envFrom"] = object_env_from
    # One metrics port per trainer process (torchrun: one per GPU), named so a PodMonitor can list them.
    train["ports"] = [
        {"name": train_metrics_port_name(rank), "containerPort": TRAIN_METRICS_PORT + rank, "protocol": "TCP"}
        for rank in range(max(spec.gpus, 1))
    ]
    if spec.nodes > 1:
        train["ports"].append({"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"})

    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    if spec.gpus > 0:
        gpu_type = spec.gpu_type or pools[0].gpu_type
        if gpu_type:
            node_selector[f"{prefix}/gpu-type"] = gpu_type
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    if spec.is_staged():
        node_selector[f"{prefix}/disktype"] = "nvme"
    if fabric.efa:
        node_selector[f"{prefix}/efa"] = "true"
    tolerations += [
        toleration.model_dump(by_alias=True, exclude_none=True) for toleration in spec.tolerations
    ]
    if spec.nodes > 1:
        own = {toleration.key for toleration in spec.tolerations}
        tolerations += [
            # a gang's node that stopped answering: evicted after a minute, not five (the replacement pod, and with
            # it the whole gang, starts sooner)
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": NODE_LOST_TOLERATION_S}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable") if key not in own
        ]

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": facts.job_service_account,
        # The trainer never calls the Kubernetes API. AWS credentials from EKS Pod Identity arrive through the
        # webhook's own projected token volume (pods.eks.amazonaws.com audience), which this does not remove.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # SIGTERM: finish the step, write and mirror a last checkpoint (sized from the checkpoint: spec.py)
        "terminationGracePeriodSeconds": spec.grace_seconds(),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_UID,
            "runAsGroup": RUN_AS_UID,
            "fsGroup": RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [train],
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.gpus > 0 and facts.gpu_health_gate:
        pod_spec["affinity"] = gpu_health_affinity(prefix)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    if spec.nodes > 1:
        pod_spec["subdomain"] = job_name

    job_labels = dict(labels)
    job_annotations = {"pulumi.com/skipAwait": "true"}
    queue = job_queue(spec, facts)
    held = bool(spec.suspend)
    if queue is not None:
        # The queue is recorded on every queued Job; a held Job gets the label only when `submit start` releases it:
        # Kueue leaves a Job without the label alone (manageJobsWithoutQueueName defaults to false), so it stays
        # suspended until its data is in place. A queued Job is always created suspended: Kueue unsuspends it when the
        # whole gang is admitted.
        job_annotations[queue_annotation(facts.label_prefix)] = queue
        if not held:
            job_labels[KUEUE_QUEUE_LABEL] = queue
        if spec.workload_priority:
            job_labels[KUEUE_PRIORITY_LABEL] = spec.workload_priority
    job_spec: dict[str, Any] = {
        "suspend": held or queue is not None,
        "backoffLimit": spec.backoff_limit,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        # First match wins. A pod's failure that matches no rule counts too.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": TRAIN_CONTAINER,
                        "operator": "In",
                        "values": [CONFIG_ERROR_EXIT_CODE],
                    },
                },
                # Stopped by SIGTERM after a last checkpoint, or a peer of the gang lost: retry, not counted.
                {
                    "action": "Ignore",
                    "onExitCodes": {
                        "containerName": TRAIN_CONTAINER,
                        "operator": "In",
                        "values": [DISRUPTION_EXIT_CODE],
                    },
                },
                # Spot reclaim, preemption, node drain: retry without spending backoffLimit.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # Any other failure of the trainer (a crash, the OOM killer) spends one of backoffLimit.
                {
                    "action": "Count",
                    "onExitCodes": {"containerName": TRAIN_CONTAINER, "operator": "NotIn", "values": [0]},
                },
            ]
        },
        # A replacement pod starts only once the old one has stopped (its last checkpoint written, its rendezvous
        # port free); the only value the API allows with a podFailurePolicy.
        "podReplacementPolicy": "Failed",
        "template": {
            # A running training pod is never a scale-down candidate: evicting it loses the work since the last
            # checkpoint.
            "metadata": {"labels": {**labels, f"{prefix}/{METRICS_LABEL}": "true"},
                         "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                                         "prometheus.io/scrape": "true",
                                         "prometheus.io/port": str(TRAIN_METRICS_PORT),
                                         "prometheus.io/path": "/metrics"}},
            "spec": pod_spec,
        },
    }
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.nodes > 1:
        job_spec.update({"completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes})
    if spec.is_elastic():
        # An elastic gang that finished on fewer nodes leaves an index that never ran (its pod Pending for capacity)
        # or never can (the rendezvous is closed): the Job succeeds when index 0, a member of every formation,
        # succeeds, and the controller removes the lingering pods (batch/v1 successPolicy, GA in Kubernetes 1.33).
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": facts.namespace,
            "labels": job_labels,
            "annotations": job_annotations,
        },
        "spec": job_spec,
    }
    manifests = [job]
    if spec.nodes > 1:
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": job_name, "namespace": facts.namespace, "labels": dict(labels)},
                "spec": {
                    "clusterIP": "None",
                    # Peers must resolve each other while starting up, before any readiness.
                    "publishNotReadyAddresses": True,
                    "selector": {"app.kubernetes.io/instance": job_name},
                    "ports": [
                        {
                            "name": "rendezvous",
                            "port": RENDEZVOUS_PORT,
                            "targetPort": RENDEZVOUS_PORT,
                            "protocol": "TCP",
                        }
                    ],
                },
            }
        )
        policy = job_network_policy(spec, facts, job_name, labels)
        if policy is not None:
            manifests.append(policy)
    return manifests


def queue_annotation(label_prefix: str) -> str:
    """The annotation holding the LocalQueue a held Job joins when `submit start` releases it."""
    return f"{label_prefix}/queue-name"


def job_queue(spec: TrainingJobSpec, facts: ClusterFacts) -> str | None:
    """The Kueue LocalQueue a spec's Job goes through: its own, else the stack's default when the stack runs Kueue."""
    if spec.queue is not None:
        if facts.local_queues is not None and spec.queue not in facts.local_queues:
            known = ", ".join(facts.local_queues) or "none"
            raise JobSpecError("queue", f"{spec.queue} is not a LocalQueue of stack {facts.stack} in namespace "
                                        f"{facts.namespace} (its queues: {known})")
        queue: str | None = spec.queue
    else:
        queue = facts.local_queue if facts.kueue else None
    if spec.workload_priority is not None:
        if queue is None:
            raise JobSpecError("workloadPriority", f"stack {facts.stack} runs no Kueue: a workload priority needs "
                                                   "a queue")
        known_classes = facts.workload_priority_classes
        if known_classes is not None and spec.workload_priority not in known_classes:
            raise JobSpecError("workloadPriority", f"{spec.workload_priority} is not a WorkloadPriorityClass of "
                                                   f"stack {facts.stack} (its classes: "
                                                   f"{', '.join(known_classes) or 'none'})")
    return queue


def spec_hash(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    """A short hash of everything rendered for the spec: any change to the Job's content changes the name."""
    manifests = _render_manifests(spec, facts, spec.name)
    canonical = json.dumps(manifests, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def job_name(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    return f"{spec.name}-{spec_hash(spec, facts)}"


def team_facts(team: str | None, facts: ClusterFacts) -> ClusterFacts:
    """The facts a Job of `team` renders against: the team's namespace, its LocalQueue and its claims only (the
    stack's claims live in the training namespace; a pod cannot mount a claim of another namespace)."""
    if team is None:
        return facts
    if facts.teams is None:
        raise JobSpecError("team", f"{team}: these cluster facts name no teams (read the stack's jobFacts again)")
    if team not in facts.teams:
        raise JobSpecError("team", f"{team} is not a team with a namespace (teams with one: "
                                   f"{', '.join(sorted(facts.teams)) or 'none'})")
    own = facts.teams[team]
    return replace(facts, namespace=own.namespace, local_queue=team if facts.kueue else None,
                   volume_claims=own.volume_claims, teams={team: own})


def render_job(
    spec: TrainingJobSpec, facts: ClusterFacts, *, suspended_by_default: bool = False
) -> list[dict[str, Any]]:
    """The Job (first) and, for multi-node specs, its headless Service and NetworkPolicy; a spec of a `team` in
    that team's namespace.

    `suspended_by_default` decides `spec.suspend` where the spec leaves it unset. Raises JobSpecError (field path).
    """
    facts = team_facts(spec.team, facts)
    if spec.suspend is None:
        spec = spec.model_copy(update={"suspend": suspended_by_default})
    return _render_manifests(spec, facts, job_name(spec, facts))
