"""The acceptance kit's probes over stand-ins of the kubernetes client and boto3: what a node's labels, a status
answer and a tag search mean, and that every wait ends by its deadline."""

from __future__ import annotations

import io
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest

from infra.acceptance import probes
from infra.acceptance.probes import billable, burn_in_state, find_leftovers, instance_id, resumed, training
from infra.acceptance.runner import DEADLINE_EXIT
from workloads.incidents import Incident

LABEL = "ml-cluster.io/gpu-health"


def _node(name: str, health: str | None = None, reason: str | None = None) -> dict[str, Any]:
    labels = {"ml-cluster.io/pool": "gpu-h100", **({LABEL: health} if health else {})}
    annotations = {"ml-cluster.io/gpu-health-reason": reason} if reason else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def test_pure_readings() -> None:
    assert instance_id("aws:///us-west-2a/i-0123456789abcdef0") == "i-0123456789abcdef0"
    assert instance_id("kind://docker/kind/node") is None and instance_id(None) is None
    assert burn_in_state([_node("a", "passed"), _node("b"), _node("c", "failed", "dcgm: XID 79\nmore")], LABEL) == (
        ["a"], ["c (ml-cluster.io/gpu-health=failed: dcgm: XID 79)"], ["b"])
    assert training({"phase": "Running", "progress": {"batch": 3}})
    assert not training({"phase": "Running", "progress": None}) and not training({"phase": "Pending"})
    old = Incident(started_at=100.0, cause="SIGKILL", pod="p-0", pods_replaced=2, disruptions=2, counted=0,
                   resumed_step=40, time_to_resume_s=30.0)
    new = Incident(started_at=5000.0, cause="disruption (DeletionByTaintManager)", pod="p-1", pods_replaced=2,
                   disruptions=2, counted=0)
    status = {"incidents": [asdict(old), asdict(new), "junk"]}
    assert resumed(status, 4990.0) is None  # the new one has not resumed yet; the old one is before the kill
    status["incidents"][1]["resumed_step"] = 120
    assert resumed(status, 4990.0) == (2, Incident(**{**asdict(new), "resumed_step": 120}))


def test_billable_leaves_out_what_is_gone() -> None:
    arns = ["arn:aws:ec2:us-west-2:1:natgateway/nat-1", "arn:aws:ec2:us-west-2:1:natgateway/nat-2",
            "arn:aws:s3:::mlc-dev-datasets"]
    left = billable(arns, [{"InstanceId": "i-1", "State": {"Name": "terminated"}},
                           {"InstanceId": "i-2", "State": {"Name": "running"}}],
                    [{"VolumeId": "vol-1", "State": "available"}], {"nat-1": "deleted", "nat-2": "available"})
    assert left == ["arn:aws:ec2:us-west-2:1:natgateway/nat-2", "arn:aws:s3:::mlc-dev-datasets", "instance i-2",
                    "volume vol-1"]


class Pages:
    def __init__(self, answers: dict[str, list[dict[str, Any]]], calls: list[tuple[str, dict[str, Any]]]):
        self.answers, self.calls = answers, calls

    def get_paginator(self, operation: str) -> Any:
        def paginate(**kwargs: Any) -> list[dict[str, Any]]:
            self.calls.append((operation, kwargs))
            return self.answers.get(operation, [{}])
        return SimpleNamespace(paginate=paginate)


def test_leftovers_searches_the_stacks_tags_and_its_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    left = [{"ResourceTagMappingList": [{"ResourceARN": "arn:aws:elasticloadbalancing:us-west-2:1:loadbalancer/x"}]}]
    tagging = Pages({"get_resources": left}, calls)
    ec2 = Pages({"describe_instances": [{"Reservations": [{"Instances": [
        {"InstanceId": "i-9", "State": {"Name": "shutting-down"}}]}]}]}, calls)
    found = find_leftovers({"resourcegroupstaggingapi": tagging, "ec2": ec2}.__getitem__, "dev", "ml-cluster", "ml-dev")
    assert found == ["arn:aws:elasticloadbalancing:us-west-2:1:loadbalancer/x", "instance i-9"]
    searches = [kwargs["TagFilters"] for operation, kwargs in calls if operation == "get_resources"]
    assert searches == [[{"Key": "project", "Values": ["ml-cluster"]}, {"Key": "stack", "Values": ["dev"]}],
                        [{"Key": "kubernetes.io/cluster/ml-dev"}], [{"Key": "eks:cluster-name", "Values": ["ml-dev"]}]]


