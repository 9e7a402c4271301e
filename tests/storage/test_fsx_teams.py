"""Team directories on FSx for Lustre (storage.fsxLustre.teamDirectories): each tenant team's /teams/<team>, made
and kept in step with its checkpoints prefix by a data repository association, mounted alone by a static PV bound
to the claim in the team's namespace; the config rules are one line each."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.names import check_derived_names, derived_names
from infra.config.stackcheck import fsx_team_associations, fsx_team_claims, fsx_zone_problems
from infra.tenancy import team_facts
from tests.conftest import resources_of, stack_values
from tests.storage.test_fsx_config import prod_config, prod_storage

TEAMS: list[dict[str, Any]] = [
    {"name": "vision", "namespace": "team-vision", "quotas": [{"flavor": "h100", "gpus": 8}],
     "checkpoints": [{"bucket": "checkpoints", "prefix": "vision/"}]},
    {"name": "language", "namespace": "team-language", "quotas": [{"flavor": "a100", "gpus": 8}],
     "checkpoints": [{"bucket": "checkpoints", "prefix": "language/"}]},
]


def _kueue(teams: list[dict[str, Any]]) -> dict[str, Any]:
    return {**stack_values("prod")["ml-cluster:kueue"], "teams": teams}


def _config(teams: list[dict[str, Any]], **fsx: Any) -> Any:
    cfg = prod_config(prod_storage(teamDirectories=True, **fsx))
    return cfg.model_copy(update={"kueue": type(cfg.kueue).model_validate(_kueue(teams))})


def test_each_tenant_team_gets_its_directory_linked_to_its_checkpoints_both_ways() -> None:
    cfg = _config(TEAMS)
    found = dict(fsx_team_associations(cfg))
    assert sorted(found) == ["language", "vision"]
    vision = found["vision"]
    assert (vision.bucket, vision.prefix, vision.file_system_path) == ("checkpoints", "vision/", "/teams/vision")
    assert vision.auto_import == vision.auto_export == ["NEW", "CHANGED", "DELETED"]
    claims = fsx_team_claims(cfg)
    assert claims == {"vision": ("fsx-lustre",), "language": ("fsx-lustre",)}
    assert team_facts(cfg.kueue, claims)["vision"].volume_claims == ("fsx-lustre",)
    assert not any(where.endswith("teamDirectories") for where, _ in fsx_zone_problems(cfg, ["us-east-1a"]))


def test_no_tenant_team_a_team_without_checkpoints_and_a_path_under_teams_are_one_line_each() -> None:
    assert ("ml-cluster:storage.fsxLustre.teamDirectories", "true, but no kueue team has a namespace (no tenant "
            "team to give a directory)") in fsx_zone_problems(_config([]), ["us-east-1a"])
    bare = [TEAMS[0], {**TEAMS[1], "checkpoints": []}]
    found = fsx_zone_problems(_config(bare), ["us-east-1a"])
    assert [why for where, why in found if where.endswith("teamDirectories")] == [
        "team language has no checkpoints prefix: its directory /teams/language is linked to its first one "
        "(kueue.teams[].checkpoints)"]
    under = [{"bucket": "datasets", "fileSystemPath": "/teams/shared"}]
    found = fsx_zone_problems(_config(TEAMS, dataRepositoryAssociations=under), ["us-east-1a"])
    assert ("ml-cluster:storage.fsxLustre.dataRepositoryAssociations[0].fileSystemPath",
            "/teams/shared is under /teams, where teamDirectories puts the teams' directories") in found


@pytest.mark.slow
def test_prod_with_team_directories_plans_a_pv_per_team_on_its_directory(plan_config) -> None:  # type: ignore[no-untyped-def]
    storage = dict(stack_values("prod")["ml-cluster:storage"])
    storage["fsxLustre"] = {**storage["fsxLustre"], "teamDirectories": True}
    plan = plan_config("prod", {"ml-cluster:storage": storage, "ml-cluster:kueue": _kueue(TEAMS)})
    paths = {r["inputs"]["fileSystemPath"]: r for r in resources_of(
        plan, "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")}
    assert set(paths) == {"/datasets", "/checkpoints", "/teams/vision", "/teams/language"}
    assert paths["/teams/vision"]["inputs"]["dataRepositoryPath"] == "s3://mlc-prod-checkpoints-111122223333/vision/"
    fsx = plan["outputs"]["storage"]["fsxLustre"]
    volumes = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"]
               for r in resources_of(plan, "kubernetes:core/v1:PersistentVolume")}
    spec = volumes["team-vision-fsx-lustre"]
    assert spec["csi"]["volumeAttributes"] == {"dnsname": fsx["dnsName"],
                                               "mountname": f"{fsx['mountName']}/teams/vision"}
    assert spec["csi"]["volumeHandle"] == f"{fsx['fileSystemId']}:/teams/vision"
    assert spec["claimRef"] == {"namespace": "team-vision", "name": "fsx-lustre"}
    assert {"namespace": "team-language", "name": "fsx-lustre"} in fsx["claims"]


def test_a_team_efs_claim_named_like_the_fsx_claim_is_refused_naming_both() -> None:
    volume = {"uid": 20001, "gid": 20001, "claim": "fsx-lustre", "size": "1Ti"}
    teams = [{**TEAMS[0], "volume": volume},
             {**TEAMS[1], "volume": {**volume, "uid": 20002, "gid": 20002, "claim": "shared"}}]
    found = [(where, why) for where, why in fsx_zone_problems(_config(teams), ["us-east-1a"])
             if where.endswith("volume.claim")]
    assert found == [("ml-cluster:kueue.teams[0].volume.claim",
                      "team vision: 'fsx-lustre' is also ml-cluster:storage.fsxLustre.claimName, the claim of the "
                      "team's directory /teams/vision in namespace team-vision: name the two claims apart")]
    renamed = [{**teams[0], "volume": {**volume, "claim": "home"}}, teams[1]]
    assert not [where for where, _ in fsx_zone_problems(_config(renamed), ["us-east-1a"])
                if where.endswith("volume.claim")]
    assert team_facts(_config(renamed).kueue, fsx_team_claims(_config(renamed)))["vision"].volume_claims == (
        "home", "fsx-lustre")


def test_the_teams_fsx_volumes_are_derived_names_and_a_clash_with_them_is_one_line() -> None:
    """derived_names lists each team directory's PV and claim (what `up` creates, as the slow plan test shows), so
    the duplicate-name check sees them: team `language` in namespace `team` with an EFS claim `vision-fsx-lustre`
    gets the PV `team-vision-fsx-lustre`, the very name of team vision's FSx PV."""
    names = {(d.kind, d.namespace, d.name): d.path for d in derived_names(_config(TEAMS), "prod")}
    for team in ("vision", "language"):
        assert names[("PersistentVolume", "", f"team-{team}-fsx-lustre")] == "ml-cluster:storage.fsxLustre.claimName"
        assert ("PersistentVolumeClaim", f"team-{team}", "fsx-lustre") in names
    without = [{**TEAMS[0], "checkpoints": []}, TEAMS[1]]  # no checkpoints prefix: no directory, no volume
    assert ("PersistentVolume", "", "team-vision-fsx-lustre") not in {
        (d.kind, d.namespace, d.name) for d in derived_names(_config(without), "prod")}
    volume = {"uid": 20002, "gid": 20002, "claim": "vision-fsx-lustre", "size": "1Ti"}
    clash = [TEAMS[0], {**TEAMS[1], "namespace": "team", "volume": volume}]
    assert check_derived_names(derived_names(_config(clash), "prod"), "prod") == [
        ("ml-cluster:storage.fsxLustre.claimName", "PersistentVolume 'team-vision-fsx-lustre' is also the name given "
         "by ml-cluster:kueue.teams[1].volume.claim: two resources cannot share one name")]
