"""The containers of a training pod: the trainer (command, arguments, environment, ports) and the stager (an
initContainer that copies the dataset, or the native sidecar that caches it). Pure functions of the spec, the
cluster facts and the gang's address (which the controller wrapper decides)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from workloads.cli import size_arg
from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.defaults import HOME_ENV, METRICS_ADDR_ENV, TMP_MOUNT, pull_policy, restricted_container
from workloads.jobspec.fabric import Fabric
from workloads.jobspec.fields import (
    CACHE_START_TIMEOUT_S,
    CONFIG_ERROR_EXIT_CODE,
    DECODED_MOUNT,
    DISRUPTION_EXIT_CODE,
    GIB,
    RENDEZVOUS_JOIN_TIMEOUT_S,
    RENDEZVOUS_PORT,
    STAGE_CONTAINER,
    STAGE_METRICS_PORT,
    STAGE_METRICS_PORT_NAME,
    STAGER_RESOURCES,
    STOP_MARGIN_S,
    TRAIN_CONTAINER,
    TRAIN_METRICS_PORT,
    JobSpecError,
    train_metrics_port_name,
)
from workloads.jobspec.launcher import BUNDLED_TRAINER, launched_command
from workloads.jobspec.spec import TrainingJobSpec
from workloads.quantity import quantity_bytes

Env = list[dict[str, Any]]


@dataclass(frozen=True)
class GangAddress:
    """How the pods of a multi-node gang find node rank 0 and their own node rank: the controller decides (an
    Indexed Job's pod hostnames and completion index; a JobSet's are others)."""

    master: str  # DNS name of node rank 0's pod: torchrun's c10d rendezvous endpoint
    node_rank_field: str  # the pod field (a fieldRef path) holding this pod's node rank
    subdomain: str  # the headless Service the pods' hostnames live under


def image_fields(spec: TrainingJobSpec, facts: ClusterFacts) -> dict[str, str]:
    if spec.image is not None:
        image = spec.image
    elif facts.image_repository is None:
        raise JobSpecError("imageTag", f"stack {facts.stack} has no image registry: give a full image reference")
    else:
        image = f"{facts.image_repository}:{spec.image_tag}"
    return {"image": image, "imagePullPolicy": pull_policy(image)}


def object_store_env(facts: ClusterFacts, uri: str) -> tuple[Env, Env, str | None]:
    """(env, envFrom, endpoint) for a container that talks to the bucket of `uri`: the region on AWS S3 (the
    Jobs' role answers); the HMAC Secret and the endpoint on the S3-compatible store. One container talks to one
    store: the Secret's keys and endpoint would send an S3 request to COS."""
    bucket = uri.removeprefix("s3://").split("/", 1)[0]
    if facts.in_object_store(bucket):
        env_from = [{"secretRef": {"name": facts.object_store_secret}}] if facts.object_store_secret else []
        return [], env_from, facts.object_store_endpoint
    return ([{"name": "AWS_REGION", "value": facts.region}] if facts.region else []), [], None


def _stage_from_store(container: dict[str, Any], spec: TrainingJobSpec, facts: ClusterFacts) -> list[str]:
    """The stager's command for an s3:// dataset (and its ports and environment, set on `container`)."""
    dataset = spec.dataset
    assert dataset is not None
    # A mixture: one stager for every source (DEST/0, DEST/1, ...), one budget (workloads/data/moving/mixture_stage.py).
    uris = [str(source.uri) for source in dataset.mixture] if dataset.mixture else [str(dataset.uri)]
    stores = {facts.in_object_store(uri.removeprefix("s3://").split("/", 1)[0]) for uri in uris}
    if len(stores) > 1:
        raise JobSpecError("dataset.mixture", "every source in one object store (one endpoint per stager)")
    command = ["python", "-m", "workloads.data", "stage", *uris, dataset.mount_path,
               "--workers", str(dataset.stager_workers)]
    env, env_from, endpoint = object_store_env(facts, uris[0])
    if endpoint:
        command += ["--endpoint-url", endpoint]
    command += ["--metrics-port", str(STAGE_METRICS_PORT)]
    container["ports"] = [{"name": STAGE_METRICS_PORT_NAME, "containerPort": STAGE_METRICS_PORT, "protocol": "TCP"}]
    if dataset.has_sidecar():
        # The cache: at most stagedSize on disk, to the byte (a bare number is GiB: whole GiB are written so),
        # fetched in the order the trainer plans to read; --linger: serve until the pod stops it (an exiting sidecar
        # restarts).
        budget = quantity_bytes(dataset.staged_size or "0")
        command += ["--budget", str(budget // GIB) if budget % GIB == 0 else f"{budget}B", "--linger"]
        container["restartPolicy"] = "Always"  # native sidecar: runs beside the trainer, stops after it
    container["env"] = [HOME_ENV, METRICS_ADDR_ENV, *env]
    if env_from:
        container["envFrom"] = env_from
    return command


CHECKPOINT_VOLUME = "checkpoints"


def dataset_claim_volume(spec: TrainingJobSpec) -> str:
    """The pod volume that holds the dataset's claim: the checkpoints' volume when the checkpoint names the same
    claim (prod's FSx for Lustre: one volume, a read-only mount of its dataset directory and a read-write one for
    the checkpoints, not one PV mounted twice as two volumes), else its own (`dataset` read in place, `dataset-source`
    copied onto NVMe)."""
    dataset, checkpoint = spec.dataset, spec.checkpoint
    assert dataset is not None and dataset.claim_name is not None
    if checkpoint is not None and checkpoint.claim_name == dataset.claim_name:
        return CHECKPOINT_VOLUME
    return "dataset" if dataset.staging == "none" else "dataset-source"


def stage_container(spec: TrainingJobSpec, facts: ClusterFacts, scratch_mount: dict[str, Any]) -> dict[str, Any]:
    dataset = spec.dataset
    assert dataset is not None and dataset.staging != "none"
    container: dict[str, Any] = {
        "name": STAGE_CONTAINER,
        **image_fields(spec, facts),
        "securityContext": restricted_container(spec.read_only_root_filesystem),
        "volumeMounts": [scratch_mount, TMP_MOUNT],
        # Small and Burstable: staging is network-bound; the scratch bytes are in the train container's limit.
        "resources": {"requests": dict(STAGER_RESOURCES), "limits": dict(STAGER_RESOURCES)},
    }
    if dataset.uri is not None or dataset.mixture:
        command = _stage_from_store(container, spec, facts)
    else:
        command = ["cp", "-a", "/mnt/dataset-source/.", dataset.mount_path + "/"]
        container["volumeMounts"] = [
            scratch_mount,
            TMP_MOUNT,
            {"name": dataset_claim_volume(spec), "mountPath": "/mnt/dataset-source", "readOnly": True,
             **({"subPath": dataset.sub_path.rstrip("/")} if dataset.sub_path else {})},
        ]
    container["command"] = command
    return container


def train_command(spec: TrainingJobSpec) -> list[str] | None:
    """A gang runs under torchrun in-process (workloads.train.launch, which passes the workers' config-error and
    disruption exit codes on: torchrun alone exits 1), reading its options from PET_* (set below), one process per
    GPU: the bundled trainer, or your command inside it (workloads/jobspec/launcher.py) unless `launcher: none`."""
    if spec.command is not None:
        return launched_command(spec.command) if spec.under_launcher() else list(spec.command)
    if spec.is_gang():
        return list(BUNDLED_TRAINER)
    return None  # the image's entrypoint: python -m workloads.train


def train_args(spec: TrainingJobSpec) -> list[str]:
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


def rendezvous_conf(spec: TrainingJobSpec) -> str:
    """torchrun's --rdzv-conf: how long a pod waits for the gang, and (elastic) for the nodes past minNodes."""
    conf = f"join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S}"
    if spec.is_elastic():
        conf += f",last_call_timeout={spec.elastic_wait_seconds}"
    return conf


def _gang_env(spec: TrainingJobSpec, gang: GangAddress, run_name: str) -> Env:
    """torchrun's c10d rendezvous across the gang's nodes (PET_*: its options), one process per GPU."""
    return [
        {"name": "MASTER_ADDR", "value": gang.master},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": gang.node_rank_field}}},
        # elastic: torchrun's MIN:MAX, the c10d rendezvous completing with MIN+ nodes after the wait
        {"name": "PET_NNODES", "value": f"{spec.min_nodes}:{spec.nodes}" if spec.is_elastic() else str(spec.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(max(spec.gpus, 1))},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_RDZV_ENDPOINT", "value": f"{gang.master}:{RENDEZVOUS_PORT}"},
        {"name": "PET_RDZV_ID", "value": run_name},
        # A lost rank restarts every pod's workers at one re-formed rendezvous, which waits this long for all.
        {"name": "PET_MAX_RESTARTS", "value": str(spec.rank_restarts)},
        {"name": "PET_RDZV_CONF", "value": rendezvous_conf(spec)},
        {"name": "COLLECTIVE_TIMEOUT_SECONDS", "value": str(spec.collective_timeout_seconds)},
    ]


def _data_env(spec: TrainingJobSpec) -> Env:
    env: Env = []
    if spec.dataset is not None:
        env.append({"name": "DATA_DIR", "value": spec.dataset.mount_path})
        env.append({"name": "DATA_STAGING", "value": spec.dataset.staging})
        if spec.dataset.mixture:
            env.append({"name": "DATA_MIXTURE", "value": json.dumps(
                [source.model_dump(exclude_none=True, exclude={"bucket", "prefix"})  # resolved into uri
                 for source in spec.dataset.mixture], sort_keys=True)})
    if spec.checkpoint is not None:
        if spec.checkpoint.claim_name is not None:
            env.append({"name": "CHECKPOINT_DIR", "value": spec.checkpoint.mount_path})
        else:
            env.append({"name": "CHECKPOINT_URI", "value": spec.checkpoint.uri})
    return env


def train_env(spec: TrainingJobSpec, facts: ClusterFacts, gang: GangAddress, run_name: str) -> Env:
    env: Env = [{"name": name, "value": value} for name, value in sorted(spec.env.items())]
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for name, ref in sorted(spec.secret_env.items())
    ]
    env.append({"name": "CONFIG_ERROR_EXIT_CODE", "value": str(CONFIG_ERROR_EXIT_CODE)})
    env.append({"name": "DISRUPTION_EXIT_CODE", "value": str(DISRUPTION_EXIT_CODE)})
    env.append(HOME_ENV)
    env += [{"name": "METRICS_PORT", "value": str(TRAIN_METRICS_PORT)}, METRICS_ADDR_ENV]
    env += _data_env(spec)
    if spec.nodes > 1:
        env += _gang_env(spec, gang, run_name)
    elif spec.gpus > 1 or spec.under_launcher():  # one node: torchrun's standalone rendezvous, one process per GPU
        env += [{"name": "PET_STANDALONE", "value": "1"},
                {"name": "PET_NPROC_PER_NODE", "value": str(max(spec.gpus, 1))}]
    if spec.under_launcher():
        # torchrun's agent forwards SIGTERM to the workers, then SIGKILLs them after this (its default: 30 s)
        env.append({"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                    "value": str(max(1, spec.grace_seconds() - STOP_MARGIN_S))})
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        env += object_store_env(facts, spec.checkpoint.uri)[0]
    return env


def _train_ports(spec: TrainingJobSpec) -> list[dict[str, Any]]:
    # One metrics port per trainer process (torchrun: one per GPU), named so a PodMonitor can list them.
    ports = [{"name": train_metrics_port_name(rank), "containerPort": TRAIN_METRICS_PORT + rank, "protocol": "TCP"}
             for rank in range(max(spec.gpus, 1))]
    if spec.nodes > 1:
        ports.append({"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"})
    return ports


def train_container(spec: TrainingJobSpec, facts: ClusterFacts, gang: GangAddress, run_name: str, fabric: Fabric,
                    limits: dict[str, str], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    train: dict[str, Any] = {
        "name": TRAIN_CONTAINER,
        **image_fields(spec, facts),
        # the spec's own env wins over the fabric's defaults (a user may tune libfabric or NCCL)
        "env": [*train_env(spec, facts, gang, run_name),
                *({"name": n, "value": v} for n, v in fabric.env if n not in spec.env and n not in spec.secret_env)],
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "securityContext": restricted_container(spec.read_only_root_filesystem),
        "volumeMounts": mounts,
    }
    command = train_command(spec)
    if command is not None:
        train["command"] = command
    args = train_args(spec)
    if args:
        train["args"] = args
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        object_env, object_env_from, endpoint = object_store_env(facts, spec.checkpoint.uri)
        if endpoint:  # boto3 reads it: the trainer's checkpoint mirror talks to COS
            object_env.append({"name": "AWS_ENDPOINT_URL_S3", "value": endpoint})
        train["env"] = [*train["env"], *(e for e in object_env if e not in train["env"])]
        if object_env_from:
            train["envFrom"] = object_env_from
    train["ports"] = _train_ports(spec)
    return train
