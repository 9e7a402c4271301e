"""The Kubernetes reader preflight uses on an existing cluster, over TLS as an EKS endpoint answers it: a stand-in
API server on https://127.0.0.1 with a CA and server certificates made in the test, the CA handed over the way
DescribeCluster's certificateAuthority.data is (base64 PEM). It reads through a certificate that CA signed for the
address; a certificate another CA signed, or one for another name, is refused in one line that names the cluster
and the reason, before any request is sent; the bearer token never goes over plain HTTP (a non-loopback http://
endpoint, a redirect)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from infra.account.checks import FAIL, PASS, WARN
from infra.account.existing import check_existing_cluster, check_helm_releases, helm_releases
from infra.account.kubeapi import KubeApi, KubeApiError
from infra.config.schema import decode_config_value, parse_stack_config
from infra.plan.engine import FIXTURES_DIR, STACKS_DIR
from tests.infra.test_existing_helm import stored
from tests.jobs.kubeapi import TOKEN, FakeApiServer, fake_api_server
from tests.tlscerts import Authority, authority, server_context

ARN = json.loads((FIXTURES_DIR / "clusters.json").read_text())["ml-shared"]["arn"]


@pytest.fixture(scope="module")
def cluster_ca() -> Authority:
    return authority("kubernetes")  # EKS names each cluster's CA "kubernetes"


@pytest.fixture(scope="module")
def config() -> Any:
    values = yaml.safe_load((STACKS_DIR / "Pulumi.existing.yaml").read_text())["config"]
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def _serve(ca: Authority, names: list[str]) -> Any:
    return fake_api_server(tls=server_context(ca, names))


@pytest.fixture
def tls_api(cluster_ca: Authority) -> Iterator[FakeApiServer]:
    with _serve(cluster_ca, ["127.0.0.1"]) as server:
        server.add(stored("kueue", "kueue-system", "kueue", "0.19.2"))
        yield server


def _kube(server: FakeApiServer, ca: Authority) -> KubeApi:
    return KubeApi(server.url, TOKEN, ca.ca_data, timeout_s=5, deadline_s=10, cluster="ml-shared")


def test_it_reads_through_tls_verified_against_the_clusters_ca(tls_api: FakeApiServer, cluster_ca: Authority,
                                                              config: Any) -> None:
    assert tls_api.url.startswith("https://127.0.0.1:")
    [release] = helm_releases(_kube(tls_api, cluster_ca))
    assert (release.namespace, release.name, release.chart, release.version) == ("kueue-system", "kueue", "kueue",
                                                                                  "0.19.2")
    rows = {check.name: check for check in check_helm_releases(_kube(tls_api, cluster_ca), config)}
    assert rows["helm kueue"].status == PASS and "this stack's own" in rows["helm kueue"].detail
    assert ("GET", "/api/v1/secrets") in tls_api.requests


def test_describe_cluster_s_endpoint_and_certificate_authority_reach_the_reader(
        tls_api: FakeApiServer, cluster_ca: Authority, config: Any) -> None:
    """The whole path preflight takes: DescribeCluster (the AWS stub) names the endpoint and the CA's data, and the
    reader made from them (as run_preflight makes it, but for the token) reads the releases through TLS."""
    from tests.awsstub import AwsStub

    stub = AwsStub().start()
    try:
        stub.routes[("GET", "/clusters/ml-shared")] = lambda query: (200, {"cluster": {
            "name": "ml-shared", "arn": ARN, "version": "1.35", "status": "ACTIVE", "endpoint": tls_api.url,
            "certificateAuthority": {"data": cluster_ca.ca_data},
            "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"},
            "resourcesVpcConfig": {"vpcId": "vpc-0123456789abcdef0", "subnetIds": [
                s for s in json.loads((FIXTURES_DIR / "clusters.json").read_text())["ml-shared"]["vpcConfig"]
                ["subnetIds"]], "clusterSecurityGroupId": "sg-0fedcba9876543210"}}})
        stub.routes[("GET", "/clusters/ml-shared/addons")] = lambda query: (200, {"addons": []})
        stub.routes[("GET", "/clusters/ml-shared/node-groups")] = lambda query: (200, {"nodegroups": []})
        checks = check_existing_cluster(stub.client("eks"), config, lambda found: KubeApi(
            found.endpoint, TOKEN, found.certificate_authority, timeout_s=5, cluster=found.name), stack="existing")
    finally:
        stub.stop()
    rows = {check.name: check for check in checks}
    assert rows["cluster ml-shared"].status == PASS, rows["cluster ml-shared"]
    assert rows["helm kueue"].status == PASS and "kueue 0.19.2" in rows["helm kueue"].detail
    assert ("GET", "/api/v1/secrets") in tls_api.requests


@pytest.mark.parametrize(("signer", "names", "says"), [
    ("another", ["127.0.0.1"], "is not signed by the cluster's certificate authority (certificateAuthority.data): "
                               "unable to get local issuer certificate"),
    ("cluster", ["api.other.example"], "does not name the endpoint's host (IP address mismatch, certificate is not "
                                       "valid for '127.0.0.1'.)"),
])
def test_a_certificate_the_clusters_ca_did_not_sign_for_the_address_is_refused_in_one_line(
        cluster_ca: Authority, config: Any, signer: str, names: list[str], says: str) -> None:
    ca = cluster_ca if signer == "cluster" else authority("someone-else")
    with _serve(ca, names) as server:
        server.add(stored("kueue", "kueue-system", "kueue", "0.19.2"))
        with pytest.raises(KubeApiError) as refused:
            helm_releases(_kube(server, cluster_ca))
        [check] = check_helm_releases(_kube(server, cluster_ca), config)
        assert server.requests == []  # the handshake failed: no request, no token, reached the server
    assert refused.value.tls and refused.value.status is None
    assert refused.value.why == f"cluster ml-shared ({server.url}): refused: the API server's certificate {says}"
    assert check.status == FAIL and check.name == "helm releases"
    assert check.detail == f"not checked: {refused.value.why}" and "\n" not in check.detail
    assert "the token is not sent to it" in check.fix


@pytest.mark.parametrize(("ca_data", "says"), [
    ("not base64 at all", "Incorrect padding"),
    ("QQ==", "does not contain a certificate"),  # base64 of "A": not a PEM certificate
])
def test_a_certificate_authority_that_is_not_a_pem_certificate_is_one_line(tls_api: FakeApiServer, config: Any,
                                                                          ca_data: str, says: str) -> None:
    kube = KubeApi(tls_api.url, TOKEN, ca_data, timeout_s=5, cluster="ml-shared")
    [check] = check_helm_releases(kube, config)
    assert check.status == FAIL and "\n" not in check.detail
    assert check.detail.startswith(f"not checked: cluster ml-shared ({tls_api.url}): its certificate authority "
                                   "(certificateAuthority.data) is not a base64 PEM certificate (")
    assert says in check.detail, check.detail
    assert tls_api.requests == []


def test_the_token_goes_only_over_tls(tls_api: FakeApiServer, cluster_ca: Authority, config: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_api_server() as plain:  # plain HTTP, on loopback (allowed only there: the tests' stand-ins)
        tls_api.redirects["/api/v1/secrets"] = f"{plain.url}/api/v1/secrets"
        [check] = check_helm_releases(_kube(tls_api, cluster_ca), config)
        assert plain.requests == []  # the redirect was not followed: the token stayed on the TLS connection
    assert check.status == WARN and "\n" not in check.detail
    assert check.detail == (f"not checked: GET /api/v1/secrets: 302 redirected to {plain.url}/api/v1/secrets: not "
                            "followed (the token goes only to the cluster's endpoint)")
    connects: list[object] = []
    monkeypatch.setattr("socket.create_connection", lambda *args, **kwargs: connects.append(args))
    for endpoint in ("http://192.0.2.1", "http://api.ml-shared.example:80", "ftp://192.0.2.1"):  # TEST-NET-1
        with pytest.raises(KubeApiError, match=r"not https://: the bearer token goes only over TLS$") as refused:
            KubeApi(endpoint, TOKEN, cluster="ml-shared", timeout_s=5).get("/api/v1/secrets")
        assert refused.value.why.startswith(f"cluster ml-shared ({endpoint}): ")
    assert connects == []  # refused before connecting, not after


def test_plain_http_to_a_tls_endpoint_is_one_line(tls_api: FakeApiServer, config: Any) -> None:
    kube = KubeApi(tls_api.url.replace("https://", "http://"), TOKEN, timeout_s=5, cluster="ml-shared")
    [check] = check_helm_releases(kube, config)
    assert check.status == WARN and check.detail.startswith("not checked: GET /api/v1/secrets: unreachable: ")
    assert "\n" not in check.detail
