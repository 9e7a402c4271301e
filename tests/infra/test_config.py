"""The stack-config schema: every committed stack is valid; every kind of bad input is one `path: why` line."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import ConfigError, parse_stack_config, read_stack_file
from infra.config.schema import decode_config_value
from infra.plan.engine import OFFLINE_SECRET, load_stack_file, offline_config, validate_stack_file
from tests.conftest import CLI, STACKS, stack_values

REPO = Path(__file__).resolve().parents[2]
ERROR_LINE = re.compile(r"^error: \S.*: .+$")


def parse(values: dict[str, Any], secret_keys: tuple[str, ...] = ()) -> Any:
    return parse_stack_config(values, secret_keys)


def problems(values: dict[str, Any], secret_keys: tuple[str, ...] = ()) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        parse(values, secret_keys)
    return dict(caught.value.problems)


@pytest.mark.parametrize("stack", STACKS)
def test_every_committed_stack_is_valid(stack: str) -> None:
    validate_stack_file(load_stack_file(stack))


def test_unknown_keys_are_errors_at_every_level() -> None:
    values = stack_values("dev")
    values["ml-cluster:clsuter"] = {}
    values["ml-cluster:cluster"]["kubernetesVersoin"] = "1.33"
    values["ml-cluster:network"]["create"]["natGateway"] = "single"
    found = problems(values)
    assert set(found) >= {"clsuter", "cluster.kubernetesVersoin", "network.create.natGateway"}
    assert all("unknown key" in why for why in found.values())
    # the key meant, when one of the model's keys at that level is close
    assert found["clsuter"] == "unknown key (did you mean 'cluster'?)"
    assert found["cluster.kubernetesVersoin"] == "unknown key (did you mean 'kubernetesVersion'?)"
    assert found["network.create.natGateway"] == "unknown key (did you mean 'natGateways'?)"
    values = stack_values("dev")
    values["ml-cluster:storage"]["buckets"][0]["zzz"] = True  # nothing close: where to look instead
    assert problems(values)["storage.buckets.0.zzz"] == ("unknown key (check the spelling; "
                                                         "docs/reference/stack-config.md lists the keys)")


def test_all_problems_are_collected_together() -> None:
    values = stack_values("dev")
    values["ml-cluster:cluster"]["name"] = "Not_A_DNS_Name"
    values["ml-cluster:cluster"]["kubernetesVersion"] = "1.12"
    values["ml-cluster:network"]["create"]["cidr"] = "10.10.0.0/24"
    values["ml-cluster:network"]["create"]["availabilityZones"] = ["us-west-2a"]
    found = problems(values)
    assert set(found) == {"cluster.name", "cluster.kubernetesVersion", "network.create.cidr",
                          "network.create.availabilityZones"}
    assert "DNS-1123" in found["cluster.name"]
    assert "1.12" in found["cluster.kubernetesVersion"]


def test_network_needs_exactly_one_of_create_and_existing() -> None:
    values = stack_values("dev")
    values["ml-cluster:network"]["existing"] = {"vpcId": "vpc-0123456789abcdef0",
                                                 "privateSubnetIds": ["subnet-0a1b2c3d4e5f60001"]}
    assert "exactly one" in problems(values)["network"]
    values["ml-cluster:network"] = {}
    assert "exactly one" in problems(values)["network"]


def test_existing_subnet_lists_must_not_be_empty_and_ids_well_formed() -> None:
    values = stack_values("prod")
    values["ml-cluster:network"]["existing"]["privateSubnetIds"] = []
    values["ml-cluster:network"]["existing"]["publicSubnetIds"] = ["sn-123"]
    found = problems(values)
    assert "network.existing.privateSubnetIds" in found
    assert "network.existing.publicSubnetIds" in found


def test_platform_rules() -> None:
    eks = stack_values("dev")
    del eks["aws:region"]
    assert "aws:region" in problems(eks)["config"]
    onprem = {key: OFFLINE_SECRET if isinstance(value, dict) and "secure" in value else value
              for key, value in stack_values("onprem").items()}
    onprem.pop("ml-cluster:kubeconfig")
    assert "kubeconfig" in problems(onprem, ("ml-cluster:cosHmacAccessKeyId",
                                             "ml-cluster:cosHmacSecretAccessKey"))["config"]


def test_plaintext_secret_is_rejected() -> None:
    values = stack_values("onprem")
    values["ml-cluster:kubeconfig"] = "apiVersion: v1\nkind: Config\n"
    found = problems(values, ("ml-cluster:cosHmacAccessKeyId", "ml-cluster:cosHmacSecretAccessKey"))
    assert "must be a secret" in found["ml-cluster:kubeconfig"]


def test_secret_values_never_show_in_errors_or_repr() -> None:
    stack_file = load_stack_file("onprem")
    config, secret_keys = offline_config(stack_file)
    parsed = parse_stack_config({k: decode_config_value(v) for k, v in config.items()}, secret_keys)
    assert parsed.kubeconfig is not None and parsed.kubeconfig.get_secret_value() == OFFLINE_SECRET
    assert OFFLINE_SECRET not in repr(parsed) and OFFLINE_SECRET not in str(parsed.model_dump())


def _run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "plan.py"), *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("content, expected", [
    ("config:\n  aws:region: [unclosed\n", "invalid YAML at line"),
    ("- just\n- a list\n", "must be a mapping"),
    ("config:\n  ml-cluster:platform: eks\n  ml-cluster:cluster: 5\n", "cluster"),
    ("config:\n  ml-cluster:platform: mainframe\n", "platform"),
    ("configs: {}\n", "unknown top-level key"),
])
def test_malformed_stack_files_exit_2_with_only_error_lines(tmp_path: Path, content: str, expected: str,
                                                           plan_cli: CLI) -> None:
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text(content)
    code, out, err = plan_cli("--stack", "broken", "--config", str(path))  # main() in-process: nothing may raise
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines and all(ERROR_LINE.match(line) for line in lines), err
    assert "Traceback" not in err and out == ""
    assert expected in err


def test_missing_stack_file_is_one_error_line(tmp_path: Path) -> None:
    """The CLI in its own process: an unreadable stack file is exit 2 and an error line, no traceback."""
    result = _run_plan("--stack", "nope", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and "cannot read" in result.stderr


# --- fuzzing: any mutation of a valid config is either valid or a clean list of `path: why` problems ---

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=12), st.just("100Gi"), st.just("-1"), st.just("1.33"))
_values = st.recursive(_scalars, lambda children: st.one_of(st.lists(children, max_size=3),
                                                            st.dictionaries(st.text(max_size=8), children,
                                                                            max_size=3)), max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*prefix, index))
    return found


def _mutate(document: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    mutated = copy.deepcopy(document)
    parent = mutated
    for step in path[:-1]:
        parent = parent[step]
    if delete and isinstance(parent, dict):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return mutated


@pytest.mark.parametrize("stack", ["dev", "prod", "onprem"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_configs_fail_cleanly(stack: str, data: st.DataObject) -> None:
    stack_file = load_stack_file(stack)
    base = {key: value for key, value in stack_file.values.items() if key not in stack_file.secure_keys}
    path = data.draw(st.sampled_from(_paths(base)))
    mutated = _mutate(base, path, data.draw(_values), data.draw(st.booleans()))
    secrets = {key: OFFLINE_SECRET for key in stack_file.secure_keys}
    try:
        parse_stack_config({**mutated, **secrets}, stack_file.secure_keys)
    except ConfigError as error:
        assert error.problems
        for line in error.lines():
            assert ERROR_LINE.match(line) and "\n" not in line, line


def test_read_stack_file_reports_secure_keys() -> None:
    values, secure = read_stack_file(REPO / "stacks" / "Pulumi.onprem.yaml")
    assert set(secure) == {"ml-cluster:kubeconfig", "ml-cluster:cosHmacAccessKeyId",
                           "ml-cluster:cosHmacSecretAccessKey"}
    assert yaml.safe_dump(values)


def test_storage_rules_that_need_the_platform_run_in_config_validation() -> None:
    onprem = {key: OFFLINE_SECRET if isinstance(value, dict) and "secure" in value else value
              for key, value in stack_values("onprem").items()}
    secrets = ("ml-cluster:kubeconfig",)
    onprem.pop("ml-cluster:cosHmacAccessKeyId")
    onprem.pop("ml-cluster:cosHmacSecretAccessKey")
    assert "cosHmacAccessKeyId" in problems(onprem, secrets)["config"]
    eks = stack_values("dev")
    cos = onprem["ml-cluster:storage"]["cos"]
    cos["buckets"] = [{**bucket, "name": f"cos-{bucket['name']}"} for bucket in cos["buckets"]]
    eks["ml-cluster:storage"] = {**eks["ml-cluster:storage"], "cos": cos}
    assert "mount: true needs the onprem COS driver" in problems(eks)["config"]


def test_job_errors_carry_their_field_path() -> None:
    values = stack_values("dev")
    values["ml-cluster:jobs"][0]["memory"] = "1Mi"
    found = problems(values)
    assert "jobs.0.memory" in found and "does not cover" in found["jobs.0.memory"]
