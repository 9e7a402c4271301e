"""Stack files written to hurt: YAML alias bombs and recursive aliases, tens of thousands of unknown keys, one bad
section that would cascade into false errors elsewhere, flags and networks that silently widen what a stack does."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import ConfigError, parse_stack_config, read_stack_file
from infra.config.deploy import DeployConfig
from infra.config.errors import MAX_REPORTED_PROBLEMS
from infra.plan.engine import STACKS_DIR
from infra.policy.stackfile import StackFileError, stack_protected
from infra.stackyaml import MAX_EXPANDED_NODES, STACK_FILE_MAX_BYTES, load_stack_yaml, read_stack_document
from scripts import new_stack
from scripts import plan as plan_cli

DEV = (STACKS_DIR / "Pulumi.dev.yaml").read_text()


def _with_config_lines(lines: str) -> str:
    return DEV.replace("config:\n", "config:\n" + lines, 1)


def laughs(levels: int) -> str:
    """A "billion laughs" file: each level an alias list of nine of the level below (9**levels strings)."""
    text = '  ml-cluster:l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for level in range(1, levels + 1):
        text += f"  ml-cluster:l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]\n"
    return _with_config_lines(text)


def test_an_alias_bomb_is_refused_at_once_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(laughs(9))  # 387 million strings if expanded
    with pytest.raises(ConfigError) as caught:  # refused by the node budget, never expanded
        read_stack_file(path)
    [(where, why)] = caught.value.problems
    assert where == str(path) and why.startswith("invalid YAML at line ")
    assert f"aliases expand the file beyond {MAX_EXPANDED_NODES} nodes" in why
    with pytest.raises(StackFileError, match="aliases expand the file"):  # the destroy guard reads it safely too
        stack_protected(path)


@pytest.mark.parametrize("value", ["&loop [*loop]", "&loop {a: *loop}", "&loop [[1, *loop]]"])
def test_a_recursive_alias_is_one_error_line(tmp_path: Path, value: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(_with_config_lines(f"  ml-cluster:loop: {value}\n"))
    assert plan_cli.main(["--stack", "dev", "--config", str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}: invalid YAML at line ") and "alias *loop refers to a node that contains" \
        in line


def test_aliases_within_the_budget_still_work() -> None:
    assert load_stack_yaml("a: &pool {name: gpu, maxSize: 2}\nb: [*pool, *pool]\n") == {
        "a": {"name": "gpu", "maxSize": 2}, "b": [{"name": "gpu", "maxSize": 2}] * 2}
    assert load_stack_yaml(laughs(4).replace("ml-cluster:", "x")) is not None  # 9**4 = 6561 strings


def _config_with_unknown_storage_keys(count: int) -> dict[str, Any]:
    values = dict(yaml.safe_load(DEV)["config"])
    values["ml-cluster:storage"] = {**values["ml-cluster:storage"], **{f"k{i}": 1 for i in range(count)}}
    return values


def _calls_while_parsing(values: dict[str, Any]) -> tuple[int, ConfigError]:
    """How many Python and builtin calls parse_stack_config makes (a count, the same on a loaded machine)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        parse_stack_config(values)
    except ConfigError as exc:
        return calls, exc
    finally:
        sys.setprofile(None)
    raise AssertionError("unknown keys were accepted")


