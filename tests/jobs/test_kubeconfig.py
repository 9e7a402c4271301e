"""Every tool finds the stack's kubeconfig the same way, and says in one line how to get one when there is none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workloads.kubeconfig import KubeconfigError, resolve_kubeconfig, stack_kubeconfig_path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / ".kube").mkdir()
    return tmp_path


def _touch(path: Path) -> str:
    path.write_text("apiVersion: v1\nkind: Config\n")
    return str(path)


def test_the_stacks_own_file_is_used_and_wins_over_kubeconfig(home: Path) -> None:
    stack_file = _touch(stack_kubeconfig_path("dev", home))
    assert stack_file == str(home / ".kube" / "ml-dev")
    other = _touch(home / "other")
    choice = resolve_kubeconfig(None, "dev", {"KUBECONFIG": other}, home)
    assert choice.files == (stack_file,) and choice.source == "--stack dev"
    assert resolve_kubeconfig(other, "dev", {}, home).files == (other,)  # --kubeconfig is the most explicit


def test_without_a_stack_kubeconfig_then_the_default_file(home: Path) -> None:
    first, second = _touch(home / "a"), _touch(home / "b")
    listed = os.pathsep.join([first, str(home / "missing"), second])
    assert resolve_kubeconfig(None, None, {"KUBECONFIG": listed}, home).files == (first, second)
    default = _touch(home / ".kube" / "config")
    assert resolve_kubeconfig(None, None, {}, home).files == (default,)


@pytest.mark.parametrize(("explicit", "stack", "env", "where", "why"), [
    (None, "prod", {}, "ml-prod", "no kubeconfig for stack prod: run make kubeconfig STACK=prod"),
    (None, None, {}, "kubeconfig", "none found (no --stack, KUBECONFIG or ~/.kube/config): run make kubeconfig"),
    (None, None, {"KUBECONFIG": "/nowhere"}, "KUBECONFIG", "/nowhere: no such file"),
    ("/nowhere/kc", None, {}, "/nowhere/kc", "no such kubeconfig file"),
])
def test_no_kubeconfig_is_one_line_saying_how_to_get_one(home: Path, explicit: str | None, stack: str | None,
                                                         env: dict[str, str], where: str, why: str) -> None:
    with pytest.raises(KubeconfigError) as caught:
        resolve_kubeconfig(explicit, stack, env, home)
    assert caught.value.where.endswith(where) and caught.value.why.startswith(why)
    assert "\n" not in str(caught.value)


def test_inside_a_pod_the_service_account_is_the_last_resort(home: Path) -> None:
    choice = resolve_kubeconfig(None, None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, home)
    assert choice.in_cluster


def test_submit_without_the_stacks_kubeconfig_says_how_to_get_it(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.submit.cli import main

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["--stack", "dev", "status", "resnet50-s3-copy-1a2b3c4d"]) == 2
    assert capsys.readouterr().err == (f"error: {home}/.kube/ml-dev: no kubeconfig for stack dev: "
                                       "run make kubeconfig STACK=dev (after make up)\n")


def test_verify_stack_reads_the_stacks_kubeconfig_by_default(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_stack", Path(__file__).parents[2] / "scripts" /
                                                  "verify_stack.py")
    assert spec is not None and spec.loader is not None
    verify_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify_stack)
    monkeypatch.setenv("HOME", str(home))
    outputs = tmp_path / "outputs.json"
    outputs.write_text('{"platform": "eks", "storage": {"namespace": "training", "buckets": {}, "cosBuckets": {}, '
                       '"storageClasses": [], "datasetClaims": {}, "sharedClaims": []}}')
    assert verify_stack.main(["--outputs", str(outputs), "--stack", "dev", "--skip-aws"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {home}/.kube/ml-dev: no kubeconfig for stack dev")


def test_submit_with_a_stack_reads_its_facts_from_the_stack_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import yaml

    from tests.jobs.facts import dev_facts
    from workloads.cluster_facts import facts_to_dict
    from workloads.submit.cli import main

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(facts_to_dict(dev_facts())))
    calls = tmp_path / "calls"
    fake = bin_dir / "pulumi"  # stands in for the CLI: records its arguments, prints the output
    fake.write_text(f'#!/bin/sh\necho "$@" > {calls}\ncat {facts}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert main(["--stack", "dev", "render", "workloads/jobs/resnet50-s3-copy.yaml"]) == 0
    assert calls.read_text().split() == ["stack", "output", "jobFacts", "--json", "--stack", "dev"]
    (job,) = yaml.safe_load_all(capsys.readouterr().out)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == f"{dev_facts().image_repository}:0.1.0"


@pytest.mark.parametrize(("content", "why"), [
    (b"[1\n", "is not YAML: "),
    (b"- a\n- b\n", "not a kubeconfig (a YAML mapping with clusters, contexts and users)"),
    (b"\xff\xfe", "is not UTF-8 text"),
    (None, "is a directory, not a kubeconfig file"),
])
def test_a_kubeconfig_that_is_no_kubeconfig_is_one_error_line(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              content: bytes | None, why: str) -> None:
    from workloads.submit.cli import main

    path = home / "kc"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["--kubeconfig", str(path), "status", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {why}") and err.count("\n") == 1, err


@pytest.mark.parametrize("stack", ["../x", "/etc/passwd", "a b", "Dev", ""])
def test_a_stack_name_with_path_characters_is_refused(home: Path, stack: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.submit.cli import main

    with pytest.raises(KubeconfigError, match="not a valid stack name"):
        resolve_kubeconfig(None, stack, {}, home)
    assert main(["--stack", stack, "status", "x"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --stack: {stack!r} is not a valid stack name")


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "abc", "1e400"])
def test_a_bad_watch_interval_is_one_error_line(interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.submit.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["watch", "x", "--interval", interval])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: arguments: ") and err.count("\n") == 1, err
