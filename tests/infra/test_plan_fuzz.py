"""Issue 12 property: a mutated stack file plans to exit 0 with one JSON document, or to exit 2 with only
`error: <path>: <why>` lines; never a traceback, and never two resources with one physical name.

Runs scripts/plan.py's main() in-process (a subprocess per example would cost a second of start-up each)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import stack_values
from tests.infra.test_config import _paths
from tests.infra.test_stack_checks import run_cli

STACK_NAMES = ["dev", "onprem", "prod"]
BASES = {stack: stack_values(stack) for stack in STACK_NAMES}


PATHS = {stack: _paths(values) for stack, values in BASES.items()}

VALUES = st.one_of(
    st.sampled_from(["", "gp3", "s3-datasets", "training", "G5.XLARGE", "a" * 70, "mlc-dev-datasets-111122223333",
                     "us-west-2d", "s3://someone-elses/x/", "checkpoints-efs", "Prod", "a_b", "0", "-1", "1Ti",
                     "efs-ap", "datasets", "x.y", "🙂"]),
    st.integers(min_value=-2, max_value=70000),
    st.booleans(),
    st.none(),
    st.just([]),
    st.just({}),
)


def _mutate(values: dict[str, Any], path: tuple[Any, ...], kind: str, value: Any) -> None:
    parent: Any = values
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if kind == "set":
        parent[last] = value
    elif kind == "delete":
        del parent[last]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    elif kind == "duplicate" and isinstance(parent, dict) and isinstance(parent[last], list) and parent[last]:
        parent[last].append(copy.deepcopy(parent[last][0]))
    else:
        parent[last] = value


def _physical_names(plan: dict[str, Any]) -> list[str]:
    names = []
    for resource in plan["resources"]:
        inputs = resource["inputs"]
        names.append(json.dumps(["urn", resource["type"], resource["name"], resource["parent"]]))
        if resource["type"] == "aws:s3/bucket:Bucket" and inputs.get("bucket"):
            names.append(json.dumps(["bucket", resource["provider"], inputs["bucket"]]))
        if resource["type"].startswith("kubernetes:") and "helm.sh" not in resource["type"]:
            metadata = inputs.get("metadata") or {}
            if metadata.get("name"):
                names.append(json.dumps(["k8s", inputs.get("kind"), metadata.get("namespace"), metadata["name"]]))
    return names


# Bounded and reproducible by default; PLAN_FUZZ_EXAMPLES=500 PLAN_FUZZ_RANDOM=1 for a longer, random hunt.
@settings(max_examples=int(os.environ.get("PLAN_FUZZ_EXAMPLES", "30")), deadline=None, database=None,
          derandomize=not os.environ.get("PLAN_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_stack_files_plan_or_fail_cleanly(tmp_path_factory: Any, data: Any) -> None:
    stack = data.draw(st.sampled_from(STACK_NAMES), label="stack")
    values = copy.deepcopy(BASES[stack])
    for _ in range(data.draw(st.integers(min_value=1, max_value=2), label="mutations")):
        path = data.draw(st.sampled_from(_paths(values) or PATHS[stack]), label="path")
        kind = data.draw(st.sampled_from(["set", "set", "delete", "duplicate"]), label="kind")
        _mutate(values, path, kind, data.draw(VALUES, label="value"))
    directory = tmp_path_factory.mktemp("fuzz")
    config = directory / f"Pulumi.{stack}.yaml"
    config.write_text(yaml.safe_dump({"config": values}))
    code, out, err = run_cli(f"--stack={stack}", "--config", str(config), "--json")
    assert "Traceback" not in err, err
    if code == 0:
        plan = json.loads(out)
        names = _physical_names(plan)
        assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    else:
        assert code == 2, (code, err)
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), lines
        assert out == ""
