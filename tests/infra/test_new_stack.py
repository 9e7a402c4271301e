"""`make new-stack` writes a stack file from the account's facts; the file plans cleanly offline and carries no
placeholder a real run would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config.placeholders import account_problems, placeholder_problems
from infra.plan.engine import plan_stack
from scripts.new_stack import main as new_stack
from tests.awsstub import without_aws_credentials

ACCOUNT = "210987654321"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/ml-platform-admins"
FLAGS = ["--account", ACCOUNT, "--region", "eu-west-1", "--zones", "eu-west-1a,eu-west-1b,eu-west-1c,eu-west-1d"]


def test_the_new_stack_file_plans_offline_and_a_real_run_would_accept_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert new_stack(["--stack", "team", "--admin-role-arn", ADMIN, "--researcher-role-arn",
                      f"arn:aws:iam::{ACCOUNT}:role/ml-researchers", "--stacks-dir", str(tmp_path), *FLAGS]) == 0
    path = tmp_path / "Pulumi.team.yaml"
    assert capsys.readouterr().out.startswith(f"wrote {path} (account {ACCOUNT}, eu-west-1, zones eu-west-1a, ")
    values = yaml.safe_load(path.read_text())["config"]
    assert values["ml-cluster:network"]["create"]["availabilityZones"] == ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    assert placeholder_problems(values, deploying=True) == []
    assert account_problems(values["ml-cluster:accountId"], ACCOUNT) == []
    plan = plan_stack("team", path)
    (cluster,) = [r for r in plan["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
    assert cluster["inputs"]["name"] == "ml-team"
    entries = sorted(r["inputs"]["principalArn"] for r in plan["resources"] if r["type"] == "aws:eks/accessEntry:"
                     "AccessEntry")
    assert entries == [ADMIN, f"arn:aws:iam::{ACCOUNT}:role/ml-researchers"]
    # every chart it pins is one the render check has (the real Helm engine; a stale pin has no package)
    from scripts.render_charts import check_plan

    charts = Path(__file__).resolve().parents[1] / "charts" / "upstream"
    lines = check_plan(plan, charts, values["ml-cluster:cluster"]["kubernetesVersion"])
    assert lines and all(line.startswith("ok: ") for line in lines), lines
    assert "#   ml-cluster:kueue: {enabled: true}" in path.read_text()  # how to turn the off-by-default parts on


@pytest.mark.parametrize(("args", "error"), [
    (["--admin-role-arn", "arn:aws:iam::111122223333:role/admins"],
     "error: ml-cluster:cluster.accessEntries[0].principalArn: arn:aws:iam::111122223333:role/admins names the "
     "documentation account 111122223333"),
    (["--admin-role-arn", "arn:aws:sts::210987654321:assumed-role/admins/me"],
     "error: ml-cluster:cluster.accessEntries[0].principalArn: String should match pattern"),
    (["--admin-role-arn", ADMIN, "--public-access-cidr", "203.0.113.0/24", "--runner-labels", "self-hosted,vpc"],
     "error: ml-cluster:cluster.publicAccessCidrs[0]: 203.0.113.0/24 is a documentation network"),
    (["--admin-role-arn", ADMIN, "--account", "12345"], "error: arguments: --account '12345' is not a 12-digit"),
    (["--admin-role-arn", ADMIN, "--zones", "us-east-1a,us-east-1b"],
     "error: ml-cluster:network.create.availabilityZones[0]: us-east-1a is not a zone of aws:region eu-west-1"),
    ([], "error: --admin-role-arn: required for a new cluster (or give --from-cluster / --cluster for an existing "),
])
def test_bad_facts_are_one_error_line_and_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  args: list[str], error: str) -> None:
    with _no_raise():
        code = new_stack(["--stack", "team", "--stacks-dir", str(tmp_path), *FLAGS, *args])
        assert code == 2
    assert capsys.readouterr().err.startswith(error)
    assert not list(tmp_path.iterdir())


def test_an_existing_stack_file_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    assert new_stack(["--stack", "dev", "--admin-role-arn", ADMIN, "--stacks-dir", str(tmp_path), *FLAGS]) == 2
    assert "exists: pick another --stack, or --force to replace it" in capsys.readouterr().err
    assert (tmp_path / "Pulumi.dev.yaml").read_text() == "config: {}\n"


class _no_raise:  # noqa: N801 - used like pytest.raises
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


@pytest.mark.parametrize("target", ["file", "directory"])
def test_an_unwritable_target_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                target: str) -> None:
    if target == "file":  # --stacks-dir names a file: the directory cannot be made
        (tmp_path / "stacks").write_text("x")
        stacks, path = tmp_path / "stacks", tmp_path / "stacks" / "Pulumi.team.yaml"
    else:  # the stack file's name is taken by a directory: the rename fails
        stacks, path = tmp_path, tmp_path / "Pulumi.team.yaml"
        path.mkdir()
    assert new_stack(["--stack", "team", "--admin-role-arn", ADMIN, "--stacks-dir", str(stacks), "--force",
                      *FLAGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["Pulumi.team.yaml" if target != "file" else "stacks"]


def test_without_credentials_the_error_names_the_make_variable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `make new-stack` the flags go in NEW_STACK_ARGS: the error that asks for them says so."""
    without_aws_credentials(monkeypatch, tmp_path)
    assert new_stack(["--stack", "team", "--admin-role-arn", ADMIN, "--stacks-dir", str(tmp_path),
                      "--region", "eu-west-1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: aws: ") and "pass --account, --region and --zones" in line, line
    assert "NEW_STACK_ARGS='--account " in line, line
    assert not (tmp_path / "Pulumi.team.yaml").exists()
