"""ml-cluster:jobControllers: Trainer needs JobSet, and Kueue must integrate every kind the stack can queue."""

from __future__ import annotations

import copy
from typing import Any

from infra.config import parse_stack_config
from tests.conftest import stack_values
from tests.infra.test_config import problems


def staging() -> dict[str, Any]:
    return copy.deepcopy(stack_values("staging"))


def test_staging_enables_both_controllers_and_their_kueue_integrations() -> None:
    cfg = parse_stack_config(staging(), secret_keys=())
    assert cfg.job_controllers.jobset.enabled and cfg.job_controllers.trainer.enabled
    assert cfg.job_controllers.integrations() == ["jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]


def test_trainer_without_jobset_is_a_config_error() -> None:
    values = staging()
    values["ml-cluster:jobControllers"]["jobset"]["enabled"] = False
    assert problems(values) == {"jobControllers": (
        "trainer.enabled needs jobset.enabled: Kubeflow Trainer runs every TrainJob as a JobSet")}


def test_a_controller_kueue_does_not_integrate_is_a_config_error() -> None:
    values = staging()
    values["ml-cluster:kueue"]["integrations"] = ["batch/job", "jobset.x-k8s.io/jobset"]
    [(where, why)] = problems(values).items()
    assert where == "config"
    assert why.startswith("kueue.integrations must list trainer.kubeflow.org/trainjob (jobControllers enables it)")
    values["ml-cluster:kueue"]["enabled"] = False  # no Kueue: nothing to integrate with
    values["ml-cluster:kueue"].pop("teams")
    assert not parse_stack_config(values, secret_keys=()).kueue.enabled
