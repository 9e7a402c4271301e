"""TrainingJobSpec validation and the Job renderer: the rules, the numbers in the errors, and fuzzing."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.jobs.facts import ALL_FACTS, GIB, dev_facts, onprem_facts, prod_facts
from tests.jobs.jobrules import check_job, check_network_policy, check_service
from workloads.cli import parse_size
from workloads.cluster_facts import facts_from_dict, facts_to_dict
from workloads.jobspec import (
    CONFIG_ERROR_EXIT_CODE,
    DISRUPTION_EXIT_CODE,
    JobSpecError,
    TrainingJobSpec,
    job_name,
    parse_spec,
    render,
    render_job,
)
from workloads.jobspec.fields import HASH_LENGTH
from workloads.quantity import quantity_bytes, quantity_millicores

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
S3_COPY = {"uri": "s3://mlc-dev-datasets/imagenet/", "staging": "copy", "stagedSize": "150Gi"}
S3_CACHE = {"uri": "s3://mlc-prod-datasets/laion/", "staging": "cache", "stagedSize": "400Gi"}


def spec(**fields: Any) -> TrainingJobSpec:
    return parse_spec({"name": "resnet", "image": IMAGE, **fields})


def error_of(fields: dict[str, Any], facts: Any = None) -> JobSpecError:
    with pytest.raises(JobSpecError) as caught:
        parsed = parse_spec({"name": "resnet", "image": IMAGE, **fields})
        render_job(parsed, facts or dev_facts())
    return caught.value


def train_container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("fields", "path", "why"), [
    ({"gpus": "2"}, "gpus", "'2' is text, not a whole number: write 2 without quotes"),
    ({"suspend": "yes"}, "suspend", "'yes' is not a boolean: write true without quotes"),
    ({"suspend": "true"}, "suspend", "'true' is not a boolean: write true without quotes"),
    ({"activeDeadlineSeconds": "15"}, "activeDeadlineSeconds",
     "'15' is text, not a whole number: write 15 without quotes"),
    ({"goodput": {"stepSeconds": "0.5"}}, "goodput.stepSeconds", "'0.5' is text, not a number: write 0.5 without "
                                                                 "quotes"),
])
def test_booleans_and_numbers_written_as_text_are_errors_saying_what_to_write(fields: dict[str, Any], path: str,
                                                                             why: str) -> None:
    """The stack config's rule (workloads/scalars.py), in Job specs too: a spec file or a stack file's `jobs:`."""
    error = error_of(fields)
    assert (error.path, error.reason) == (path, why), str(error)


# --- resources and the memory rule -----------------------------------------------------------------------


def test_gpu_spec_without_cpu_memory_takes_pool_per_gpu_defaults_times_gpus() -> None:
    job, = render_job(spec(gpus=4, gpuType="a100"), prod_facts())
    limits = train_container(job)["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4"
    assert limits["cpu"] == "46"  # 11500m per A100 x 4
    assert limits["memory"] == "560Gi"  # 140Gi per A100 x 4
    assert train_container(job)["resources"]["requests"] == limits


def test_memory_limit_covers_process_shm_and_ram_disk() -> None:
    job, = render_job(spec(gpuType="a100", memory="40Gi", shmSize="8Gi", ramDisk={"size": "16Gi"}),
                      prod_facts())
    pod = job["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["ramdisk"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "ramdisk", "mountPath": "/ramdisk"} in train_container(job)["volumeMounts"]
    assert train_container(job)["resources"]["limits"]["memory"] == "40Gi"


def test_memory_too_small_for_shm_and_ram_disk_is_rejected_with_the_numbers() -> None:
    error = error_of({"memory": "20Gi", "processMemory": "6Gi", "shmSize": "8Gi", "ramDisk": {"size": "8Gi"}})
    assert error.path == "memory"
    assert "20Gi" in str(error) and "6Gi" in str(error) and "8Gi" in str(error) and "22Gi" in str(error)


def test_default_memory_too_small_for_a_big_ram_disk_names_the_default() -> None:
    error = error_of({"ramDisk": {"size": "12Gi"}})  # dev: 14Gi per A10G; 4Gi process + 2Gi shm + 12Gi
    assert error.path == "memory" and "default" in str(error) and "18Gi" in str(error)


def test_shm_default_scales_with_gpus_and_exists_on_cpu_jobs() -> None:
    job, = render_job(spec(gpus=8, gpuType="h100"), prod_facts())
    assert job["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "16Gi"
    cpu_job, = render_job(spec(gpus=0, cpu="4", memory="16Gi"), dev_facts())
    pod = cpu_job["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
    assert "tolerations" not in pod
    assert "nvidia.com/gpu" not in train_container(cpu_job)["resources"]["limits"]


def test_cpu_job_needs_explicit_cpu_and_memory() -> None:
    assert error_of({"gpus": 0}).path == "cpu"
    assert error_of({"gpus": 0, "cpu": "2"}).path == "memory"


def test_pod_bigger_than_any_node_is_rejected() -> None:
    error = error_of({"memory": "64Gi"})  # a g5.xlarge offers 14Gi
    assert error.path == "memory" and "64Gi" in str(error) and "14Gi" in str(error)


# --- pools, GPU type, NVMe staging -----------------------------------------------------------------------


def test_gpu_type_selects_the_pool_and_is_required_when_ambiguous() -> None:
    job, = render_job(spec(gpus=8, gpuType="h100"), prod_facts())
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"ml-cluster.io/gpu-type": "h100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert error_of({"gpus": 8}, prod_facts()).path == "gpuType"
    assert "a100, h100" in str(error_of({"gpuType": "v100"}, prod_facts()))
    assert error_of({"gpus": 2}).path == "gpus"  # g5.xlarge has one GPU


def test_s3_copy_staging_uses_the_stager_on_nvme_with_ephemeral_storage() -> None:
    job, = render_job(spec(dataset=S3_COPY), dev_facts())
    pod = job["spec"]["template"]["spec"]
    stage = pod["initContainers"][0]
    assert stage["command"] == ["python", "-m", "workloads.data", "stage", "s3://mlc-dev-datasets/imagenet/",
                                "/data", "--workers", "16", "--metrics-port", "9449"]
    assert "restartPolicy" not in stage  # a classic init container: training starts after the copy
    assert pod["nodeSelector"]["ml-cluster.io/disktype"] == "nvme"
    scratch = next(volume for volume in pod["volumes"] if volume["name"] == "dataset")
    assert scratch["emptyDir"] == {"sizeLimit": "165Gi"}  # 150Gi + 10% headroom, on the kubelet's (NVMe) disk
    limits = train_container(job)["resources"]["limits"]
    assert limits["ephemeral-storage"] == "175Gi"  # staged + headroom + 10Gi scratch
    assert {"name": "dataset", "mountPath": "/data", "readOnly": True} in train_container(job)["volumeMounts"]
    env = {item["name"]: item.get("value") for item in train_container(job)["env"]}
    assert env["DATA_DIR"] == "/data" and env["DATA_STAGING"] == "copy"
    assert {"name": "AWS_REGION", "value": "us-west-2"} in stage["env"]  # Pod Identity creds, bucket region


def stage_container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["initContainers"][0]


def test_cache_staging_is_a_native_sidecar_with_the_budget_and_trains_many_epochs() -> None:
    job, = render_job(spec(gpus=8, gpuType="a100", dataset=S3_CACHE, args=["--epochs", "30"]), prod_facts())
    check_job(job)
    stage = stage_container(job)
    assert stage["restartPolicy"] == "Always"  # native sidecar: starts before the trainer, stops after it
    assert stage["command"] == ["python", "-m", "workloads.data", "stage", "s3://mlc-prod-datasets/laion/", "/data",
                                "--workers", "16", "--metrics-port", "9449", "--budget", "400", "--linger"]
    # The trainer writes its read plan into DEST/.cache/, so the staged directory is writable for it.
    assert {"name": "dataset", "mountPath": "/data", "readOnly": False} in train_container(job)["volumeMounts"]
    # It may start before the sidecar has the manifest and the first shards: it waits for them.
    args = train_container(job)["args"]
    assert args[args.index("--wait-for-data") + 1] == "600"
    assert args[-2:] == ["--epochs", "30"]
    env = {item["name"]: item.get("value") for item in train_container(job)["env"]}
    assert env["DATA_STAGING"] == "cache"


@pytest.mark.parametrize(("staged", "budget"), [("1500Mi", "1572864000B"), ("100Mi", "104857600B"),
                                                ("2Gi", "2"), ("1.5G", "1500000000B")])
def test_cache_budget_is_the_staged_size_to_the_byte(staged: str, budget: str) -> None:
    """Not rounded up to whole GiB (100Mi was a 1 GiB budget, ten times what the spec allowed on the node)."""
    job, = render_job(spec(dataset={**S3_CACHE, "stagedSize": staged}), dev_facts())
    command = stage_container(job)["command"]
    assert command[command.index("--budget") + 1] == budget
    assert parse_size(budget) == quantity_bytes(staged)  # what the stager reads it as


def test_a_cache_budget_below_the_stagers_smallest_is_a_spec_error() -> None:
    error = error_of({"dataset": {**S3_CACHE, "stagedSize": "512Ki"}})
    assert error.path == "dataset.stagedSize" and "512Ki is below 1Mi" in str(error)


def test_cache_needs_the_staged_size_that_sizes_its_disk() -> None:
    error = error_of({"dataset": {"uri": "s3://mlc-dev-datasets/imagenet/", "staging": "cache"}})
    assert error.path == "dataset.stagedSize" and "budget" in str(error)


def test_rolling_is_the_cache_with_a_budget_and_runs_many_epochs() -> None:
    rolling = {**S3_CACHE, "staging": "rolling"}
    job, = render_job(spec(gpus=8, gpuType="a100", dataset=rolling, args=["--epochs", "3"]), prod_facts())
    check_job(job)
    cache, = render_job(spec(gpus=8, gpuType="a100", dataset=S3_CACHE, args=["--epochs", "3"]), prod_facts())
    assert stage_container(job) == stage_container(cache)
    assert "--window" not in stage_container(job)["command"]
    assert train_container(job)["args"] == train_container(cache)["args"]


def test_copy_from_an_object_store_downloads_everything_before_training() -> None:
    job, = render_job(spec(gpus=8, gpuType="a100", dataset={**S3_CACHE, "staging": "copy"}), prod_facts())
    stage = stage_container(job)
    assert "restartPolicy" not in stage
    assert "--budget" not in stage["command"] and "--linger" not in stage["command"]
    assert "--wait-for-data" not in train_container(job)["args"]


def test_cache_sizes_its_disk_like_copy_and_counts_the_sidecar_on_the_node() -> None:
    job, = render_job(spec(dataset={**S3_COPY, "staging": "cache"}), dev_facts())
    pod = job["spec"]["template"]["spec"]
    scratch = next(volume for volume in pod["volumes"] if volume["name"] == "dataset")
    assert scratch["emptyDir"] == {"sizeLimit": "165Gi"}  # the 150Gi budget + 10% headroom
    assert train_container(job)["resources"]["limits"]["ephemeral-storage"] == "175Gi"  # + 10Gi scratch
    assert stage_container(job)["resources"]["limits"]["ephemeral-storage"] == "1Gi"
    assert pod["nodeSelector"]["ml-cluster.io/disktype"] == "nvme"
    # The g5.xlarge's 232Gi NVMe gives pods 208Gi (the kubelet keeps nodefs.available<10% free). 180Gi: 198Gi +
    # 10Gi fills it exactly; a sidecar's own 1Gi runs beside the trainer (an init container's does not), so the same
    # size as a cache would leave the pod Pending.
    render_job(spec(dataset={**S3_COPY, "stagedSize": "180Gi"}), dev_facts())
    error = error_of({"dataset": {**S3_COPY, "staging": "cache", "stagedSize": "180Gi"}})
    assert error.path == "dataset.stagedSize" and "209Gi" in str(error) and "208Gi" in str(error)


def test_the_nvme_check_leaves_the_kubelets_eviction_reserve() -> None:
    """201Gi staged (222Gi) + 10Gi scratch fits the raw 232Gi NVMe but not the 208Gi the kubelet lets pods use: the
    scheduler would never place the pod."""
    error = error_of({"dataset": {**S3_COPY, "stagedSize": "201Gi"}})
    assert error.path == "dataset.stagedSize" and "232Gi" in str(error) and "208Gi" in str(error)
    assert "nodefs.available" in str(error)


def test_decoded_size_keeps_decoded_samples_on_the_nvme_beside_the_shards() -> None:
    job, = render_job(spec(dataset={**S3_COPY, "staging": "cache", "decodedSize": "20Gi"}), dev_facts())
    check_job(job)
    pod = job["spec"]["template"]["spec"]
    decoded = next(volume for volume in pod["volumes"] if volume["name"] == "decoded")
    assert decoded["emptyDir"] == {"sizeLimit": "22Gi"}  # 20Gi + 10% headroom, on the kubelet's (NVMe) disk
    train = train_container(job)
    assert {"name": "decoded", "mountPath": "/decoded"} in train["volumeMounts"]
    args = train["args"]
    assert args[args.index("--decode-cache") + 1] == "/decoded"
    assert args[args.index("--decode-cache-size") + 1] == "20Gi"
    # The trainer's ephemeral-storage covers the decoded samples too: 165Gi staged + 10Gi scratch + 22Gi.
    assert train["resources"]["limits"]["ephemeral-storage"] == "197Gi"
    plain, = render_job(spec(dataset={**S3_COPY, "staging": "cache"}), dev_facts())
    assert "--decode-cache" not in train_container(plain)["args"]
    assert all(volume["name"] != "decoded" for volume in plain["spec"]["template"]["spec"]["volumes"])


def test_decoded_size_is_checked_against_staging_mounts_and_the_node() -> None:
    error = error_of({"dataset": {"claimName": "datasets", "decodedSize": "10Gi"}})
    assert error.path == "dataset.decodedSize" and "staging" in str(error)
    error = error_of({"dataset": {**S3_CACHE, "mountPath": "/decoded", "decodedSize": "10Gi"}})
    assert error.path == "dataset.mountPath" and "/decoded" in str(error)
    # 150Gi staged (165Gi) + 10Gi scratch + 1Gi sidecar + 30Gi decoded (33Gi) = 209Gi > the g5.xlarge's 208Gi.
    error = error_of({"dataset": {**S3_COPY, "staging": "cache", "decodedSize": "30Gi"}})
    assert error.path == "dataset.stagedSize" and "decoded" in str(error) and "208Gi" in str(error)
    user_set, = render_job(spec(gpus=8, gpuType="a100", dataset={**S3_CACHE, "decodedSize": "10Gi"},
                                args=["--decode-cache", "/tmp/rows", "--decode-cache-size", "1Gi"]), prod_facts())
    assert train_container(user_set)["args"].count("--decode-cache") == 1  # the spec's args win


def test_s3_checkpoints_are_mirrored_by_the_trainer_and_resumed() -> None:
    job, = render_job(spec(gpus=8, gpuType="a100", dataset=S3_COPY,
                           checkpoint={"uri": "s3://lab-checkpoints/run-1/"}), onprem_facts())
    train = train_container(job)
    assert train["args"][train["args"].index("--checkpoint-uri") + 1] == "s3://lab-checkpoints/run-1/"
    assert "--resume" in train["args"]
    env = {item["name"]: item.get("value") for item in train["env"]}
    assert env["AWS_ENDPOINT_URL_S3"] == "https://s3.us-south.cloud-object-storage.appdomain.cloud"
    assert train["envFrom"] == [{"secretRef": {"name": "cos-credentials"}}]


def test_pvc_copy_staging_copies_with_cp_from_the_claim() -> None:
    job, = render_job(spec(dataset={"claimName": "datasets-efs", "staging": "copy", "stagedSize": "20Gi"}),
                      dev_facts())
    pod = job["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"] == ["cp", "-a", "/mnt/dataset-source/.", "/data/"]
    source = next(volume for volume in pod["volumes"] if volume["name"] == "dataset-source")
    assert source["persistentVolumeClaim"] == {"claimName": "datasets-efs", "readOnly": True}


def test_unstaged_pvc_is_mounted_read_only_without_nvme() -> None:
    job, = render_job(spec(dataset={"claimName": "datasets-efs"}), dev_facts())
    pod = job["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "ml-cluster.io/disktype" not in pod["nodeSelector"]
    assert {"name": "dataset", "mountPath": "/data", "readOnly": True} in train_container(job)["volumeMounts"]


def test_staging_without_nvme_or_beyond_it_is_rejected() -> None:
    no_nvme = replace(onprem_facts(), pools=onprem_facts().pools[:1])
    assert error_of({"gpus": 4, "dataset": S3_COPY}, no_nvme).path == "dataset.staging"
    error = error_of({"dataset": {**S3_COPY, "stagedSize": "300Gi"}})  # 232 GiB NVMe on a g5.xlarge
    assert error.path == "dataset.stagedSize" and "232Gi" in str(error)


def test_cos_stager_gets_endpoint_and_hmac_secret() -> None:
    job, = render_job(spec(gpus=8, gpuType="a100", dataset=S3_COPY), onprem_facts())
    stage = job["spec"]["template"]["spec"]["initContainers"][0]
    endpoint = stage["command"].index("--endpoint-url") + 1
    assert stage["command"][endpoint] == "https://s3.us-south.cloud-object-storage.appdomain.cloud"
    assert stage["envFrom"] == [{"secretRef": {"name": "cos-credentials"}}]
    assert "AKIA" not in str(job)


# --- lifecycle, names, multi-node ------------------------------------------------------------------------


def test_lifecycle_fields() -> None:
    job, = render_job(spec(backoffLimit=3, activeDeadlineSeconds=3600, ttlSecondsAfterFinished=600,
                           priorityClass="training-high"), dev_facts())
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    assert job["spec"]["backoffLimit"] == 3 and job["spec"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"] == {"containerName": "train", "operator": "In",
                                       "values": [CONFIG_ERROR_EXIT_CODE]}
    assert rules[1] == {"action": "Ignore", "onExitCodes": {"containerName": "train", "operator": "In",
                                                            "values": [DISRUPTION_EXIT_CODE]}}
    disruption = {"type": "DisruptionTarget", "status": "True"}
    assert rules[2] == {"action": "Ignore", "onPodConditions": [disruption]}
    assert rules[3]["action"] == "Count"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "training-high"
    assert job["metadata"]["labels"]["ml-cluster.io/stack"] == "dev"


def test_name_hash_is_stable_and_changes_with_the_spec_or_the_cluster() -> None:
    base = spec(dataset=S3_COPY)
    assert job_name(base, dev_facts()) == job_name(spec(dataset=S3_COPY), dev_facts())
    assert job_name(base, dev_facts()).startswith("resnet-")
    changed = spec(dataset=S3_COPY, args=["--epochs", "91"])
    assert job_name(changed, dev_facts()) != job_name(base, dev_facts())
    assert job_name(base, dev_facts()) != job_name(base, facts_from_dict({**facts_to_dict(dev_facts()),
                                                                           "region": "eu-west-1"}))


def _by_definition(parsed: TrainingJobSpec, facts: Any) -> list[dict[str, Any]]:
    """The run as its name is defined: rendered under the spec's plain name, hashed, rendered again under the
    hashed name (what render_job did before it rendered once)."""
    plain = render._render_manifests(parsed, facts, parsed.name)
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return render._render_manifests(parsed, facts, f"{parsed.name}-{digest[:HASH_LENGTH]}")


@pytest.mark.parametrize("fields", [
    {"gpuType": "a100", "dataset": S3_CACHE},
    {"nodes": 4, "gpus": 8, "gpuType": "h100", "queue": "gpu-h100", "dataset": S3_CACHE},
    {"kind": "JobSet", "nodes": 2, "gpus": 8, "gpuType": "h100"},
    {"kind": "TrainJob", "nodes": 2, "gpus": 8, "gpuType": "h100"},
    # the spec holds every stand-in name: rendered under the plain name, then again (same run)
    {"nodes": 2, "gpus": 8, "gpuType": "h100",
     "args": [f"resnet-{letter * HASH_LENGTH}" for letter in "zyxwvutsrqponmlkjihg"]},
])
def test_a_run_is_rendered_once_and_is_the_run_its_hashed_name_defines(monkeypatch: pytest.MonkeyPatch,
                                                                       fields: dict[str, Any]) -> None:
    parsed = spec(suspend=False, **fields)
    built: list[str] = []
    real = render.build_pod
    monkeypatch.setattr(render, "build_pod", lambda *args: built.append(args[2]) or real(*args))
    manifests = render_job(parsed, prod_facts())
    fallback = "args" in fields
    assert len(built) == (2 if fallback else 1)
    assert json.dumps(manifests) == json.dumps(_by_definition(parsed, prod_facts()))
    assert manifests[0]["metadata"]["name"] == job_name(parsed, prod_facts())


def test_multi_node_is_an_indexed_job_with_a_headless_service_and_rendezvous_env() -> None:
    job, service, policy = render_job(spec(nodes=4, gpus=8, gpuType="h100", queue="gpu-h100"), prod_facts())
    name = job["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-h100"
    assert service["metadata"]["name"] == name and service["spec"]["clusterIP"] == "None"
    env = {item["name"]: item for item in train_container(job)["env"]}
    assert env["PET_RDZV_ENDPOINT"]["value"] == f"{name}-0.{name}.training.svc:29500"
    assert env["PET_NNODES"]["value"] == "4" and env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert train_container(job)["command"] == ["python", "-m", "workloads.train.launch", "--module", "workloads.train"]
    check_job(job)
    check_service(service, job)
    check_network_policy(policy, job)


def test_name_length_budget_counts_hash_and_pod_index() -> None:
    assert parse_spec({"name": "a" * 54, "image": IMAGE}).name == "a" * 54
    assert error_of({"name": "a" * 55}).path == "name"
    error = error_of({"name": "a" * 53, "nodes": 10})  # -<hash> and -9 leave 52
    assert error.path == "name" and "52" in str(error)


# --- bad specs name their field --------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "path"), [
    ({"gpus": -1}, "gpus"),
    ({"memory": "lots"}, "memory"),
    ({"shmSize": "0"}, "shmSize"),
    ({"extra": 1}, "extra"),
    ({"image": "has space"}, "image"),
    ({"name": "Bad_Name"}, "name"),
    ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "env.AWS_SECRET_ACCESS_KEY"),
    ({"env": {"DATA_DIR": "/x"}}, "env.DATA_DIR"),
    ({"secretEnv": {"WANDB_API_KEY": {"secret": "wandb"}}}, "secretEnv.WANDB_API_KEY.key"),
    ({"dataset": {"uri": "s3://bkt/x"}}, "dataset.staging"),
    ({"dataset": {"uri": "gs://bkt/x", "staging": "copy", "stagedSize": "1Gi"}}, "dataset.uri"),
    ({"dataset": {"claimName": "efs", "staging": "rolling", "stagedSize": "1Gi"}}, "dataset.staging"),
    ({"dataset": {"claimName": "efs", "staging": "cache", "stagedSize": "1Gi"}}, "dataset.staging"),
    ({"dataset": {"claimName": "efs", "staging": "cache"}}, "dataset.staging"),
    ({"dataset": {"uri": "s3://bkt/x", "staging": "cache"}}, "dataset.stagedSize"),
    ({"dataset": {"uri": "s3://bkt/x", "staging": "copy"}}, "dataset.stagedSize"),
    ({"dataset": {"claimName": "efs", "mountPath": "/dev/shm/data"}}, "dataset.mountPath"),
    ({"ramDisk": {"size": "1Gi", "mountPath": "relative"}}, "ramDisk.mountPath"),
    ({"checkpoint": {"uri": "s3://bkt/c", "claimName": "efs"}}, "checkpoint.uri"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "tolerations[0].value"),
    ({"gpus": 0, "gpuType": "a10g"}, "gpuType"),
    ({"activeDeadlineSeconds": 5}, "activeDeadlineSeconds"),
])
def test_invalid_spec_is_rejected_with_its_field_path(fields: dict[str, Any], path: str) -> None:
    assert error_of(fields).path == path


def test_errors_carry_a_list_prefix() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_spec({"name": "x", "image": IMAGE, "gpus": "many"}, "jobs[2]")
    assert caught.value.path == "jobs[2].gpus"
    assert str(caught.value).startswith("jobs[2].gpus: ")


# --- fuzzing: every spec either renders a Job that keeps every rule, or is rejected with a field path ----

FIELDS = set(TrainingJobSpec.model_json_schema(by_alias=True)["properties"])
quantities = st.sampled_from(["512Mi", "1Gi", "2Gi", "4Gi", "8Gi", "16Gi", "64Gi", "300Gi", "3Ti", "0.5Gi"])
staged_sizes = st.sampled_from(["10Gi", "100Gi", "180Gi", "1Ti"])
datasets = st.one_of(
    st.none(),
    st.fixed_dictionaries({"uri": st.just("s3://mlc-datasets/imagenet/"),
                           "staging": st.sampled_from(["cache", "copy", "rolling"]), "stagedSize": staged_sizes},
                          optional={"stagerWorkers": st.integers(1, 64),
                                    "mountPath": st.sampled_from(["/data", "/scratch/data"])}),
    st.fixed_dictionaries({"claimName": st.sampled_from(["datasets-efs", "imagenet-s3"])}),
    st.fixed_dictionaries({"claimName": st.just("datasets-efs"), "staging": st.just("copy"),
                           "stagedSize": staged_sizes}),
    # Often wrong: missing or stray stagedSize, bad workers, a mount inside /dev/shm, cache or rolling from a PVC.
    st.fixed_dictionaries({"uri": st.just("s3://mlc-datasets/imagenet/"),
                           "staging": st.sampled_from(["cache", "copy", "rolling", "none"])},
                          optional={"stagedSize": quantities, "stagerWorkers": st.integers(0, 64),
                                    "mountPath": st.sampled_from(["/data", "/dev/shm/x"])}),
    st.fixed_dictionaries({"claimName": st.just("datasets-efs"),
                           "staging": st.sampled_from(["none", "cache", "copy", "rolling"])},
                          optional={"stagedSize": quantities}),
)


@st.composite
def stack_and_spec(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A stack and a spec aimed at it: mostly plausible (GPU types and counts the stack has), sometimes not."""
    stack = draw(st.sampled_from(sorted(ALL_FACTS)))
    types = sorted({pool.gpu_type for pool in ALL_FACTS[stack].pools if pool.gpu_type})
    most = max(pool.gpus_per_node for pool in ALL_FACTS[stack].pools)
    gpus = draw(st.sampled_from([0, 16]) if draw(st.integers(0, 4)) == 4 else st.integers(1, most))
    data = draw(st.fixed_dictionaries(
        {"name": st.from_regex(r"\A[a-z][a-z0-9-]{0,60}[a-z0-9]\Z"), "image": st.just(IMAGE),
         "gpus": st.just(gpus)},
        optional={
            "cpu": st.sampled_from(["2", "500m", "8", "96", "400"]),
            "memory": st.sampled_from(["8Gi", "14Gi", "64Gi", "512Gi", "3Ti", "2Gi"]),
            "processMemory": quantities,
            "shmSize": quantities,
            "ramDisk": st.fixed_dictionaries({"size": quantities}, optional={"mountPath": st.just("/ramdisk")}),
            "checkpoint": st.sampled_from([{"claimName": "checkpoints-efs"}, {"uri": "s3://mlc-ckpt/run/"}]),
            "queue": st.just("gpu"),
            "args": st.lists(st.text("abc-1", min_size=1, max_size=5), max_size=3),
            "ttlSecondsAfterFinished": st.sampled_from([None, 0, 3600]),
            "tolerations": st.lists(st.fixed_dictionaries(
                {"key": st.just("ml-cluster.io/capacity"), "operator": st.sampled_from(["Equal", "Exists"])},
                optional={"value": st.just("spot"), "effect": st.sampled_from(["NoSchedule", "NoExecute"])}),
                max_size=2),
        },
    ))
    dataset = draw(datasets)
    if dataset is not None:
        data["dataset"] = dataset
    data["nodes"] = draw(st.sampled_from([1, 2, 4, 12]))
    if gpus and (len(types) > 1 or draw(st.booleans())):
        data["gpuType"] = draw(st.just("v100") if draw(st.integers(0, 9)) == 9 else st.sampled_from(types))
    return stack, data


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=stack_and_spec())
def test_fuzzed_specs_render_valid_jobs_or_fail_with_a_field_path(case: tuple[str, dict[str, Any]]) -> None:
    stack, data = case
    facts = ALL_FACTS[stack]
    try:
        parsed = parse_spec(data)
        manifests = render_job(parsed, facts)
    except JobSpecError as error:
        assert error.path, f"no field path: {error}"
        assert error.path.split(".")[0].split("[")[0] in FIELDS, error.path
        return
    job = manifests[0]
    check_job(job)
    limits = train_container(job)["resources"]["limits"]
    needed = (quantity_bytes(parsed.process_memory) + parsed.shm_bytes() + parsed.ram_disk_bytes())
    assert quantity_bytes(limits["memory"]) >= needed
    assert int(limits.get("nvidia.com/gpu", 0)) == parsed.gpus
    assert [m["kind"] for m in manifests] == (["Job", "Service", "NetworkPolicy"] if parsed.nodes > 1 else ["Job"])
    if parsed.nodes > 1:
        check_service(manifests[1], job)
        check_network_policy(manifests[2], job)
    assert quantity_bytes(limits["ephemeral-storage"]) >= parsed.staged_bytes()
    if parsed.dataset and parsed.dataset.staged_size:
        assert parsed.staged_bytes() >= quantity_bytes(parsed.dataset.staged_size) + 2 * GIB
    if parsed.dataset and parsed.dataset.staging in ("cache", "rolling"):
        # A sidecar whose budget covers stagedSize and stays inside the volume it fills.
        stage = stage_container(job)
        budget = parse_size(stage["command"][stage["command"].index("--budget") + 1])
        scratch = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "dataset")
        assert stage["restartPolicy"] == "Always" and stage["command"][-1] == "--linger"
        assert quantity_bytes(parsed.dataset.staged_size) <= budget <= quantity_bytes(scratch["emptyDir"]["sizeLimit"])
    elif parsed.dataset and parsed.dataset.staging == "copy":
        stage = stage_container(job)
        assert "restartPolicy" not in stage and "--budget" not in stage["command"]


