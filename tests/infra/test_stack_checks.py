"""Issue 12: a stack that `pulumi up` would reject (or deploy wrongly) never plans with exit 0, and every bad
stack file ends in `error: <path>: <why>` lines with exit 2, never a traceback.

Each case mutates a committed stack file and runs scripts/plan.py's main() in-process (the same code path as the
CLI, without a new interpreter per case)."""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import re
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.errors import config_path
from infra.config.names import check_stack_name, derived_names
from infra.config.schema import parse_stack_config
from infra.plan.engine import load_stack_file, offline_config
from tests.conftest import STACKS, stack_values

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plan_cli", REPO / "scripts" / "plan.py")
assert _spec is not None and _spec.loader is not None
plan_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan_cli)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = plan_cli.main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def plan_values(tmp_path: Path, stack: str, values: dict[str, Any], name: str | None = None) -> tuple[int, str, str]:
    path = tmp_path / f"Pulumi.{name or stack}.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    return run_cli(f"--stack={name or stack}", "--config", str(path), "--json")


def error_lines(code: int, err: str) -> list[str]:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), lines
    return lines


def _dev(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    values = stack_values("dev")
    mutate(values)
    return values


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(values: dict[str, Any]) -> None:
        node: Any = values
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return mutate


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    # two logical buckets, one physical bucket
    "same-physical-bucket": (_set(["ml-cluster:storage", "buckets", 1, "bucketName"], "mlc-dev-datasets-111122223333"),
                             "ml-cluster:storage.buckets[0].name", "is also the name given by"),
    # a StorageClass named like the gp3 class
    "storage-class-clash": (lambda v: [_set(["ml-cluster:storage", "efs", "storageClass", "name"], "gp3")(v), *(
        volume.update(storageClass="gp3") for volume in v["ml-cluster:storage"]["sharedVolumes"])],
                            "ml-cluster:storage.gp3.name", "StorageClass 'gp3'"),
    # a shared volume claim named like a mounted bucket's claim
    "claim-clash": (lambda v: v["ml-cluster:storage"]["sharedVolumes"].append(
        {"name": "s3-datasets", "storageClass": "efs-ap"}),
        "ml-cluster:storage.buckets[0].name", "PersistentVolumeClaim 's3-datasets' in namespace training"),
    # a Job that checkpoints to a bucket its role cannot write
    "foreign-checkpoint-bucket": (_set(["ml-cluster:jobs", 0, "checkpoint"], {"uri": "s3://someone-elses/ckpt/"}),
                                  "ml-cluster:jobs[0].checkpoint.uri", "cannot write it"),
    # a Job that stages from a bucket its role cannot read
    "foreign-dataset-bucket": (_set(["ml-cluster:jobs", 0, "dataset"],
                                    {"uri": "s3://someone-elses/imagenet/", "mountPath": "/data/imagenet",
                                     "staging": "copy", "stagedSize": "150Gi"}),
                               "ml-cluster:jobs[0].dataset.uri", "cannot read it"),
    # a node pool pinned to an AZ without a private subnet (was a ValueError in nodepools)
    "pool-zone-without-subnet": (_set(["ml-cluster:nodePools", 1, "availabilityZones"], ["us-west-2d"]),
                                 "ml-cluster:nodePools[1].availabilityZones", "no private subnet in us-west-2d"),
    # a pool name that makes an EKS node-group name longer than 63
    "long-node-group-name": (_set(["ml-cluster:nodePools", 0, "name"], "s" * 40),
                             "ml-cluster:nodePools[0].name", "EKS node group name"),
    # schema errors use the same path style as the rest
    "job-field-path-style": (_set(["ml-cluster:jobs", 0, "memory"], "1Mi"), "ml-cluster:jobs[0].memory", ""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_stack_is_an_error_with_its_path(tmp_path: Path, case: str) -> None:
    mutate, path, why = CASES[case]
    code, out, err = plan_values(tmp_path, "dev", _dev(mutate))
    lines = error_lines(code, err)
    assert out == ""
    assert any(line.startswith(f"error: {path}: ") and why in line for line in lines), lines


@pytest.mark.parametrize("stack", ["Prod", "a_b", "dev stack", "x" * 40, "-dev"])
def test_stack_names_that_make_invalid_names_are_rejected_up_front(tmp_path: Path, stack: str) -> None:
    code, _, err = plan_values(tmp_path, "dev", stack_values("dev"), name=stack)
    lines = error_lines(code, err)
    assert lines[0].startswith("error: stack: ") and repr(stack) in lines[0], lines


def test_stack_name_rule() -> None:
    assert check_stack_name("dev") == [] and check_stack_name("team-a2") == []
    assert check_stack_name("Prod") and check_stack_name("a_b") and check_stack_name("a.b")


def test_onprem_plaintext_secret_reports_only_the_secret(tmp_path: Path) -> None:
    values = stack_values("onprem")
    values["ml-cluster:kubeconfig"] = "apiVersion: v1"
    code, _, err = plan_values(tmp_path, "onprem", values)
    assert error_lines(code, err) == ["error: ml-cluster:kubeconfig: must be a secret: "
                                      "pulumi config set --secret ml-cluster:kubeconfig"]


@pytest.mark.parametrize("content", [b"config:\n  aws:region: \xff\xfe us-west-2\n", b"\x00\x01\x02binary\x00",
                                     b"[" * 5000 + b"]" * 5000, b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000])
def test_unreadable_stack_files_are_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_bytes(content)
    code, _, err = run_cli("--stack", "dev", "--config", str(path))
    lines = error_lines(code, err)
    assert lines[0].startswith(f"error: {path}: "), lines


def test_one_path_style() -> None:
    assert config_path("jobs.0.memory") == "ml-cluster:jobs[0].memory"
    assert config_path("ml-cluster:jobs[0].memory") == "ml-cluster:jobs[0].memory"
    assert config_path("platform") == "ml-cluster:platform" and config_path("region") == "aws:region"
    assert config_path("nodePools.1.instanceTypes.1") == "ml-cluster:nodePools[1].instanceTypes[1]"
    assert config_path("stacks/fixtures/subnets.json") == "stacks/fixtures/subnets.json"
    assert config_path("stack") == "stack" and config_path("config") == "config"


# The training namespace's own policies (a Job's per-gang policy is named after the Job, derived when it renders).
NAMESPACE_POLICIES = ("default-deny-ingress", "allow-metrics-scrape", "restrict-egress")


@pytest.mark.parametrize("stack", STACKS)
def test_derived_names_match_the_plan(stack: str, stack_plan: Any) -> None:
    """The up-front list of physical names is the list the program creates (for Kubernetes objects and buckets)."""
    stack_file = load_stack_file(stack)
    config, secret = offline_config(stack_file)
    from infra.config.schema import decode_config_value
    cfg = parse_stack_config({k: decode_config_value(v) for k, v in config.items()}, secret)
    derived = derived_names(cfg, stack, "111122223333")
    plan = stack_plan(stack)
    planned_k8s = sorted((r["inputs"]["kind"], r["inputs"]["metadata"].get("namespace") or "",
                          r["inputs"]["metadata"]["name"]) for r in plan["resources"]
                         if r["type"].startswith("kubernetes:") and "helm.sh" not in r["type"]
                         and r["type"] != "kubernetes:yaml/v2:ConfigFile"  # a component (its objects: a vendored CRD)
                         and not (r["inputs"].get("kind") in ("Job", "Service", "NetworkPolicy")
                                  and r["inputs"]["metadata"]["name"] not in NAMESPACE_POLICIES)
                         and r["inputs"]["metadata"].get("name")
                         # named after instance facts: flavors, Topologies (EC2's layer depth), per-type runtimes
                         and r["inputs"].get("kind") not in ("ResourceFlavor", "Topology")
                         and not (r["inputs"].get("kind") == "ClusterTrainingRuntime"
                                  and re.fullmatch(r"torch-distributed-[a-z0-9]+", r["inputs"]["metadata"]["name"])))
    derived_k8s = sorted((d.kind, d.namespace, d.name) for d in derived if d.service == "kubernetes")
    assert derived_k8s == [k for k in planned_k8s if k[0] != "Node"]
    planned_buckets = sorted(r["inputs"]["bucket"] for r in plan["resources"] if r["type"] == "aws:s3/bucket:Bucket")
    assert sorted(d.name for d in derived if d.service in ("s3", "cos")) == planned_buckets
    # a role named explicitly (a team's) by that name, the others by their logical name (Pulumi adds a suffix)
    planned_roles = sorted(r["inputs"].get("name") or r["name"] for r in plan["resources"]
                           if r["type"] == "aws:iam/role:Role")
    assert set(planned_roles) <= {d.name.removesuffix("-xxxxxxx") for d in derived if d.service == "iam"}


def test_json_plan_has_no_two_resources_with_one_physical_name(stack_plan: Any) -> None:
    for stack in STACKS:
        plan = copy.deepcopy(stack_plan(stack))
        seen = [json.dumps([r["type"], r["inputs"].get("bucket") or (r["inputs"].get("metadata") or {})])
                for r in plan["resources"] if r["type"].startswith("kubernetes:core") or "s3/bucket:" in r["type"]]
        assert len(seen) == len(set(seen)), stack


def test_one_schema_error_does_not_hide_another_pools_problem(tmp_path: Path) -> None:
    values = stack_values("dev")
    values["ml-cluster:nodePools"][0]["instanceTypes"] = ["M6I.LARGE"]
    values["ml-cluster:nodePools"][1]["instanceTypes"] = ["g9.mega"]
    code, _, err = plan_values(tmp_path, "dev", values)
    lines = error_lines(code, err)
    assert lines[0].startswith("error: ml-cluster:nodePools[0].instanceTypes[0]: 'M6I.LARGE'"), lines
    assert any(line.startswith("error: ml-cluster:nodePools[1].instanceTypes[0]: ") and "g9.mega" in line
               for line in lines), lines


def test_invalid_stack_name_is_reported_before_schema_errors(tmp_path: Path) -> None:
    values = stack_values("dev")
    values["ml-cluster:platform"] = "gke"
    code, _, err = plan_values(tmp_path, "dev", values, name="Dev")
    assert error_lines(code, err)[0].startswith("error: stack: 'Dev' is not a valid stack name")


def test_a_bad_job_does_not_hide_a_shared_bucket_name(tmp_path: Path) -> None:
    values = stack_values("dev")
    values["ml-cluster:jobs"][0]["memory"] = "1Mi"
    values["ml-cluster:storage"]["buckets"][1]["bucketName"] = "mlc-dev-datasets-111122223333"
    code, _, err = plan_values(tmp_path, "dev", values)
    lines = error_lines(code, err)
    assert lines[0].startswith("error: ml-cluster:jobs[0].memory: "), lines
    assert any(line.startswith("error: ml-cluster:storage.buckets[0].name: S3 bucket") for line in lines), lines


def test_three_mistakes_in_three_sections_show_in_one_run(tmp_path: Path) -> None:
    """An unknown key in a section every check needs (cluster), an instance-type typo and a Job asking for more GPUs
    than a node has: all three on the first run, the last with the nodes it takes."""
    values = stack_values("dev")
    values["ml-cluster:cluster"]["logRetension"] = 3
    values["ml-cluster:nodePools"][0]["instanceTypes"] = ["m6i.larg"]
    values["ml-cluster:jobs"][0]["gpus"] = 12
    code, _, err = plan_values(tmp_path, "dev", values)
    lines = error_lines(code, err)
    assert any(line.startswith("error: ml-cluster:cluster.logRetension: unknown key (did you mean") for line in lines)
    assert any(line.startswith("error: ml-cluster:nodePools[0].instanceTypes[0]: ") and "m6i.larg" in line
               for line in lines), lines
    assert any(line.startswith("error: ml-cluster:jobs[0].gpus: 12 GPUs per pod") for line in lines), lines


def test_a_bad_pool_does_not_hide_a_jobs_problem(tmp_path: Path) -> None:
    """A valid schema: the pools' lookup failing for one pool still checks the Jobs against the other pools."""
    values = stack_values("dev")
    values["ml-cluster:nodePools"][0]["instanceTypes"] = ["m6i.larg"]
    values["ml-cluster:jobs"][0]["gpus"] = 2
    code, _, err = plan_values(tmp_path, "dev", values)
    lines = error_lines(code, err)
    assert any("m6i.larg" in line for line in lines), lines
    assert any(line.startswith("error: ml-cluster:jobs[0].gpus: 2 GPUs per pod but the largest matching node has 1: "
                               "gpus is per pod, one pod per node; for 2 GPUs set nodes: 2 and gpus: 1")
               for line in lines), lines


@pytest.mark.parametrize(("tags", "why"), [
    ({"kubernetes.io/role": "x"}, "reserved by the EBS CSI driver"),
    ({"ebs.csi.aws.com/owner": "x"}, "reserved by the EBS CSI driver"),
    ({"CSIVolumeName": "x"}, "reserved by the EBS CSI driver"),
    ({"a=b": "x"}, "no '=' in a key"),
    ({"team": "{{ .PVCName }}"}, "no '{{' in a value"),
])
def test_tags_the_gp3_class_cannot_hand_the_ebs_driver_are_refused(tags: dict[str, str], why: str) -> None:
    from infra.config.errors import ConfigError

    values = stack_values("dev")
    values["ml-cluster:tags"] = {"cost-center": "x=y", **tags}  # '=' in a value is the value's
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, ["ml-cluster:kubeconfig"])
    assert "ml-cluster:tags" in str(caught.value) and why in str(caught.value), str(caught.value)
    values["ml-cluster:tags"] = {"cost-center": "x=y"}
    parse_stack_config(values)


def test_a_mixtures_sources_are_what_the_jobs_role_reads() -> None:
    """Each source of a Job's mixture is read by the Jobs' role: one of the stack's buckets (by name or by uri) is
    granted, another bucket is refused at its source."""
    from infra.config.stackcheck import job_bucket_access

    values = stack_values("dev")
    job = {**values["ml-cluster:jobs"][0], "command": ["python", "mix.py"], "args": None, "checkpoint": None}
    job["dataset"] = {"mountPath": "/data", "staging": "copy", "stagedSize": "150Gi", "mixture": [
        {"bucket": "checkpoints", "prefix": "distilled/"}, {"uri": "s3://someone-elses/pile/"}]}
    values["ml-cluster:jobs"] = [{k: v for k, v in job.items() if v is not None}]
    access = job_bucket_access(parse_stack_config(values, ["ml-cluster:kubeconfig"]), "dev", "111122223333")
    assert access.read == ("checkpoints",) and access.write == ()
    assert [path for path, _ in access.problems] == ["ml-cluster:jobs[0].dataset.mixture[1].uri"]
    assert "not one of this stack's S3 buckets" in access.problems[0][1]
