"""Drive the CrossGuard pack the way the Pulumi engine does; runs in the pack's own virtualenv.

    infra/policy/pack/venv/bin/python tests/policy/pack_driver.py [--served]

Default: imports infra/policy/pack/__main__.py as a module (so PolicyPack is not constructed and no server
starts), feeds its policies pulumi_policy argument objects with proxied props (as the analyzer passes them,
unknowns included), and prints {"policies": [...], "reports": {policy: [[message, urn], ...]}} as JSON.

--served: runs the pack directory as the CLI does (`python <pack dir>`, which serves the analyzer's gRPC API on
127.0.0.1 and prints its port), asks it for its policies and analyzes one resource over gRPC, prints
{"policies": {name: enforcement level}, "diagnostics": [[policy, level, message], ...]}, and stops it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pulumi_policy import (  # noqa: E402
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy  # noqa: E402

from tests.policy.builders import container, gpu_job, gpu_node_group, s3_bucket  # noqa: E402


def load_pack() -> Any:
    spec = importlib.util.spec_from_file_location("mlc_policy_pack", ROOT / "infra/policy/pack/__main__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def options(protect: bool = False) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def urn(raw: dict[str, Any]) -> str:
    return f"urn:pulumi:test::ml-cluster::{raw['type']}::{raw['name']}"


def served() -> None:
    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

    job = gpu_job()
    train = container(job, "train")
    train["securityContext"]["privileged"] = True  # breaks job-not-privileged
    properties = struct_pb2.Struct()
    properties.update(job["inputs"])
    server = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "infra/policy/pack")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().strip())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=20)
            request = analyzer_pb2.AnalyzeRequest(
                type=job["type"],
                properties=properties,
                urn=urn(job),
                name=job["name"],
                options=analyzer_pb2.AnalyzerResourceOptions(protect=False),
            )
            response = stub.Analyze(request, timeout=20)
    finally:
        server.terminate()
        server.wait(timeout=10)
    level = analyzer_pb2.EnforcementLevel.Name
    print(
        json.dumps(
            {
                "name": info.name,
                "policies": {policy.name: level(policy.enforcementLevel) for policy in info.policies},
                "diagnostics": [[d.policyName, level(d.enforcementLevel), d.message] for d in response.diagnostics],
            }
        )
    )


def main() -> None:
    if "--served" in sys.argv[1:]:
        served()
        return
    pack = load_pack()
    policies = {policy.name: policy for policy in pack.build_policies()}
    reports: dict[str, list[list[Any]]] = {name: [] for name in policies}

    job = gpu_job()
    train = container(job, "train")
    train["volumeMounts"] = [m for m in train["volumeMounts"] if m["mountPath"] != "/dev/shm"]  # breaks job-gpu-shm
    train["image"] = UNKNOWN_STRING_VALUE  # an output not known during preview must not break the adapter
    untainted = gpu_node_group(taints=[])
    resources = [job, untainted]
    for raw in resources:
        for name, policy in policies.items():
            if not isinstance(policy, ResourceValidationPolicy):
                continue
            args = ResourceValidationArgs(
                raw["type"],
                unknown_checking_proxy(raw["inputs"]),
                urn(raw),
                raw["name"],
                options(),
                None,
                {"protected": True},
            )
            policy.validate(args, lambda message, at, name=name: reports[name].append([message, at]))

    # A bucket whose public access block is missing; its SSE config and TLS policy point at it by dependency,
    # with the bucket id unknown (as in a real preview).
    bucket_raw, sse_raw, _, policy_raw = s3_bucket()
    bucket = PolicyResource(
        bucket_raw["type"],
        unknown_checking_proxy(bucket_raw["inputs"]),
        urn(bucket_raw),
        bucket_raw["name"],
        options(),
        None,
        None,
        [],
        {},
    )
    dependents = []
    for raw in (sse_raw, policy_raw):
        inputs = {**raw["inputs"], "bucket": UNKNOWN_STRING_VALUE}
        dependents.append(
            PolicyResource(
                raw["type"],
                unknown_checking_proxy(inputs),
                urn(raw),
                raw["name"],
                options(),
                None,
                None,
                [bucket],
                {"bucket": [bucket]},
            )
        )
    stack_args = StackValidationArgs([bucket, *dependents], {})
    for name, policy in policies.items():
        if not isinstance(policy, ResourceValidationPolicy):
            policy.validate(stack_args, lambda message, at, name=name: reports[name].append([message, at]))

    print(json.dumps({"policies": sorted(policies), "reports": reports}))


if __name__ == "__main__":
    main()