def test_project_entrypoint_gets_data_and_checkpoint_paths_custom_commands_do_not() -> None:
    dataset = {"claimName": "datasets-efs", "mountPath": "/data/flowers"}
    job, = render_job(spec(dataset=dataset, checkpoint={"claimName": "checkpoints-efs"}, args=["--epochs", "3"]),
                      dev_facts())
    assert train_container(job)["args"] == ["--data", "/data/flowers", "--checkpoint-dir", "/checkpoints", "--resume",
                                            "--epochs", "3"]
    own, = render_job(spec(dataset=dataset, command=["python", "my_train.py"], args=["--epochs", "3"]), dev_facts())
    assert train_container(own)["args"] == ["--epochs", "3"]
    env = {item["name"]: item.get("value") for item in train_container(own)["env"]}
    assert env["DATA_DIR"] == "/data/flowers" and env["CONFIG_ERROR_EXIT_CODE"] == str(CONFIG_ERROR_EXIT_CODE)


@pytest.mark.parametrize("staging", ["cache", "rolling"])
def test_stager_sidecar_is_counted_in_the_pod_so_default_sizing_still_fits_the_node(staging: str) -> None:
    dataset = {**S3_CACHE, "staging": staging}
    job, = render_job(spec(gpus=8, gpuType="a100", dataset=dataset), prod_facts())
    pod = job["spec"]["template"]["spec"]
    train, stager = pod["containers"][0]["resources"]["requests"], pod["initContainers"][0]["resources"]["requests"]
    node_cpu, node_memory = 11500 * 8, 140 * GIB * 8
    assert quantity_millicores(train["cpu"]) + quantity_millicores(stager["cpu"]) == node_cpu
    assert quantity_bytes(train["memory"]) + quantity_bytes(stager["memory"]) == node_memory
    error = error_of({"gpus": 8, "gpuType": "a100", "cpu": "92", "dataset": dataset}, prod_facts())
    assert error.path == "cpu" and "94" in str(error) and "92" in str(error)


@pytest.mark.parametrize(("change", "where"), [
    ({"stack": 5}, "stack"),
    ({"pools": "gpu"}, "pools"),
    ({"pools": [5]}, "pools"),
    ({"pools": [{"name": "gpu"}]}, "gpu_type"),
    ({"buckets": {"datasets": ["x"]}}, "buckets"),
    ({"volume_claims": "claim"}, "volume_claims"),
    ({"surprise": 1}, "surprise"),
    ({"pools": [{"name": "gpu", "gpu_type": None, "gpus_per_node": 0, "nvme_gib": 0, "extra": 1}]}, "extra"),
])
def test_hostile_cluster_facts_are_refused_naming_the_field(change: dict, where: str) -> None:
    with pytest.raises(ValueError) as caught:
        facts_from_dict({**facts_to_dict(dev_facts()), **change})
    message = str(caught.value)
    assert message.startswith("cluster facts: ") and where in message and "\n" not in message
