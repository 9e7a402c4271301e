"""TrainingJobSpec -> Kubernetes manifests: a typed spec and a pure renderer (dicts in, dicts out).

A spec is declared under `ml-cluster:jobs` in a stack file or as YAML under workloads/jobs/ (camelCase
keys). The renderer turns it, with the ClusterFacts of the cluster it targets, into complete manifests
(a batch/v1 Job, plus a headless Service for multi-node runs) that keep these rules:

- GPU limits equal requests (every resource does: requests == limits), the nvidia.com/gpu toleration,
  a nodeSelector for the GPU type.
- /dev/shm and the optional RAM disk are emptyDirs with medium Memory and a sizeLimit; such volumes are
  charged to the container's memory limit, so the limit must cover process memory + all of them (else
  the spec is rejected, with the numbers).
- Staging onto an NVMe-backed emptyDir. `cache` (the default to reach for with S3/COS): the project's
  stager runs as a native sidecar (`--budget <stagedSize GiB> --linger`), fetching shards in the order
  the trainer will read them and keeping at most stagedSize of them; the trainer starts on the first
  shards (`--wait-for-data`) and may run any number of epochs (a budget below the dataset's size
  refetches what it could not keep). `copy`: an initContainer downloads everything (the stager) or
  copies a PVC (cp -a) before the trainer starts. `rolling`: what older Jobs called a bounded cache;
  rendered as `cache`. Either way the pod selects NVMe nodes, its ephemeral-storage covers stagedSize
  plus headroom, and a sidecar's own cpu, memory and ephemeral-storage are counted beside the trainer.
- Lifecycle: `pulumi.com/skipAwait: "true"`, the spec's hash in the Job name (a changed spec is a new
  Job, never an immutable-field error), restartPolicy Never, a podFailurePolicy that ignores disruptions
  and fails fast on CONFIG_ERROR_EXIT_CODE, ttlSecondsAfterFinished, activeDeadlineSeconds.
- Restricted security context, no hostPath; app.kubernetes.io/* labels and the stack label.
- Multi-node: an Indexed Job (completions = parallelism = nodes), a headless Service, torchrun c10d env.

The package splits along those lines: `fields` (constants, field checks and types), `storage` and `spec` (the
models: dataset and checkpoint locations, the run), `loading` (dicts and files -> specs), `placement` and `fabric`
(which pools, what resources, EFA), `defaults` (the pod defaults every pod of the project shares: labels, security
contexts, tolerations), `containers` and `pod` (the pod-template builder), `controllers/` (one wrapper per controller
kind around that pod), `kinds` (the kind table: a spec's kind -> its wrapper, for `up` and `submit`), `queue` (Kueue
metadata), `network` (NetworkPolicies), `teamdata` (which bucket prefixes a team's Job may name: the stack check's
rule too) and `render` (the entry point: render_job, the hashed name). No Pulumi or infra imports here: the same code
runs in `workloads.submit` and inside the cluster.
"""

from workloads.jobspec.fields import (
    CONFIG_ERROR_EXIT_CODE,
    DISRUPTION_EXIT_CODE,
    RUN_AS_UID,
    STAGE_CONTAINER,
    STAGE_METRICS_PORT,
    STAGE_METRICS_PORT_NAME,
    TMP_DIR,
    TRAIN_CONTAINER,
    TRAIN_METRICS_PORT,
    JobSpecError,
    metrics_ports,
    train_metrics_port_name,
)
from workloads.jobspec.kinds import DEFAULT_KIND, KINDS, Controller, controller_for, controller_of
from workloads.jobspec.loading import load_job_file, parse_spec
from workloads.jobspec.network import EgressRules, job_network_policy, namespace_network_policies
from workloads.jobspec.pod import METRICS_LABEL
from workloads.jobspec.queue import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, job_queue, queue_annotation
from workloads.jobspec.render import job_name, render_job, spec_hash
from workloads.jobspec.spec import RamDiskSpec, SecretKeyRef, TolerationSpec, TrainingJobSpec
from workloads.jobspec.storage import CheckpointSpec, DatasetSpec

__all__ = [
    "Controller",
    "DEFAULT_KIND",
    "KINDS",
    "controller_for",
    "controller_of",
    "EgressRules",
    "METRICS_LABEL",
    "STAGE_METRICS_PORT",
    "STAGE_METRICS_PORT_NAME",
    "TRAIN_METRICS_PORT",
    "metrics_ports",
    "train_metrics_port_name",
    "CONFIG_ERROR_EXIT_CODE",
    "DISRUPTION_EXIT_CODE",
    "RUN_AS_UID",
    "STAGE_CONTAINER",
    "TMP_DIR",
    "TRAIN_CONTAINER",
    "CheckpointSpec",
    "DatasetSpec",
    "JobSpecError",
    "RamDiskSpec",
    "SecretKeyRef",
    "TolerationSpec",
    "TrainingJobSpec",
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "job_name",
    "job_queue",
    "queue_annotation",
    "job_network_policy",
    "load_job_file",
    "namespace_network_policies",
    "parse_spec",
    "render_job",
    "spec_hash",
]
