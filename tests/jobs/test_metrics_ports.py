"""Metrics endpoints of rendered Jobs: a named port per trainer process and for the stager, discovery metadata, and
the namespace policy that lets the monitoring namespace (and nothing else) reach exactly those ports."""

from __future__ import annotations

import pytest

from tests.jobs.facts import dev_facts, prod_facts
from tests.jobs.jobrules import check_job, validate_strict
from tests.jobs.test_jobspec import S3_COPY, spec, train_container
from workloads.data.__main__ import build_parser
from workloads.jobspec import metrics_ports, namespace_network_policies, render_job
from workloads.train.__main__ import parse_args


def _ports(container: dict) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container.get("ports", [])}


def test_every_rank_of_a_multi_node_job_has_its_own_named_port() -> None:
    job, service, policy = render_job(spec(gpus=8, gpuType="h100", nodes=2, dataset=S3_COPY), prod_facts())
    check_job(job)
    assert _ports(train_container(job)) == {**{f"metrics-r{r}": 9450 + r for r in range(8)}, "rendezvous": 29500}
    stager = job["spec"]["template"]["spec"]["initContainers"][0]
    assert _ports(stager) == {"metrics-stage": 9449}
    # The gang policy admits only the gang; the namespace-wide scrape policy (below) adds the monitoring namespace.
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/instance": job["metadata"]["name"]}}}]


def test_single_gpu_job_serves_rank_zero_only() -> None:
    job, = render_job(spec(gpus=1), dev_facts())
    check_job(job)
    assert _ports(train_container(job)) == {"metrics-r0": 9450}
    env = {item["name"]: item.get("value") for item in train_container(job)["env"]}
    assert (env["METRICS_PORT"], env["METRICS_ADDR"]) == ("9450", "0.0.0.0")


def test_scrape_policy_covers_every_metrics_port_a_pod_can_declare() -> None:
    job, *_ = render_job(spec(gpus=8, gpuType="h100", nodes=2, dataset=S3_COPY), prod_facts())
    pod = job["spec"]["template"]["spec"]
    declared = {p["containerPort"] for c in pod["containers"] + pod["initContainers"] for p in c.get("ports", [])
                if p["name"].startswith("metrics-")}
    _deny, scrape = namespace_network_policies("training", {}, metrics_namespace="monitoring",
                                               metrics_ports=metrics_ports(8))
    validate_strict(scrape)
    rule, = scrape["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert {port["port"] for port in rule["ports"]} == declared


@pytest.mark.parametrize("staging", ["copy", "cache"])
def test_the_rendered_commands_are_accepted_by_the_clis_they_call(staging: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The stager's argv parses with the data CLI and serves on its declared port; the trainer accepts its rendered
    args, and its env port is the one its container declares for local rank 0."""
    job, *_ = render_job(spec(gpus=8, gpuType="h100", nodes=2,
                              dataset={**S3_COPY, "staging": staging}), prod_facts())
    pod = job["spec"]["template"]["spec"]
    stager = pod["initContainers"][0]
    python, dash_m, module, *argv = stager["command"]
    assert (python, dash_m, module) == ("python", "-m", "workloads.data")
    args = build_parser().parse_args(argv)
    assert args.metrics_port == _ports(stager)["metrics-stage"]
    env = {item["name"]: item["value"] for item in train_container(job)["env"] if "value" in item}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = parse_args(train_container(job)["args"])
    assert config.wait_for_data_s == (600 if staging == "cache" else 0)
    assert (config.metrics_port, config.metrics_addr) == (_ports(train_container(job))["metrics-r0"], "0.0.0.0")
