"""The chaos step's gang: the default spec comes from the stack's GPU pool; a given spec that does not fit the stack's
pools, or whose dataset is not in S3, stops a real run before anything is created (one line, exit 2). S3's answers
come through botocore's Stubber (its real response parsing; nothing leaves the machine)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import boto3
import pytest
import yaml
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from infra.acceptance.gang import (
    checkpoint_claim,
    dataset_problem,
    dataset_sources,
    fit_problem,
    parse_gang,
)
from infra.acceptance.plan import PoolFit
from tests.acceptance.conftest import run_cli

DEV = (PoolFit("gpu-a10g", "a10g", 1, 2),)
DATASET = "s3://my-data/imagenet-hdf5"


def _spec(**fields: object) -> object:
    return parse_gang({"name": "gang", "imageTag": "0.2.0", **fields}, "spec.yaml")


@pytest.mark.parametrize(("fields", "says"), [
    ({"nodes": 2, "gpus": 1, "gpuType": "a10g"}, None),
    ({"nodes": 2, "gpus": 1}, None),  # no type asked: any GPU pool
    ({"nodes": 2, "gpus": 8, "gpuType": "h100"}, "--gang-spec: asks gpuType h100; stack dev's GPU pools have a10g"),
    ({"nodes": 1, "gpus": 4, "gpuType": "a10g"}, "--gang-spec: asks 1 node(s) x 4 a10g; stack dev's pools: gpu-a10g "
                                                 "(a10g: up to 2 node(s) x 1 GPU)"),
    ({"nodes": 3, "gpus": 1}, "--gang-spec: asks 3 node(s) x 1 GPU; stack dev's pools"),
    ({"nodes": 2, "gpus": 0}, "--gang-spec: gpus 0: the chaos step terminates a GPU node"),
])
def test_a_gang_must_fit_one_of_the_stacks_pools(fields: dict[str, object], says: str | None) -> None:
    problem = fit_problem(_spec(**fields), DEV, "dev")  # type: ignore[arg-type]
    assert (problem is None) if says is None else (problem or "").startswith(says), problem


def test_a_dataset_the_run_itself_creates_cannot_be_in_place() -> None:
    uris, problem = dataset_sources(_spec(dataset={"bucket": "datasets", "prefix": "x/", "staging": "copy",  # type: ignore[arg-type]
                                                   "stagedSize": "1Gi"}))
    assert uris == [] and (problem or "").startswith("--gang-spec: dataset.bucket: datasets is one of the stack's "
                                                     "buckets, which this run's up creates empty")
    _, problem = dataset_sources(_spec(dataset={"claimName": "datasets-efs"}))  # type: ignore[arg-type]
    assert (problem or "").startswith("--gang-spec: dataset.claimName: datasets-efs is a volume of the stack")
    mixture = {"mixture": [{"uri": DATASET}, {"uri": "s3://my-data/captions"}], "staging": "cache",
               "stagedSize": "1Gi"}
    assert dataset_sources(_spec(dataset=mixture, command=["python", "own.py"])) == (  # type: ignore[arg-type]
        [DATASET, "s3://my-data/captions"], None)
    assert dataset_sources(_spec()) == ([], None)  # type: ignore[arg-type]


def _stubbed() -> tuple[Stubber, object]:
    client = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                                   region_name="us-west-2").client("s3")
    return Stubber(client), client


def test_the_dataset_check_heads_its_manifest() -> None:
    stub, client = _stubbed()
    key = {"Bucket": "my-data", "Key": "imagenet-hdf5/manifest.json"}
    stub.add_response("head_object", {"ContentLength": 120}, key)
    stub.add_client_error("head_object", "404", http_status_code=404, expected_params=key)
    stub.add_client_error("head_object", "NoSuchBucket", http_status_code=404, expected_params=key)
    stub.add_client_error("head_object", "403", http_status_code=403, expected_params=key)
    head = lambda bucket, key: client.head_object(Bucket=bucket, Key=key) and None  # type: ignore[attr-defined]  # noqa: E731
    with stub:
        assert dataset_problem([DATASET], head) is None
        assert dataset_problem([DATASET + "/"], head) == (
            f"--gang-spec: dataset {DATASET}/: no manifest.json there (not packed, or another prefix): the gang "
            "would wait on data that never comes")
        assert dataset_problem([DATASET], head) == f"--gang-spec: dataset {DATASET}: no bucket my-data"
        assert dataset_problem([DATASET], head) == (
            f"--gang-spec: dataset {DATASET}: S3 answered 403 to HEAD s3://my-data/imagenet-hdf5/manifest.json")
        stub.assert_no_pending_responses()

    def unreachable(bucket: str, key: str) -> None:
        raise EndpointConnectionError(endpoint_url="https://s3.us-west-2.amazonaws.com")

    assert dataset_problem([DATASET], unreachable) == (
        f"--gang-spec: dataset {DATASET}: S3 did not answer (EndpointConnectionError)")


def test_the_default_gangs_checkpoints_go_to_a_shared_volume() -> None:
    assert checkpoint_claim(["datasets-efs", "checkpoints-efs"]) == "checkpoints-efs"
    assert checkpoint_claim(["scratch"]) == "scratch" and checkpoint_claim([]) is None


def test_the_default_gang_is_derived_from_the_dev_pool(cli: ModuleType, clean_git: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(cli, capsys, "--stack", "dev", "--dry-run", "--allreduce-floor", "20", "--gang-dataset",
                           DATASET)
    assert code == 0 and "warning" not in out
    bundle = next(line for line in out.splitlines() if line.startswith("evidence bundle: ")).split()[2].rstrip("/")
    assert f"    $ .venv/bin/python -m workloads.submit --stack dev -n training submit {bundle}/gang-job.yaml" in out
    gang = yaml.safe_load(out.split(f"--- {bundle}/gang-job.yaml\n")[1])
    assert (gang["nodes"], gang["gpus"], gang["gpuType"]) == (2, 1, "a10g")
    assert gang["dataset"]["uri"] == DATASET and gang["checkpoint"] == {"claimName": "checkpoints-efs"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--gang-spec", "workloads/jobs/multi-node-ddp.yaml"],
     "error: --gang-spec: asks gpuType h100; stack dev's GPU pools have a10g"),
    (["--gang-spec", "workloads/jobs/resnet50-s3-copy.yaml"],
     "error: --gang-spec: dataset.bucket: datasets is one of the stack's buckets"),
    (["--gang-spec", "workloads/jobs/resnet50-s3-copy.yaml", "--gang-dataset", DATASET],
     "error: --gang-dataset: the default gang's dataset: a --gang-spec names its own"),
    ([], "error: --gang-dataset: the chaos step's gang trains on a packed dataset that is in S3 before the run"),
    (["--gang-dataset", DATASET], f"error: --gang-spec: dataset {DATASET}: no manifest.json there"),
])
def test_a_real_run_stops_before_it_starts(cli: ModuleType, clean_git: None, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
                                           says: str) -> None:
    def no_manifest(region: str) -> object:
        stub, client = _stubbed()
        stub.add_client_error("head_object", "404", http_status_code=404)
        stub.activate()
        return lambda bucket, key: client.head_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]

    def never(*args: object) -> int:
        raise AssertionError("the run started")

    monkeypatch.setattr(cli, "s3_head", no_manifest)
    monkeypatch.setattr(cli, "run", never)
    code, out, err = run_cli(cli, capsys, "--stack", "dev", "--allreduce-floor", "20", "--evidence",
                             str(tmp_path), *argv)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1 and err.startswith(says), err
    assert list(tmp_path.iterdir()) == []
