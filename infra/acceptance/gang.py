"""The chaos step's gang: the default spec derived from the stack's GPU pool, and the two checks a run makes before
it starts, so an hour of GPU nodes is never spent to fail at the chaos step: the spec fits one of the stack's GPU
pools (its type, GPUs per node, nodes within the pool's maxSize), and its dataset is in place (the packed dataset's
manifest.json answers a HEAD in S3; a dataset in the stack's own buckets or volumes cannot be there before this
run's `up` creates them, so it is refused).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infra.acceptance.plan import GpuPool, Options, PoolFit
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.loading import parse_spec
from workloads.jobspec.spec import TrainingJobSpec

GANG_NAME = "acceptance-gang"
GANG_FILE = "gang-job.yaml"
STAGED = "20Gi"  # the stager's cache budget on each node: training starts on the first shards, whatever the size
S3_TIMEOUT_S = 20


class GangError(ValueError):
    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def checkpoint_claim(volume_names: Sequence[str]) -> str | None:
    """The shared volume the default gang checkpoints to: one named for checkpoints, else the first (EFS: rename
    works), None when the stack has none."""
    named = [name for name in volume_names if "checkpoint" in name] or list(volume_names)
    return named[0] if named else None


def default_gang_spec(options: Options, pool: GpuPool, claim: str | None, dataset: str | None) -> dict[str, Any]:
    """The bundled trainer as a gang on the stack's GPU pool (the pool the all-reduce ran on: its nodes, all their
    GPUs), on the packed dataset at `dataset` (GANG_DATASET), checkpointing often enough that a lost node costs a
    few steps; ends by its deadline if the chaos step's delete never came."""
    spec: dict[str, Any] = {
        "name": GANG_NAME, "imageTag": options.image_tag,
        "args": ["--model", "resnet50", "--epochs", "1000", "--batch-size", str(64 * pool.gpus),
                 "--checkpoint-every", "50"],
        "nodes": pool.nodes, "gpus": pool.gpus, "gpuType": pool.gpu_type, "shmSize": "8Gi",
        "backoffLimit": 4, "activeDeadlineSeconds": 5400}
    if dataset is not None:
        spec["dataset"] = {"uri": dataset, "mountPath": "/data/gang", "staging": "cache", "stagedSize": STAGED}
    if claim is not None:
        spec["checkpoint"] = {"claimName": claim}
    return spec


def default_gang_problems(pool: GpuPool, claim: str | None, dataset: str | None, stack: str) -> list[str]:
    """Why the default gang cannot run on this stack as asked (no dataset given, no volume for its checkpoints)."""
    problems = []
    if dataset is None:
        problems.append("--gang-dataset: the chaos step's gang trains on a packed dataset that is in S3 before the "
                        f"run: pass GANG_DATASET=s3://bucket/prefix (a packed dataset, its {MANIFEST_NAME} at "
                        "that prefix: docs/data-tools.md), or GANG_SPEC=<your multi-node spec>")
    if claim is None:
        problems.append(f"--gang-spec: stack {stack} has no shared volume (ml-cluster:storage.sharedVolumes) for the "
                        "default gang's checkpoints, so it could not resume: add one, or pass GANG_SPEC=")
    if pool.nodes < 2:
        problems.append(f"--gang-spec: pool {pool.name} may grow to 1 node: the chaos step's gang then restarts "
                        "whole instead of losing one node of several (maxSize 2 or more shows the gang's restart)")
    return problems


def parse_gang(raw: object, where: str) -> TrainingJobSpec:
    try:
        return parse_spec(raw)
    except JobSpecError as exc:
        raise GangError(f"--gang-spec: {where}" + (f": {exc.path}" if exc.path else ""), exc.reason) from None


def fit_problem(spec: TrainingJobSpec, fits: Sequence[PoolFit], stack: str) -> str | None:
    """Why the gang cannot be placed on any GPU pool of the stack, else None."""
    have = ", ".join(f"{fit.name} ({fit.gpu_type}: up to {fit.max_size} node(s) x {fit.gpus} GPU)" for fit in fits)
    if spec.gpus == 0:
        return "--gang-spec: gpus 0: the chaos step terminates a GPU node under a running gang"
    typed = [fit for fit in fits if spec.gpu_type in (None, fit.gpu_type)]
    if not typed:
        return (f"--gang-spec: asks gpuType {spec.gpu_type}; stack {stack}'s GPU pools have "
                f"{', '.join(sorted({fit.gpu_type for fit in fits})) or 'none'}: pass GANG_SPEC=<a multi-node spec "
                "for them whose dataset is in place>, or leave it out for the default")
    if not any(spec.gpus <= fit.gpus and spec.nodes <= fit.max_size for fit in typed):
        return (f"--gang-spec: asks {spec.nodes} node(s) x {spec.gpus} {spec.gpu_type or 'GPU'}; stack {stack}'s "
                f"pools: {have}: it would wait for nodes the autoscaler cannot start")
    return None


def dataset_sources(spec: TrainingJobSpec) -> tuple[list[str], str | None]:
    """(the dataset's s3:// URIs to check, why it cannot be in place before the run or None)."""
    dataset = spec.dataset
    if dataset is None:
        return [], None
    sources: Sequence[Any] = dataset.mixture or [dataset]
    uris = []
    for index, source in enumerate(sources):
        field = f"dataset.mixture[{index}]" if dataset.mixture else "dataset"
        if source.uri is not None:
            uris.append(source.uri)
        elif getattr(source, "bucket", None) is not None:
            return uris, (f"--gang-spec: {field}.bucket: {source.bucket} is one of the stack's buckets, which this "
                          "run's up creates empty: give dataset.uri of a packed dataset already in S3")
        else:
            return uris, (f"--gang-spec: {field}.claimName: {source.claim_name} is a volume of the stack, which this "
                          "run's up creates empty: give dataset.uri of a packed dataset already in S3")
    return uris, None


Head = Callable[[str, str], None]  # HEAD s3://bucket/key: returns, or raises botocore's errors


def dataset_problem(uris: Sequence[str], head: Head) -> str | None:
    """Why a dataset is not in place (its manifest.json is not there, or S3 said no), else None."""
    from botocore.exceptions import BotoCoreError, ClientError

    for uri in uris:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        key = f"{prefix.strip('/')}/{MANIFEST_NAME}" if prefix.strip("/") else MANIFEST_NAME
        try:
            head(bucket, key)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "?"))
            if code in ("404", "NoSuchKey", "NotFound"):
                return (f"--gang-spec: dataset {uri}: no {MANIFEST_NAME} there (not packed, or another prefix): "
                        "the gang would wait on data that never comes")
            if code == "NoSuchBucket":
                return f"--gang-spec: dataset {uri}: no bucket {bucket}"
            return f"--gang-spec: dataset {uri}: S3 answered {code} to HEAD s3://{bucket}/{key}"
        except BotoCoreError as exc:
            return f"--gang-spec: dataset {uri}: S3 did not answer ({type(exc).__name__})"
    return None


def s3_head(region: str) -> Head:
    """HEAD through boto3 with finite timeouts and two attempts (a check, not a transfer)."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=S3_TIMEOUT_S, read_timeout=S3_TIMEOUT_S,
                    retries={"mode": "standard", "total_max_attempts": 2})
    client = boto3.session.Session(region_name=region).client("s3", config=config)
    return lambda bucket, key: client.head_object(Bucket=bucket, Key=key) and None
