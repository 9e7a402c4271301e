"""Submitting needs a kubeconfig only: the stack publishes its job facts as a ConfigMap (built here from the offline
plan of the dev stack), and `python -m workloads.submit render|submit|status` read it through the kubeconfig's
current context from a stand-in Kubernetes API on 127.0.0.1, with no Pulumi on PATH and no --facts. A cluster
without the ConfigMap, or an identity that may not read it, is one error line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import resources_of
from tests.jobs.kubeapi import FakeApiServer, fake_api_server
from tests.jobs.test_goodput_status import finished_pod
from workloads.cluster_facts import FACTS_CONFIG_KEY, FACTS_CONFIG_MAP, facts_from_dict
from workloads.goodput_status import predicted
from workloads.submit import cli as submit

SPEC = Path(__file__).resolve().parents[2] / "examples" / "plain-pytorch-job.yaml"


@pytest.fixture
def published(stack_plan: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The facts ConfigMap of the dev stack's plan, in the Jobs' namespace."""
    plan = stack_plan("dev")
    (config_map,) = [r["inputs"] for r in resources_of(plan, "kubernetes:core/v1:ConfigMap")
                     if r["inputs"]["metadata"]["name"] == FACTS_CONFIG_MAP]
    assert config_map["metadata"]["namespace"] == "training"
    # the same facts as the stack output that --facts FILE reads
    assert facts_from_dict(json.loads(config_map["data"][FACTS_CONFIG_KEY])) == facts_from_dict(
        plan["outputs"]["jobFacts"])
    return config_map


@pytest.fixture
def member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    """A team member's machine: a kubeconfig for the stand-in API server, no Pulumi CLI, no ~/.kube/config."""
    with fake_api_server() as server:
        empty = tmp_path / "bin"
        empty.mkdir()
        monkeypatch.setenv("PATH", str(empty))
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
        assert shutil.which("pulumi") is None
        yield server


def test_render_submit_and_status_with_a_kubeconfig_only(member: FakeApiServer, published: dict[str, Any],
                                                          stack_plan: Callable[[str], dict[str, Any]],
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    member.add(published)
    assert submit.main(["render", str(SPEC)]) == 0
    rendered = list(yaml.safe_load_all(capsys.readouterr().out))
    (job,) = [m for m in rendered if m["kind"] == "Job"]
    # the same Job as rendered from the stack output through --facts
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(stack_plan("dev")["outputs"]["jobFacts"]))
    assert submit.main(["render", str(SPEC), "--facts", str(facts)]) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == rendered

    assert submit.main(["submit", str(SPEC)]) == 0
    name = job["metadata"]["name"]
    assert f"created job/{name} in training" in capsys.readouterr().out
    assert ("Job", "training", name) in member.objects
    # its pod was created, started 5 minutes later and ran 55 more: status prints the goodput measured from the API
    # beside the prediction `submit` annotated the Job with (tests/jobs/test_goodput_status.py)
    member.add(finished_pod(name))
    assert submit.main(["status", name]) == 0
    out = capsys.readouterr().out
    expected = predicted(member.objects[("Job", "training", name)])
    assert out.startswith(name) and expected is not None
    assert out.splitlines()[-1] == f"  goodput 91.7% measured over 1.00 h (startup 8.3%); {expected:.2%} predicted"
    assert ("GET", f"/api/v1/namespaces/training/configmaps/{FACTS_CONFIG_MAP}") in member.requests


def test_a_cluster_without_the_configmap_is_one_line(member: FakeApiServer,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert submit.main(["render", str(SPEC)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: configmap training/{FACTS_CONFIG_MAP}: not found in the cluster at "
                          f"{member.url}") and "--facts FILE" in err


def test_an_identity_that_may_not_read_it_is_one_line(member: FakeApiServer, published: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    member.add(published)
    member.forbidden.add("training")
    assert submit.main(["submit", str(SPEC)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: configmap training/{FACTS_CONFIG_MAP}: forbidden: this identity may not read "
                          "ConfigMaps in namespace training")
    assert not [key for key in member.objects if key[0] == "Job"]  # nothing submitted
