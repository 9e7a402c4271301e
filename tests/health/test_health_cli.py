"""The burn-in's container commands end to end against a stand-in for the Node API on 127.0.0.1
(tests/health/apiserver.py): plan skips a node that passed, report records the verdict the results say."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import workloads.health.__main__ as cli
from tests.health.apiserver import FakeNodes
from workloads.health.efa import efa_check, efa_interfaces, provider_listed
from workloads.health.kube import InCluster, KubeError
from workloads.health.verdict import Evidence, decide, read_efa_check

DATA = Path(__file__).parent / "data"
NODE = "ip-10-0-7-21.ec2.internal"


def _node(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "resourceVersion": "100", "labels": {"ml-cluster.io/gpu-type": "h100",
                                                                            **(labels or {})}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    account = tmp_path / "serviceaccount"
    account.mkdir()
    with FakeNodes({NODE: _node()}) as fake:
        (account / "token").write_text(fake.token + "\n")
        monkeypatch.setattr(cli, "InCluster", lambda: InCluster(host=fake.url, account=account))
        yield fake


def _results(tmp_path: Path, dcgm: str, gpus: int = 8) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(DATA / dcgm, results / "dcgm.json")
    (results / "dcgm.rc").write_text("0\n")
    (results / "gpu.json").write_text(json.dumps({"devices": gpus, "ranks": gpus, "gpus": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_ok": True, "compute_ok": True, "error": None}
        for i in range(gpus)], "allreduce": {"ok": True, "error": None, "busbw_gbps": 361.5}}))
    (results / "gpu.rc").write_text("0\n")
    return results


ARGS = ["--node", NODE, "--label-prefix", "ml-cluster.io"]


def test_report_labels_a_healthy_node_passed(api: FakeNodes, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    results = _results(tmp_path, "dcgm-r2-pass-p5.json")
    api.interfere = 1  # another controller writes the node between the reporter's read and its patch
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    node = api.nodes[NODE]
    assert node["metadata"]["labels"]["ml-cluster.io/gpu-health"] == "passed"
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "us-east-1a"  # the other write survived
    assert [method for method, _ in api.requests] == ["GET", "PATCH", "GET", "PATCH"]  # 422, read again
    assert "labelled ml-cluster.io/gpu-health=passed" in capsys.readouterr().out
    # The next pod on this node skips every check.
    assert cli.main(["plan", *ARGS, "--results", str(results)]) == 0
    assert (results / "skip").exists()


def test_plan_replaces_a_planted_skip_link_instead_of_writing_through_it(api: FakeNodes, tmp_path: Path) -> None:
    results = _results(tmp_path, "dcgm-r2-pass-p5.json")
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    (results / "skip").symlink_to(outside)
    assert cli.main(["plan", *ARGS, "--results", str(results)]) == 0
    assert outside.read_text() == "keep\n"
    assert not (results / "skip").is_symlink() and (results / "skip").read_text() == "the node already passed\n"


def test_report_fails_and_cordons_a_node_with_faulty_memory(api: FakeNodes, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    results = _results(tmp_path, "dcgm-r2-fail-memory.json")
    assert cli.main(["plan", *ARGS, "--results", str(results)]) == 0
    assert not (results / "skip").exists()
    # While the checks run, cluster-autoscaler must not remove the node (it runs only DaemonSets: "unneeded").
    assert api.nodes[NODE]["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
        "ml-cluster.io/gpu-health-holds-scale-down": "true"}
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    node = api.nodes[NODE]
    # The verdict is in: the hold is lifted, so the autoscaler may remove the failed (cordoned) node.
    assert "cluster-autoscaler.kubernetes.io/scale-down-disabled" not in node["metadata"]["annotations"]
    assert node["metadata"]["labels"]["ml-cluster.io/gpu-health"] == "failed"
    assert node["spec"]["unschedulable"] is True
    assert {"key": "ml-cluster.io/gpu-health", "value": "failed", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert "Found 4 faulty memory elements on GPU 3" in node["metadata"]["annotations"][
        "ml-cluster.io/gpu-health-reason"]
    assert f"{NODE}: failed: dcgm Deployment/software GPU 3" in capsys.readouterr().out


def test_report_without_results_fails_the_node(api: FakeNodes, tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "dcgm.rc").write_text("124\n")
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    reason = api.nodes[NODE]["metadata"]["annotations"]["ml-cluster.io/gpu-health-reason"]
    assert reason.splitlines() == ["dcgm: the diagnostic left no output (exit 124, timed out)",
                                   "gpu: the memory/compute check left no result"]


def test_a_linked_or_oversized_result_is_refused(api: FakeNodes, tmp_path: Path) -> None:
    results = _results(tmp_path, "dcgm-r2-pass-p5.json")
    (results / "gpu.json").unlink()
    (results / "gpu.json").symlink_to("/etc/hostname")
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    assert api.nodes[NODE]["metadata"]["labels"]["ml-cluster.io/gpu-health"] == "failed"


def test_a_fifo_or_deeply_nested_result_fails_the_node_without_blocking(api: FakeNodes, tmp_path: Path) -> None:
    results = _results(tmp_path, "dcgm-r2-pass-p5.json")
    (results / "gpu.json").unlink()
    os.mkfifo(results / "gpu.json")  # no writer: an open that waited for one would hang the burn-in
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    reason = api.nodes[NODE]["metadata"]["annotations"]["ml-cluster.io/gpu-health-reason"]
    assert "gpu.json: is a FIFO, not a regular file" in reason
    (results / "gpu.json").unlink()
    (results / "gpu.json").write_text("[" * 100_000)
    assert cli.main(["report", *ARGS, "--results", str(results), "--expect-gpus", "8", "--no-hold"]) == 0
    assert api.nodes[NODE]["metadata"]["labels"]["ml-cluster.io/gpu-health"] == "failed"


def test_bad_arguments_and_api_errors_are_one_line(api: FakeNodes, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["plan", "--node", "../etc", "--label-prefix", "p", "--results", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: arguments: argument --node: '../etc' is not a node name")
    assert cli.main(["plan", "--node", "gone", "--label-prefix", "p", "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: gone: GET /api/v1/nodes/gone: HTTP 404") and err.count("\n") == 1


@pytest.mark.parametrize("body", [b"\xff\xfe{", b"not json", b"[" * 100_000])
def test_an_answer_that_is_not_json_is_a_kube_error(tmp_path: Path, body: bytes) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    (tmp_path / "token").write_text("t\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = InCluster(host=f"http://127.0.0.1:{server.server_address[1]}", account=tmp_path)
        with pytest.raises(KubeError, match=f"^GET /api/v1/nodes/{NODE}: answer is not JSON"):
            client.get_node(NODE)
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_is_an_error_and_the_token_never_reaches_its_location(tmp_path: Path) -> None:
    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirect(Elsewhere):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_address[1]}/api/v1/nodes/{NODE}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    (tmp_path / "token").write_text("secret-token\n")
    api = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (elsewhere, api):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = InCluster(host=f"http://127.0.0.1:{api.server_address[1]}", account=tmp_path)
        with pytest.raises(KubeError, match=f"^GET /api/v1/nodes/{NODE}: HTTP 302") as caught:
            client.get_node(NODE)
        assert caught.value.status == 302
        assert seen == []
    finally:
        for server in (elsewhere, api):
            server.shutdown()
            server.server_close()


def test_efa_counts_efa_devices_from_sysfs_links(tmp_path: Path) -> None:
    sysfs = tmp_path / "infiniband"
    for index, driver in enumerate(["efa", "efa", "mlx5_core"]):
        device = tmp_path / "devices" / f"dev{index}"
        (device / "drivers").mkdir(parents=True)
        (sysfs / f"rdmap{index}").mkdir(parents=True)
        (sysfs / f"rdmap{index}" / "device").symlink_to(device)
        (device / "driver").symlink_to(f"../../bus/pci/drivers/{driver}")
    assert efa_interfaces(sysfs) == 2
    assert efa_interfaces(tmp_path / "absent") == 0
    assert provider_listed("provider: efa\n    fabric: efa\nprovider: efa\n")
    assert not provider_listed("fi_getinfo: -61 (No data available)\n")
    result = efa_check(str(tmp_path / "no-fi_info"), sysfs)
    assert {key: result[key] for key in ("interfaces", "provider_ok", "error")} == {
        "interfaces": 2, "provider_ok": False,
        "error": f"{tmp_path / 'no-fi_info'} not found (EFA installer missing from the image)"}


def test_the_efa_check_reports_the_containers_locked_memory_limit(tmp_path: Path) -> None:
    """The burn-in's EFA check runs in a container of the node like a training pod's and records the locked-memory
    limit the runtime gave it; a finite one is a named failure of the node."""
    script = ("import json, resource, sys; from workloads.health.efa import efa_check; "
              "resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536)); "
              f"print(json.dumps(efa_check({str(tmp_path / 'no-fi_info')!r}, {str(tmp_path)!r})))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(done.stdout)
    assert result["memlock_unlimited"] is False and result["memlock_kib"] == 64
    efa = read_efa_check({**result, "interfaces": 2, "provider_ok": True, "error": None})
    verdict = decide(Evidence(expected_gpus=0, expected_efa=2, efa=efa))
    efa_reasons = tuple(reason for reason in verdict.reasons if reason.startswith("efa"))
    assert efa_reasons == ("efa: containers get 64 KiB of locked memory (ulimit -l); libfabric needs unlimited "
                               "(the node's containerd rlimits: docs/architecture.md, EFA)",)
    with pytest.raises(ValueError, match="memlock_kib"):
        read_efa_check({"interfaces": 2, "provider_ok": True, "memlock_kib": "64"})


def test_efa_writes_its_result_whole_and_a_missing_results_directory_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["efa", "--results", str(tmp_path)]) == 0
    assert set(json.loads((tmp_path / "efa.json").read_text())) == {"interfaces", "provider_ok", "error",
                                                                    "memlock_unlimited", "memlock_kib"}
    assert [path.name for path in tmp_path.iterdir()] == ["efa.json"]  # no temporary file left beside it
    missing = tmp_path / "missing"
    assert cli.main(["efa", "--results", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {missing}: cannot write efa.json") and err.count("\n") == 1


def test_the_memory_pattern_catches_a_flipped_bit() -> None:
    torch = pytest.importorskip("torch")
    from workloads.health.gpucheck import pattern_mismatches

    block = torch.empty(1 << 16, dtype=torch.int32)
    assert pattern_mismatches(block, seed=7) == 0

    class Flaky:
        """Wraps a block whose reads come back with one bit stuck at 1, as a bad HBM cell would."""

        def __init__(self, data: Any) -> None:
            self.data = data
            self.device = data.device

        def numel(self) -> int:
            return int(self.data.numel())

        def copy_(self, source: Any) -> Flaky:
            self.data.copy_(source)
            self.data[1000] |= 1 << 5
            return self

        def bitwise_not_(self) -> Flaky:
            self.data.bitwise_not_()
            self.data[1000] |= 1 << 5
            return self

        def __ne__(self, other: Any) -> Any:  # type: ignore[override]
            return self.data != other

    assert pattern_mismatches(Flaky(torch.empty(1 << 16, dtype=torch.int32)), seed=7) == 1


@pytest.mark.slow
def test_gpucheck_on_a_machine_without_gpus_reports_instead_of_passing(tmp_path: Path) -> None:
    """torchrun, two processes, no CUDA: every rank says so, rank 0 writes the summary, the verdict fails."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from workloads.health.verdict import Evidence, decide, read_gpu_check

    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
         "workloads.health.gpucheck", "--out", str(tmp_path), "--timeout", "60"],
        capture_output=True, text=True, timeout=180, env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 0, completed.stderr[-2000:]
    summary = json.loads((tmp_path / "gpu.json").read_text())
    assert summary["devices"] == 0 and summary["ranks"] == 2
    assert [gpu["error"] for gpu in summary["gpus"]] == ["no CUDA device 0 (0 visible)", "no CUDA device 1 (0 visible)"]
    verdict = decide(Evidence(expected_gpus=2, dcgm=None, gpu=read_gpu_check(summary)))
    assert "gpu: CUDA sees 0 GPUs, the node's type has 2" in verdict.reasons
