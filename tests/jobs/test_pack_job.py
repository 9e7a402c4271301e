"""`submit pack`: the slices' Indexed Job and the publish Job, validated strictly and put through Kueue's rules."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.queueing import KueueConfig
from infra.nodes.poolplan import plan_node_pools, pool_facts
from infra.queueing import kueue_facts
from infra.quota import check_queueing, flavors, job_podsets
from tests.jobs.facts import dev_facts, onprem_facts
from tests.jobs.jobrules import validate_strict
from tests.jobs.pss import restricted_violations
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.cluster_facts import facts_to_dict
from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, JobSpecError
from workloads.jobspec.packjob import PackJobSpec, render_pack_job
from workloads.submit.cli import main

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
PREFIX = "ml-cluster.io"


def pools() -> Any:
    return plan_node_pools(eks_config([{"name": "cpu", "instanceTypes": ["m6i.4xlarge"], "maxSize": 8},
                                       gpu_pool("gpu-a10g", ["g5.xlarge"])]), fixture_lookup)


def kueue_dev() -> Any:
    config = KueueConfig.model_validate({"enabled": True})
    return config, replace(dev_facts(), pools=pool_facts(pools()), **kueue_facts(config))


def spec(**fields: Any) -> PackJobSpec:
    values: dict[str, Any] = {"name": "imagenet", "source": "s3://raw/imagenet/train",
                              "dest": "s3://mlc-dev-datasets-210987654321/imagenet-256", "slices": 4, "image": IMAGE}
    return PackJobSpec(**{**values, **fields})


def tolerated(pod: dict[str, Any], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    return any(t.get("key") == key and (t.get("operator") == "Exists" or t.get("value") == value)
               and t.get("effect") in (None, effect) for t in pod.get("tolerations") or [])


def affinity_allows(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        ok = True
        for expression in term["matchExpressions"]:
            if expression["operator"] == "DoesNotExist" and expression["key"] in labels:
                ok = False
        if ok:
            return True
    return False


def test_slices_are_an_indexed_job_on_the_cpu_flavor_and_publish_follows() -> None:
    config, facts = kueue_dev()
    slices, publish = render_pack_job(spec(), facts)
    for job in (slices, publish):
        validate_strict(job, "1.33")
        assert restricted_violations(job["spec"]["template"]["spec"]) == []
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training" and job["spec"]["suspend"]
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == facts.job_service_account  # Pod Identity: read SRC, write DEST
        [container] = pod["containers"]
        assert container["resources"]["requests"] == container["resources"]["limits"]
        # Kueue's flavor choice (flavorassigner.go:1238-1253 at v0.19.2): a flavor whose nodeTaints the pod does
        # not tolerate, or whose nodeLabels its required affinity excludes, is skipped; the rest is the cpu flavor.
        fitting = [flavor.name for flavor in flavors(pools(), PREFIX)
                   if not any(tolerated(pod, taint) is False for taint in flavor.taints)
                   and affinity_allows(pod, flavor.node_labels)]
        assert fitting == ["cpu"], fitting
    assert slices["spec"]["completionMode"] == "Indexed"
    assert slices["spec"]["completions"] == slices["spec"]["parallelism"] == 4
    assert slices["spec"]["backoffLimitPerIndex"] == 3 and slices["spec"]["maxFailedIndexes"] == 4
    rules = slices["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailIndex", "onExitCodes": {"containerName": "pack", "operator": "In",
                                                               "values": [CONFIG_ERROR_EXIT_CODE]}}
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    command = slices["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:6] == ["python", "-m", "workloads.data", "pack", "s3://raw/imagenet/train",
                           "s3://mlc-dev-datasets-210987654321/imagenet-256"]
    assert "--shard-count" in command and "--publish" not in command and "--shard-index" not in command
    publish_command = publish["spec"]["template"]["spec"]["containers"][0]["command"]
    assert publish_command[publish_command.index("--publish") + 1:][:2] == ["--wait", "86400"]
    assert publish["metadata"]["name"] == slices["metadata"]["name"] + "-publish"
    # Admissible: the gang fits the cpu flavor's quota whole (the stack's own check, as for its Jobs).
    check_queueing(config, pools(), PREFIX, [[slices], [publish]], ["training", "training"])
    [podset] = job_podsets(slices)
    assert podset["count"] == 4


def test_cos_buckets_get_the_endpoint_and_the_hmac_secret() -> None:
    facts = replace(onprem_facts(), pools=(*onprem_facts().pools, replace(dev_facts().pools[0], name="cpu")))
    slices, _ = render_pack_job(spec(source="s3://raw/x", dest="s3://datasets/x"), facts)
    container = slices["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "cos-credentials"}}]
    assert container["command"][container["command"].index("--endpoint-url") + 1] == facts.object_store_endpoint
    validate_strict(slices, "1.33")


@pytest.mark.parametrize(("fields", "path"), [
    ({"name": "Bad_Name"}, "name"), ({"source": "raw/x"}, "source"), ({"slices": 0}, "slices"),
    ({"shard_size": "12 parsecs"}, "shardSize"),
    ({"shard_size": "1GiB", "memory": "1GiB0"}, "memory"),  # a bad memory whose text contains the shard size
])
def test_bad_pack_specs_name_the_field(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        render_pack_job(spec(**fields), dev_facts())
    assert caught.value.path == path


def test_submit_pack_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, facts = kueue_dev()
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(facts_to_dict(facts)))
    code = main(["pack", "s3://raw/imagenet/train", "s3://mlc-dev-datasets-210987654321/in", "--slices", "3",
                 "--image-tag", "0.1.0", "--facts", str(facts_file), "--render"])
    assert code == 0
    slices, publish = yaml.safe_load_all(capsys.readouterr().out)
    assert slices["spec"]["parallelism"] == 3 and publish["kind"] == "Job"
    assert slices["spec"]["template"]["spec"]["containers"][0]["image"] == f"{facts.image_repository}:0.1.0"
    code = main(["pack", "s3://raw/x", "s3://d/x", "--slices", "0", "--image", IMAGE, "--facts", str(facts_file),
                 "--render"])
    assert code == 2 and capsys.readouterr().err.startswith("error: slices: 0: 1..1000")


def test_records_packs_render_as_image_packs_with_pack_tables() -> None:
    _, facts = kueue_dev()
    fields = '[{"name": "image", "type": "image"}, {"name": "caption", "type": "text"}]'
    slices, publish = render_pack_job(spec(layout="records", source="s3://raw/laion-meta", fields=fields,
                                           map_hook="mytok:prepare", image_columns=("key",),
                                           images="s3://raw/laion-images", shard_rows=2048), facts)
    for job in (slices, publish):
        validate_strict(job, "1.33")
        assert restricted_violations(job["spec"]["template"]["spec"]) == []
    command = slices["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:6] == ["python", "-m", "workloads.data", "pack-tables", "s3://raw/laion-meta",
                           "s3://mlc-dev-datasets-210987654321/imagenet-256"]
    for flag, value in (("--fields", fields), ("--map", "mytok:prepare"), ("--image-column", "key"),
                        ("--images", "s3://raw/laion-images"), ("--shard-rows", "2048"), ("--shard-count", "4")):
        assert command[command.index(flag) + 1] == value
    assert slices["spec"]["completionMode"] == "Indexed" and slices["spec"]["completions"] == 4
    publish_command = publish["spec"]["template"]["spec"]["containers"][0]["command"]
    assert publish_command[3] == "pack-tables" and "--publish" in publish_command
    with pytest.raises(JobSpecError) as caught:
        render_pack_job(spec(layout="records"), facts)
    assert caught.value.path == "fields"


def test_watch_shows_images_per_second_and_slices_done() -> None:
    from dataclasses import replace as with_fields

    from workloads.progress import parse_metrics, progress, progress_line, snapshot
    from workloads.submit.phase import slices_done

    slices, _ = render_pack_job(spec(), kueue_dev()[1])
    slices["status"] = {"succeeded": 3, "failedIndexes": "2"}
    assert slices_done(slices) == "3/4 slices done (failed: 2)"
    assert slices_done({"metadata": {"labels": {}}, "spec": {}}) is None  # a training Job
    page = ("# TYPE ml_pack_images counter\nml_pack_images_total {images}\n# TYPE ml_pack_shards gauge\n"
            "ml_pack_shards 5\n# TYPE ml_pack_shards_done gauge\nml_pack_shards_done {done}\n")
    before = snapshot([parse_metrics(page.format(images=100, done=1)), parse_metrics(page.format(images=0, done=0))],
                      1000.0)
    now = snapshot([parse_metrics(page.format(images=400, done=2)), parse_metrics(page.format(images=200, done=1))],
                   1010.0)
    figures = progress(with_fields(now, slices=slices_done(slices)), before)
    line = progress_line("pack-x", "Running", figures)
    assert line == "pack-x  Running  3/4 slices done (failed: 2)  50 images/s  packed 3/10 shards of the running slices"


def test_packs_into_s3_run_as_the_packer_account_and_only_into_packinto_buckets() -> None:
    _, facts = kueue_dev()
    assert all(job["spec"]["template"]["spec"]["serviceAccountName"] == "training"
               for job in render_pack_job(spec(), facts))  # facts without a packer: the Jobs' account, as before
    packer = replace(facts, pack_service_account="packer", pack_buckets=("mlc-dev-datasets-210987654321",))
    assert all(job["spec"]["template"]["spec"]["serviceAccountName"] == "packer"
               for job in render_pack_job(spec(), packer))
    with pytest.raises(JobSpecError) as refused:
        render_pack_job(spec(dest="s3://mlc-dev-checkpoints-210987654321/imagenet"), packer)
    assert refused.value.path == "dest" and "packInto: true" in str(refused.value)


def test_the_dev_stack_facts_name_the_packer_and_its_bucket(stack_plan: Any) -> None:
    facts = stack_plan("dev")["outputs"]["jobFacts"]
    assert facts["pack_service_account"] == "packer"
    assert list(facts["pack_buckets"]) == [facts["buckets"]["datasets"]]
    policy = next(json.loads(r["inputs"]["policy"]) for r in stack_plan("dev")["resources"]
                  if r["name"] == "mlc-dev-pack-bucket-access")
    writes = next(s for s in policy["Statement"] if s["Sid"] == "WritePackedDatasets")
    assert writes["Resource"] == [f"arn:aws:s3:::{facts['buckets']['datasets']}/*"]