def test_leftovers_see_a_gp3_claims_volume_by_the_stacks_tags() -> None:
    """The gp3 class tags its volumes with the stack's tags only (no cluster id on the driver): the volume search
    asks for them too, and a deleted one is not a leftover."""
    calls: list[tuple[str, dict[str, Any]]] = []
    tagging = Pages({}, calls)
    by_stack = [{"Name": "tag:project", "Values": ["ml-cluster"]}, {"Name": "tag:stack", "Values": ["dev"]}]

    class Volumes(Pages):
        def get_paginator(self, operation: str) -> Any:
            def paginate(**kwargs: Any) -> list[dict[str, Any]]:
                self.calls.append((operation, kwargs))
                if operation == "describe_volumes" and kwargs["Filters"] == by_stack:
                    return [{"Volumes": [{"VolumeId": "vol-7", "State": "available"},
                                         {"VolumeId": "vol-8", "State": "deleted"}]}]
                return [{}]
            return SimpleNamespace(paginate=paginate)

    ec2 = Volumes({}, calls)
    for cluster in ("ml-dev", ""):
        assert find_leftovers({"resourcegroupstaggingapi": tagging, "ec2": ec2}.__getitem__, "dev", "ml-cluster",
                              cluster) == ["volume vol-7"]
    assert [kwargs["Filters"] for operation, kwargs in calls if operation == "describe_volumes"] == [
        by_stack, [{"Name": "tag:kubernetes.io/cluster/ml-dev", "Values": ["owned"]}], by_stack]


def test_the_leftovers_probe_polls_until_clean_and_gives_up_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [["volume vol-1"], []]
    monkeypatch.setattr(probes, "find_leftovers", lambda *args: answers.pop(0) if answers else ["volume vol-1"])
    sleeps: list[float] = []
    probe = probes.leftovers_probe("us-west-2", "ml-cluster", sleep=sleeps.append, client=lambda service: None,
                                   clock=lambda: 0.0)
    outcome = probe({"stack": "dev", "cluster": "ml-dev"}, io.StringIO(), 600)
    assert (outcome.exit_status, outcome.figures["leftovers"], sleeps) == (0, 0, [probes.POLL_S])
    log = io.StringIO()
    outcome = probe({"stack": "dev", "cluster": "ml-dev"}, log, 5)  # shorter than one poll: one look, then done
    assert outcome.exit_status == 1 and outcome.note == "1 billable resource(s) left after destroy: volume vol-1"
    assert "  volume vol-1" in log.getvalue().splitlines()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Core:
    """CoreV1Api's list_node, answering one node list per call."""

    def __init__(self, answers: list[list[dict[str, Any]]]):
        self.answers = answers
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda node: node)

    def list_node(self, label_selector: str, _request_timeout: int) -> Any:
        assert label_selector == "ml-cluster.io/pool=gpu-h100"
        return SimpleNamespace(items=self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])


ARGS = {"pool": "gpu-h100", "nodes": "2", "label": LABEL, "pool_label": "ml-cluster.io/pool"}


@pytest.mark.parametrize(("answers", "deadline", "code", "note"), [
    ([[], [_node("a", "passed")], [_node("a", "passed"), _node("b", "passed")]], 600, 0, None),
    ([[_node("a", "passed"), _node("b", "failed", "gpu 3: memory pattern")]], 600, 1,
     "burn-in failed on b (ml-cluster.io/gpu-health=failed: gpu 3: memory pattern)"),
    ([[_node("a", "passed"), _node("b")]], 30, DEADLINE_EXIT,
     "after 30 s: 1 of 2 node(s) of pool gpu-h100 labelled ml-cluster.io/gpu-health=passed"),
])
def test_the_burn_in_probe(monkeypatch: pytest.MonkeyPatch, answers: list[list[dict[str, Any]]], deadline: float,
                           code: int, note: str | None) -> None:
    monkeypatch.setattr(probes, "_kubernetes", lambda stack: Core(answers))
    clock = Clock()
    outcome = probes.burn_in_probe("prod", sleep=clock.sleep, clock=clock)(ARGS, io.StringIO(), deadline)
    assert (outcome.exit_status, outcome.note) == (code, note)


