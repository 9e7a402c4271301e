"""Team members see their runs' queue state on an adopted Kueue too. Kueue's chart folds its Workload, LocalQueue and
pending-workloads viewer roles into `view` and `edit` from 0.18.0 only (kubernetes-sigs/kueue v0.19.2
charts/kueue/templates/rbac/workload_viewer_role.yaml:28-30; v0.13.4, v0.14.8, v0.15.0 and v0.17.8 name the same
roles without the aggregation labels), so on an older Kueue the team RoleBindings to view/edit leave members unable
to read Workloads or their queue position: the stack then adds a ClusterRole with those roles' rules, bound in each
team's namespace to every group of the team."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.names import check_derived_names, derived_names
from infra.config.queueing import KueueConfig
from infra.tenancy import kueue_viewer_role, member_bindings
from tests.conftest import stack_values
from tests.storage.test_fsx_config import prod_config, prod_storage
from tests.tenancy.teams import TEAMS


def kueue(version: str | None) -> KueueConfig:
    values: dict[str, Any] = {**stack_values("prod")["ml-cluster:kueue"], "teams": TEAMS}
    if version is not None:
        values["external"] = {"version": version, "release": "kueue", "namespace": "kueue"}
    return KueueConfig.model_validate(values)


@pytest.mark.parametrize(("version", "aggregated"), [
    (None, True), ("0.13.4", False), ("0.14.8", False), ("0.15.0", False), ("0.17.8", False), ("0.18.0", True),
    ("0.19.2", True)])
def test_the_kueue_viewer_role_is_added_where_view_does_not_hold_kueues_roles(version: str | None,
                                                                             aggregated: bool) -> None:
    config = kueue(version)
    assert config.viewer_roles_aggregated is aggregated
    vision = config.tenant_teams[0]
    bindings = {b["metadata"]["name"]: b for b in member_bindings(vision, "existing", "ml-cluster.io",
                                                                  kueue_viewer=not aggregated)}
    assert set(bindings) == {"team-view", "team-principals-view"} | (set() if aggregated else {"team-kueue-view"})
    if not aggregated:
        viewer = bindings["team-kueue-view"]
        assert viewer["metadata"]["namespace"] == "team-vision"
        assert viewer["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                     "name": "existing-team-kueue-viewer"}
        every = {s["name"] for name in ("team-view", "team-principals-view") for s in bindings[name]["subjects"]}
        assert {s["name"] for s in viewer["subjects"]} == every == {"vision-oncall", "ml-cluster.io:team-vision"}


def test_the_role_reads_workloads_queues_and_positions_and_nothing_else() -> None:
    role = kueue_viewer_role("existing", "ml-cluster.io")
    assert role["metadata"]["name"] == "existing-team-kueue-viewer"
    assert not any(key.startswith("rbac.authorization.k8s.io/aggregate") for key in role["metadata"]["labels"])
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert {verb for _, _, verb in granted} == {"get", "list", "watch"}
    assert ("kueue.x-k8s.io", "workloads", "list") in granted
    assert ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get") in granted
    assert {resource for _, resource, _ in granted} == {"workloads", "workloads/status", "localqueues",
                                                         "localqueues/status", "localqueues/pendingworkloads"}


def test_derived_names_list_the_role_and_each_teams_binding_on_an_older_kueue() -> None:
    base = prod_config(prod_storage())
    names = {(d.kind, d.namespace, d.name) for d in derived_names(base.model_copy(update={"kueue": kueue("0.14.8")}),
                                                                   "prod")}
    assert ("ClusterRole", "", "prod-team-kueue-viewer") in names
    assert {("RoleBinding", f"team-{team}", "team-kueue-view") for team in ("vision", "language")} <= names
    current = {(d.kind, d.name) for d in derived_names(base.model_copy(update={"kueue": kueue("0.19.2")}), "prod")}
    assert not {("ClusterRole", "prod-team-kueue-viewer"), ("RoleBinding", "team-kueue-view")} & current
    assert not check_derived_names(derived_names(base.model_copy(update={"kueue": kueue("0.14.8")}), "prod"), "prod")
