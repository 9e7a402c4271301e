"""trainer.kubeflow.org/v1alpha1 TrainJob on a training runtime (the stack installs Kubeflow Trainer v2:
ml-cluster:jobControllers.trainer). Semantics cited from kubeflow/trainer tag v2.3.0.

Trainer turns a TrainJob into a JobSet named after it: the runtime's template.spec (a JobSet spec) with the
TrainJob's overrides (pkg/runtime/framework/plugins/jobset/jobset.go:325-421). So a runtime's template is this
project's JobSet spec (workloads.jobspec.controllers.jobset) around the same pod template, with the names Trainer
looks for: the replicated Job and the trainer container are both `node` (pkg/constants/constants.go:68-69), the
Job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`. Trainer then sets the `node` container's
image, command and args from the TrainJob's `trainer` (plugins/jobset/builder.go:113-155) and upserts, in place or
at the end, PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>` and
PET_MASTER_PORT 29500 (plugins/torch/torch.go:145-177, pkg/apply/apply.go:79-87). The failure and success policies
and the network of the runtime's JobSet spec are kept, so a TrainJob restarts and counts like a JobSet.

Two uses:
- a Job spec of kind TrainJob: a namespaced TrainingRuntime built from the spec's own pod (name = the run's) and a
  TrainJob naming it; the pod is the Indexed Job's, the trainer container renamed `node`.
- the stack's ClusterTrainingRuntimes (`cluster_runtime`), for TrainJobs the stack never saw (the Kubeflow SDK,
  NeMo-Run): the pod of a runtime spec per GPU type, its rendezvous address taken from the JobSet's name at run
  time (Trainer's PET_MASTER_ADDR, defined first so later variables can use it).
"""

from __future__ import annotations

import copy
from dataclasses import replace

from workloads.jobspec.containers import GangAddress
from workloads.jobspec.controllers import jobset
from workloads.jobspec.controllers.indexed_job import COMPLETION_INDEX
from workloads.jobspec.fields import RENDEZVOUS_PORT, TRAIN_CONTAINER, JobSpecError
from workloads.jobspec.network import job_network_policy
from workloads.jobspec.pod import Manifest, PodTemplate
from workloads.jobspec.queue import queued_metadata

API_VERSION, KIND, PLURAL = "trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs"
GROUP = API_VERSION.split("/")[0]
RUNTIME_KIND, CLUSTER_RUNTIME_KIND = "TrainingRuntime", "ClusterTrainingRuntime"
NODE = "node"  # Trainer's replicated Job and trainer container (pkg/constants/constants.go:68-69)
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # constants.LabelTrainJobAncestor
ANCESTOR_TRAINER = "trainer"  # constants.AncestorTrainer (constants.go:64-66)
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
# A runtime's pods learn their JobSet's (= their TrainJob's) name from the label JobSet sets on them.
_RUN_NAME_ENV = {"name": "TRAINJOB_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{jobset.JOBSET_NAME_LABEL}']"}}}
MASTER_FROM_RUN = f"$(TRAINJOB_NAME)-{NODE}-0-0.$(TRAINJOB_NAME)"


def gang_address(run_name: str, namespace: str) -> GangAddress:
    """The JobSet Trainer makes is named after the TrainJob, its trainer role `node`."""
    return jobset.gang_address(run_name, namespace, role=NODE)


def runtime_address() -> GangAddress:
    """For a runtime shared by many TrainJobs: rank 0 through Trainer's PET_MASTER_ADDR (defined first in the
    container's env by `_node_pod`, so `$(PET_MASTER_ADDR)` expands)."""
    return GangAddress(master="$(PET_MASTER_ADDR)", node_rank_field=f"metadata.annotations['{COMPLETION_INDEX}']",
                       subdomain="")


def pod_selector(run_name: str) -> str:
    return jobset.pod_selector(run_name)


