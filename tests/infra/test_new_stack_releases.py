"""`make new-stack CLUSTER=<name>` (read live) looks at the Helm releases the cluster already runs, through its
Kubernetes API as preflight does (here the TLS stand-in with a CA made in the test), and writes `external:` for
them: the cluster's NVIDIA device plugin adopted outright (the stack's own would be a second one on the same GPUs),
its Kueue and kube-prometheus-stack as commented blocks to turn on (a new stack runs neither); releases it cannot
read are one comment line, and the file is written all the same."""

from __future__ import annotations

import socket
from typing import Any

import yaml

from infra.account.kubeapi import KubeApi
from infra.account.newstack import ExistingStackFacts, cluster_releases, render_existing_stack_file
from infra.config.schema import parse_stack_config
from infra.existing_cluster import found_from_describe
from tests.infra.test_existing_helm import stored
from tests.infra.test_new_stack_existing import DESCRIBED
from tests.jobs.kubeapi import TOKEN, fake_api_server
from tests.tlscerts import authority, server_context

FOUND = found_from_describe(DESCRIBED["cluster"], asked="research")


def _render(releases: Any, note: str) -> str:
    return render_existing_stack_file(ExistingStackFacts(stack="team", cluster=FOUND, releases=releases,
                                                         releases_note=note))


def test_the_clusters_device_plugin_is_adopted_and_its_kueue_and_monitoring_are_offered() -> None:
    ca = authority("kubernetes")
    with fake_api_server(tls=server_context(ca, ["127.0.0.1"])) as api:
        api.add(stored("nvdp", "nvidia-device-plugin", "nvidia-device-plugin", "0.17.1"))
        api.add(stored("kueue", "kueue-system", "kueue", "0.14.1"))
        api.add(stored("prometheus", "monitoring", "kube-prometheus-stack", "77.0.0"))
        api.add(stored("old", "monitoring", "kube-prometheus-stack", "70.0.0", status="uninstalled"))
        releases, note = cluster_releases(KubeApi(api.url, TOKEN, ca.ca_data, timeout_s=5, cluster="research"))
    assert note == "" and len(releases) == 3
    text = _render(releases, note)
    config = yaml.safe_load(text)["config"]
    assert config["ml-cluster:gpu"]["devicePlugin"] == {
        "external": {"version": "0.17.1", "release": "nvdp", "namespace": "nvidia-device-plugin"}}
    assert "ml-cluster:kueue" not in config and "ml-cluster:monitoring" not in config  # offered, not turned on
    assert "  # the cluster runs kueue 0.14.1; to build on it:\n" in text
    turned_on = yaml.safe_load(text.replace("  #   ml-cluster:", "  ml-cluster:"))["config"]
    cfg = parse_stack_config(turned_on)  # each offered block is valid config as written
    assert (cfg.kueue.enabled, cfg.kueue.external.version if cfg.kueue.external else None) == (True, "0.14.1")
    assert cfg.monitoring.external is not None and cfg.monitoring.external.release == "prometheus"


def test_two_releases_of_a_chart_are_named_for_the_user_to_pick() -> None:
    two = (stored("a", "gpu-a", "nvidia-device-plugin", "0.17.1"), stored("b", "gpu-b", "nvidia-device-plugin",
                                                                          "0.17.1"))
    with fake_api_server() as api:
        for item in two:
            api.add(item)
        releases, _ = cluster_releases(KubeApi(api.url, TOKEN, timeout_s=5))
    text = _render(releases, "")
    assert "  # nvidia-device-plugin runs as a in gpu-a, b in gpu-b: adopt one (ml-cluster:gpu.devicePlugin." in text
    assert "external" not in str(yaml.safe_load(text)["config"]["ml-cluster:gpu"])


def test_releases_it_cannot_read_are_one_comment_line_and_the_file_is_written() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    releases, note = cluster_releases(KubeApi(f"http://127.0.0.1:{port}", TOKEN, timeout_s=2, cluster="research"))
    assert releases == () and note.startswith("  # Helm releases not read (GET /api/v1/secrets: unreachable: ")
    assert note.count("\n") == 1
    text = _render(releases, note)
    assert note in text and yaml.safe_load(text)["config"]["ml-cluster:gpu"]["devicePlugin"] == {
        "chartVersion": yaml.safe_load(_render((), ""))["config"]["ml-cluster:gpu"]["devicePlugin"]["chartVersion"]}


def test_the_live_command_reads_them_with_an_eks_token_over_tls(tmp_path: Any, monkeypatch: Any) -> None:
    """`scripts/new_stack.py --cluster research` end to end: DescribeCluster and DescribeSubnets from the AWS stub
    (through AWS_ENDPOINT_URL), the token `aws eks get-token` would print, and the releases from the TLS stand-in
    at the endpoint DescribeCluster names, verified against the CA it hands over."""
    from scripts.new_stack import main as new_stack
    from tests.awsstub import AwsStub

    ca = authority("kubernetes")
    stub = AwsStub().start()
    try:
        with fake_api_server(tls=server_context(ca, ["127.0.0.1"])) as api:
            api.token = None  # any bearer token: the one made here is a presigned STS URL
            api.add(stored("nvdp", "kube-system", "nvidia-device-plugin", "0.17.1"))
            cluster = {**DESCRIBED["cluster"], "endpoint": api.url, "certificateAuthority": {"data": ca.ca_data}}
            stub.routes[("GET", "/clusters/research")] = lambda query: (200, {"cluster": cluster})
            subnets = "".join(f"<item><subnetId>{s}</subnetId><mapPublicIpOnLaunch>false</mapPublicIpOnLaunch>"
                              "</item>" for s in cluster["resourcesVpcConfig"]["subnetIds"])
            stub.ec2_actions["DescribeSubnets"] = lambda form: (200, (
                '<DescribeSubnetsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId>'
                f"<subnetSet>{subnets}</subnetSet></DescribeSubnetsResponse>"))
            for name, value in (("AWS_ENDPOINT_URL", stub.url), ("AWS_ACCESS_KEY_ID", "testing"),
                                ("AWS_SECRET_ACCESS_KEY", "testing")):
                monkeypatch.setenv(name, value)
            monkeypatch.delenv("AWS_PROFILE", raising=False)
            assert new_stack(["--stack", "team", "--cluster", "research", "--region", "eu-west-1",
                              "--stacks-dir", str(tmp_path)]) == 0
    finally:
        stub.stop()
    assert api.tokens and all(token.startswith("Bearer k8s-aws-v1.") for token in api.tokens)
    config = yaml.safe_load((tmp_path / "Pulumi.team.yaml").read_text())["config"]
    assert config["ml-cluster:gpu"]["devicePlugin"]["external"] == {"version": "0.17.1", "release": "nvdp",
                                                                    "namespace": "kube-system"}