class _Why(str):
    """A problem's text that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Why.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_unknown_keys_cost_linear_work_and_a_bounded_report() -> None:
    """Thousands of unknown keys: the work grows with the count, not its square (was minutes at 40,000 keys:
    de-duplication compared every pair), counted in calls and comparisons, not timed."""
    small, _ = _calls_while_parsing(_config_with_unknown_storage_keys(1000))
    large, caught = _calls_while_parsing(_config_with_unknown_storage_keys(2000))
    assert large < 2.2 * small
    lines = caught.lines()
    assert len(caught.shown()) == 2000 and len(lines) == MAX_REPORTED_PROBLEMS + 1
    assert lines[-1] == f"error: config: {2000 - MAX_REPORTED_PROBLEMS} more problems not shown (fix the ones above " \
                        "first)"
    for size in (2000, 4000):  # each problem once, as many comparisons as there are repeats (not size**2 / 2)
        problems = [("storage", _Why(f"k{i}: extra inputs are not permitted")) for i in range(size)]
        _Why.compared = 0
        shown = ConfigError(problems + [("storage", _Why(why)) for _, why in problems[:10]]).shown()
        assert len(shown) == size and _Why.compared <= 10 * 3  # ConfigError's message and shown() each dedupe


def test_one_bad_storage_key_does_not_make_every_job_bucket_unknown(plan_config: Any) -> None:
    document = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    storage = {**document["ml-cluster:storage"], "addonVersions": {"aws-efs-csi-driver": "v1"}}
    jobs = document["ml-cluster:jobs"]
    jobs[0]["dataset"] = {"uri": "s3://mlc-prod-datasets-111122223333/laion/", "mountPath": "/data/laion",
                          "staging": "cache", "stagedSize": "400Gi"}
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:storage": storage, "ml-cluster:jobs": jobs})
    assert [path for path, _ in caught.value.shown()] == ["ml-cluster:storage.addonVersions.aws-efs-csi-driver"]


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "52.0.0.0/8", "52.0.0.0/15"])
def test_egress_cidrs_cannot_open_the_endpoint_to_the_world(cidr: str) -> None:
    with pytest.raises(ValueError, match="not a runner's static egress"):
        DeployConfig.model_validate({"egressCidrs": [cidr]})
    assert DeployConfig.model_validate({"egressCidrs": ["52.1.0.0/16", "52.9.9.0/28"]}).egress_cidrs


@pytest.mark.parametrize(("flag", "value"), [("--runner-labels", ",,,"), ("--runner-labels", "a,,b"),
                                             ("--zones", ",")])
def test_an_empty_list_flag_is_an_error_not_a_default(tmp_path: Path, flag: str, value: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--stack", "team", "--admin-role-arn", "arn:aws:iam::123456789012:role/admins", "--account",
            "123456789012", "--region", "us-west-2", "--zones", "us-west-2a,us-west-2b", "--stacks-dir",
            str(tmp_path), flag, value]
    assert new_stack.main(args) == 2
    assert capsys.readouterr().err == f"error: {flag}: {value!r} has an empty item: give comma-separated values, " \
                                      "e.g. a,b\n"
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_a_directory_or_a_huge_file_is_one_error_naming_it_and_nothing_blocks(tmp_path: Path) -> None:
    """Every reader of stack files (config, offline plan, destroy guard, policy config) goes through one reader:
    a regular file of at most STACK_FILE_MAX_BYTES; a FIFO must not block a guard forever."""
    fifo = tmp_path / "Pulumi.fifo.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "Pulumi.huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(STACK_FILE_MAX_BYTES + 1)
    for path, why in ((fifo, "is a FIFO, not a regular file"), (tmp_path, "is a directory, not a regular file"),
                      (huge, f"larger than {STACK_FILE_MAX_BYTES}")):
        with pytest.raises(ConfigError) as caught:  # a FIFO read would block here for ever: it is never opened
            read_stack_file(path)
        [(where, message)] = caught.value.problems
        assert where == str(path) and why in message
        with pytest.raises(StackFileError) as guarded:
            stack_protected(path)
        assert str(guarded.value).startswith(f"{path}: ") and why in str(guarded.value)


def test_a_stack_file_the_user_linked_is_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.yaml"
    target.write_text(DEV)
    link = tmp_path / "Pulumi.dev.yaml"
    link.symlink_to(target)
    assert read_stack_document(link) == yaml.safe_load(DEV)
    assert read_stack_file(link)[0]["ml-cluster:platform"] == "eks"


def test_unquoted_capacity_block_times_plan_like_quoted_ones(tmp_path: Path) -> None:
    """Before: `startTime: 2026-11-20T11:30:00Z` unquoted is a YAML timestamp, which reached json.dumps as a
    datetime (TypeError traceback in plan and preflight). The stack file reader keeps timestamps as text."""
    from infra.plan.engine import plan_stack
    from infra.stackyaml import load_stack_yaml

    loaded = load_stack_yaml("when: 2026-11-20T11:30:00Z\nday: 2026-11-20\nn: 15\nflag: true\n")
    assert loaded == {"when": "2026-11-20T11:30:00Z", "day": "2026-11-20", "n": 15, "flag": True}
    block = ("    - name: h100-block\n      instanceTypes: [p5.48xlarge]\n      gpu: true\n"
             "      capacityType: CAPACITY_BLOCK\n      maxSize: 2\n"
             "      capacityReservation: {id: cr-0123456789abcdef0, availabilityZone: us-east-1b, instanceCount: 2,\n"
             "                            startTime: 2026-11-20T11:30:00Z, endTime: 2026-11-27T11:30:00Z}\n")
    text = (STACKS_DIR / "Pulumi.prod.yaml").read_text().replace("  ml-cluster:nodePools:\n",
                                                                  "  ml-cluster:nodePools:\n" + block, 1)
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(text)
    plan = plan_stack("prod", path)
    assert any(r["name"] == "mlc-prod-nodepools-h100-block-ng" for r in plan["resources"])


@pytest.mark.parametrize(("old", "new", "path", "why"), [
    ("endpointPublicAccess: true", "endpointPublicAccess: 'yes'", "ml-cluster:cluster.endpointPublicAccess",
     "'yes' is not a boolean: write true without quotes"),
    ("backup: false", "backup: 'false'", "ml-cluster:storage.efs.backup",
     "'false' is not a boolean: write false without quotes"),
    ("backup: false", "backup: 'maybe'", "ml-cluster:storage.efs.backup",
     "'maybe' is not a boolean: write true or false"),
    ("logRetentionDays: 7", "logRetentionDays: '15'", "ml-cluster:cluster.logRetentionDays",
     "'15' is text, not a whole number: write 15 without quotes"),
    ("maxSize: 2\n", "maxSize: true\n", "ml-cluster:nodePools[1].maxSize", "True is a boolean, not a number"),
    ("ml-cluster:protected: false", "ml-cluster:protected: 'no'", "ml-cluster:protected",
     "'no' is not a boolean: write false without quotes"),
    # Job specs in the stack file: the Job-spec parser applies the same rule.
    ("activeDeadlineSeconds: 172800", "activeDeadlineSeconds: '15'", "ml-cluster:jobs[0].activeDeadlineSeconds",
     "'15' is text, not a whole number: write 15 without quotes"),
    ("      gpus: 1\n      gpuType: a10g\n      shmSize: 4Gi",
     "      gpus: '1'\n      gpuType: a10g\n      shmSize: 4Gi", "ml-cluster:jobs[0].gpus",
     "'1' is text, not a whole number: write 1 without quotes"),
    ("      checkpoint: {claimName: checkpoints-efs}\n      activeDeadlineSeconds: 172800",
     "      checkpoint: {claimName: checkpoints-efs}\n      activeDeadlineSeconds: 172800\n      suspend: 'yes'",
     "ml-cluster:jobs[0].suspend", "'yes' is not a boolean: write true without quotes"),
])
def test_booleans_and_numbers_written_as_text_are_errors_saying_what_to_write(
        tmp_path: Path, old: str, new: str, path: str, why: str) -> None:
    from infra.plan.engine import load_stack_file, validate_stack_file

    assert old in DEV
    file = tmp_path / "Pulumi.dev.yaml"
    file.write_text(DEV.replace(old, new, 1))
    with pytest.raises(ConfigError) as caught:
        validate_stack_file(load_stack_file("dev", file))
    assert (path, why) in caught.value.shown(), caught.value.shown()


def test_top_level_scalars_arrive_as_the_pulumi_cli_hands_them_over() -> None:
    """The CLI hands a top-level `protected: true` to the program as the text "true"; nested values keep types."""
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.prod.yaml")
    assert parse_stack_config({**values, "ml-cluster:protected": "true"}).protected is True
    assert parse_stack_config({**values, "ml-cluster:protected": True}).protected is True
    with pytest.raises(ConfigError, match="ml-cluster:protected: 'yes' is not a boolean: write true without quotes"):
        parse_stack_config({**values, "ml-cluster:protected": "yes"})