def _node_pod(pod: PodTemplate, shared: bool) -> PodTemplate:
    """`pod` with its trainer container renamed `node`; `shared`: addressed through Trainer's variables (a runtime
    many TrainJobs use), no subdomain of its own (JobSet sets it, jobset_controller.go:952-956)."""
    template = copy.deepcopy(pod.template)
    spec = template["spec"]
    [train] = [c for c in spec["containers"] if c["name"] == TRAIN_CONTAINER]
    train["name"] = NODE
    if shared:
        spec.pop("subdomain", None)
        env = [e for e in train.get("env", []) if e["name"] not in ("PET_MASTER_ADDR", "PET_MASTER_PORT")]
        for item in env:
            if item["name"] == "PET_RDZV_ID":
                item["value"] = "$(TRAINJOB_NAME)"
        train["env"] = [_RUN_NAME_ENV, {"name": "PET_MASTER_ADDR", "value": MASTER_FROM_RUN},
                        {"name": "PET_MASTER_PORT", "value": str(RENDEZVOUS_PORT)}, *env]
    return replace(pod, template=template)


def runtime_spec(pod: PodTemplate, shared: bool = False) -> Manifest:
    """A (Cluster)TrainingRuntime's spec around `pod`: torch, `nodes` by default, the JobSet spec of a gang."""
    node = _node_pod(pod, shared)
    return {
        "mlPolicy": {"numNodes": pod.spec.nodes, "torch": {}},
        "template": {"spec": jobset.jobset_spec(node, role=NODE, job_labels={ANCESTOR_LABEL: ANCESTOR_TRAINER},
                                                container=NODE)},
    }


def cluster_runtime(pod: PodTemplate, name: str) -> Manifest:
    """A ClusterTrainingRuntime around the pod of a runtime spec (one per GPU type; one with the staging cache)."""
    labels = {**pod.labels, FRAMEWORK_LABEL: "torch"}
    labels.pop("app.kubernetes.io/instance", None)
    return {"apiVersion": API_VERSION, "kind": CLUSTER_RUNTIME_KIND,
            "metadata": {"name": name, "labels": labels}, "spec": runtime_spec(pod, shared=True)}


def trainer_overrides(pod: PodTemplate) -> Manifest:
    """The TrainJob's `trainer`: the node count and processes per node the runtime's pod was built with (Trainer
    rewrites PET_NNODES and PET_NPROC_PER_NODE from them, torch.go:145-151)."""
    return {"numNodes": pod.spec.nodes, "numProcPerNode": max(pod.spec.gpus, 1)}


def wrap(pod: PodTemplate) -> list[Manifest]:
    """The TrainJob (first), the namespaced TrainingRuntime it runs on, and a multi-node gang's NetworkPolicy."""
    spec, facts = pod.spec, pod.facts
    if spec.is_elastic():
        raise JobSpecError("minNodes", "a TrainJob cannot be elastic: Trainer sets PET_NNODES to the fixed numNodes "
                                       "(kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go:145-148),"
                                       " so torchrun would never accept fewer nodes; use kind JobSet or Job")
    jobset.check_pod_names(spec, pod.name, NODE)
    labels, annotations, suspend = queued_metadata(spec, facts, pod.labels)
    runtime = {"apiVersion": API_VERSION, "kind": RUNTIME_KIND,
               "metadata": {"name": pod.name, "namespace": facts.namespace,
                            "labels": {**pod.labels, FRAMEWORK_LABEL: "torch"}},
               "spec": runtime_spec(pod)}
    train_job = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pod.name, "namespace": facts.namespace, "labels": labels, "annotations": annotations},
        "spec": {"suspend": suspend,
                 "runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": pod.name},
                 "trainer": trainer_overrides(pod)},
    }
    manifests: list[Manifest] = [train_job, runtime]
    if spec.nodes > 1:
        policy = job_network_policy(spec, facts, pod.name, pod.labels)
        if policy is not None:
            manifests.append(policy)
    return manifests