def test_the_chaos_probe_terminates_one_instance_and_records_the_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    killed: list[list[str]] = []
    incident = Incident(started_at=1_000_010.0, cause="disruption (DeletionByTaintManager)", pod="gang-0-1",
                        pods_replaced=2, disruptions=2, counted=0, resumed_step=120, steps_lost=3,
                        time_to_resume_s=412.5)
    answers = [{"phase": "Pending"}, {"phase": "Running", "progress": {"batch": 5}},
               {"phase": "Running", "incidents": []}, {"phase": "Running", "incidents": [asdict(incident)]}]
    monkeypatch.setattr(probes, "submit_status", lambda python, stack, namespace, job: answers.pop(0))
    monkeypatch.setattr(probes, "_kubernetes", lambda stack: None)
    monkeypatch.setattr(probes, "_gang_instance", lambda core, namespace, job: ("ip-10-0-1-2", "i-0abc"))
    ec2 = SimpleNamespace(terminate_instances=lambda InstanceIds: killed.append(InstanceIds))  # noqa: N803
    import boto3

    monkeypatch.setattr(boto3.session, "Session", lambda region_name: SimpleNamespace(client=lambda name: ec2))
    probe = probes.chaos_probe("dev", "us-west-2", "python", sleep=clock.sleep, clock=clock,
                               wall=lambda: 1_000_000.0 + clock.now)
    log = io.StringIO()
    outcome = probe({"job": "gang-abc", "namespace": "training"}, log, 3600)
    assert outcome.exit_status == 0 and killed == [["i-0abc"]]
    assert outcome.figures["incident"] == (
        "incident 1 at 1970-01-12T13:46:50Z: disruption (DeletionByTaintManager) of gang-0-1: 2 pod(s) replaced "
        "(2 disruption(s), 0 counted); resumed from step 120 after 412.5s, at least 3 step(s) lost")
    assert outcome.figures["time_to_resume_s"] == 412.5 and outcome.figures["terminated_instance"] == "i-0abc"
    assert "terminated i-0abc (node ip-10-0-1-2)" in log.getvalue()


def test_the_chaos_probe_fails_when_the_gang_ends_instead_of_resuming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "submit_status", lambda *args: {"phase": "Failed", "reason": "BackoffLimitExceeded"})
    outcome = probes.chaos_probe("dev", "us-west-2", "python", sleep=lambda s: None)(
        {"job": "gang-abc", "namespace": "training"}, io.StringIO(), 60)
    assert outcome.exit_status == 1 and outcome.note == "chaos: gang-abc ended (Failed) while waiting for training"


@pytest.mark.slow  # moto's first run_instances loads its AMI and instance-type tables: seconds (the stub test above)
def test_leftovers_against_moto() -> None:
    import boto3
    from moto import mock_aws

    with mock_aws():
        session = boto3.session.Session(region_name="us-west-2", aws_access_key_id="testing",
                                        aws_secret_access_key="testing")
        ec2, s3 = session.client("ec2"), session.client("s3")
        [instance] = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="m6i.large",
                                       TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                           {"Key": "eks:cluster-name", "Value": "ml-dev"}]}])["Instances"]
        volume = ec2.create_volume(AvailabilityZone="us-west-2a", Size=10, TagSpecifications=[
            {"ResourceType": "volume", "Tags": [{"Key": "kubernetes.io/cluster/ml-dev", "Value": "owned"}]}])
        claim = ec2.create_volume(AvailabilityZone="us-west-2a", Size=10, VolumeType="gp3", TagSpecifications=[
            {"ResourceType": "volume", "Tags": [{"Key": "project", "Value": "ml-cluster"},
                                                {"Key": "stack", "Value": "dev"}]}])  # the gp3 class's tags
        s3.create_bucket(Bucket="mlc-dev-datasets", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_bucket_tagging(Bucket="mlc-dev-datasets", Tagging={"TagSet": [
            {"Key": "project", "Value": "ml-cluster"}, {"Key": "stack", "Value": "dev"}]})
        s3.create_bucket(Bucket="other-stack", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_bucket_tagging(Bucket="other-stack", Tagging={"TagSet": [
            {"Key": "project", "Value": "ml-cluster"}, {"Key": "stack", "Value": "staging"}]})
        assert find_leftovers(session.client, "dev", "ml-cluster", "ml-dev") == [
            "arn:aws:s3:::mlc-dev-datasets", f"instance {instance['InstanceId']}",
            *sorted(f"volume {v['VolumeId']}" for v in (volume, claim))]
        ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
        ec2.delete_volume(VolumeId=volume["VolumeId"])
        ec2.delete_volume(VolumeId=claim["VolumeId"])
        s3.delete_bucket(Bucket="mlc-dev-datasets")
        assert find_leftovers(session.client, "dev", "ml-cluster", "ml-dev") == []
