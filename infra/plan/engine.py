"""The offline plan engine: the real __main__.py under the Pulumi SDK mock engine, data sources from fixtures.

Nothing here reaches AWS or Kubernetes. What the engine would receive is recorded straight from each
RegisterResource request (inputs with secrets still marked, parent, provider, and the resource options), so the
plan shows exactly what `pulumi up` would send, with secrets replaced by "[secret]".
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import io
import json
import re
import runpy
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from pulumi.runtime.mocks import Mocks

from infra.config import ConfigError, ConfigExit, parse_stack_config, read_stack_file
from infra.config.base import PROJECT
from infra.existing_cluster import ClusterAnswerError, found_from_get_cluster
from infra.plan.account import plan_account

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS_DIR = REPO_ROOT / "stacks"
FIXTURES_DIR = STACKS_DIR / "fixtures"
SECRET_MARK = "[secret]"
OFFLINE_SECRET = "offline-placeholder-secret"  # what the program sees for a secret it cannot decrypt offline

_SIG = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
_RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
_ASSET_SIGS = {"c44067f5952c0a294b673a41bacd8c17": "[asset]", "0def7320c3a5731c473e5ecbe6d01bc7": "[archive]"}
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class FixtureError(Exception):
    """A data-source question the offline fixtures cannot answer."""

    def __init__(self, fixture: str, why: str):
        self.fixture, self.why = fixture, why
        super().__init__(f"{fixture}: {why}")


PlanStopped = (ConfigError, FixtureError)  # what stops an offline plan before it has a document


def plan_error_lines(exc: ConfigError | FixtureError) -> list[str]:
    """What a CLI prints for a plan that stopped: one `error: <where>: <why>` line per problem."""
    return [f"error: {exc.fixture}: {exc.why}"] if isinstance(exc, FixtureError) else exc.lines()


class Fixtures:
    """Answers to data sources, from stacks/fixtures/*.json."""

    def __init__(self, directory: Path = FIXTURES_DIR):
        self.directory = directory
        self._cache: dict[str, Any] = {}

    def _load(self, name: str) -> Any:
        if name not in self._cache:
            path = self.directory / name
            try:
                self._cache[name] = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise FixtureError(self._where(name), f"unreadable fixture: {exc}") from None
        return self._cache[name]

    def _where(self, name: str) -> str:
        try:
            return str((self.directory / name).relative_to(REPO_ROOT))
        except ValueError:
            return str(self.directory / name)

    def lookup(self, name: str, key: str, what: str) -> Any:
        table = self._load(name)
        if key not in table:
            # A typo of a known key is the likelier story than a new type: say which one was meant, and only
            # otherwise how to add an entry.
            close = difflib.get_close_matches(key, [k for k in table if isinstance(k, str)], n=1, cutoff=0.8)
            hint = (f"did you mean {close[0]!r}?" if close
                    else "if it exists, add its answer to the fixture to plan it offline")
            raise FixtureError(self._where(name), f"no entry for {what} {key!r}: {hint}")
        return table[key]

    def answer(self, token: str, args: dict[str, Any], region: str | None) -> dict[str, Any]:
        if token == "aws:ec2/getInstanceType:getInstanceType":
            return self.lookup("instance_types.json", args["instanceType"], "instance type")
        if token == "aws:ec2/getSubnet:getSubnet":
            subnet_id = args.get("id") or ""
            return self.lookup("subnets.json", subnet_id, "subnet")
        if token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = self.lookup("availability_zones.json", region or "", "region")
            return {"names": zones, "id": region, "zoneIds": [f"{region}-az{i + 1}" for i in range(len(zones))]}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return self._load("caller_identity.json")
        if token == "aws:eks/getAddonVersion:getAddonVersion":
            key = f"{args.get('addonName')} {args.get('kubernetesVersion')}"
            version = self.lookup("addon_versions.json", key, "add-on default")
            return {"addonName": args.get("addonName"), "kubernetesVersion": args.get("kubernetesVersion"),
                    "mostRecent": bool(args.get("mostRecent")), "version": version, "id": args.get("addonName")}
        if token == "aws:eks/getCluster:getCluster":  # an existing cluster a stack lays itself onto
            name = args.get("name") or ""
            entry = self.lookup("clusters.json", name, "EKS cluster")
            try:  # checked here, before the SDK's typed result trips over a broken entry
                found_from_get_cluster(entry, asked=name)
            except ClusterAnswerError as exc:
                raise FixtureError(self._where("clusters.json"), str(exc)) from None
            return entry
        if token == "aws:index/getRegion:getRegion":
            return {"name": region, "region": region, "id": region}
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"}
        raise FixtureError(self._where(""), f"no offline answer for data source {token}; add a fixture for it")


@dataclass
class RecordedResource:
    type: str
    name: str
    urn: str
    parent_urn: str
    provider_ref: str
    inputs: dict[str, Any]
    options: dict[str, Any]


def _restore(value: Any) -> Any:
    """Engine wire values -> plan values: ints restored, secrets masked, unknowns None, references by URN."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [_restore(item) for item in value]
    if isinstance(value, dict):
        sig = value.get(_SIG)
        if sig == _SECRET_SIG:
            return _mask(value.get("value"))
        if sig == _RESOURCE_SIG:
            return value.get("urn")
        if sig in _ASSET_SIGS:
            return _ASSET_SIGS[sig]
        return {key: _restore(item) for key, item in value.items()}
    if value == _UNKNOWN:
        return None
    return value


def _mask(value: Any) -> Any:
    """A secret keeps its shape (so manifests stay schema-valid) but every leaf becomes "[secret]"."""
    if isinstance(value, dict):
        return {key: _mask(item) for key, item in value.items() if key != _SIG}
    if isinstance(value, list):
        return [_mask(item) for item in value]
    return SECRET_MARK


def _name_of(urn: str) -> str | None:
    return urn.split("::")[-1] if urn else None


def offline_id(type_token: str, name: str) -> str:
    """The physical id the offline engine gives a resource (AWS-shaped where the type has a known id prefix)."""
    digest = hashlib.sha256(f"{type_token}/{name}".encode()).hexdigest()[:17]
    prefixes = {"aws:ec2/vpc:Vpc": "vpc-", "aws:ec2/subnet:Subnet": "subnet-", "aws:ec2/securityGroup:SecurityGroup":
                "sg-", "aws:efs/fileSystem:FileSystem": "fs-", "aws:ec2/natGateway:NatGateway": "nat-",
                "aws:ec2/internetGateway:InternetGateway": "igw-", "aws:ec2/routeTable:RouteTable": "rtb-",
                "aws:ec2/eip:Eip": "eipalloc-", "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
                "aws:efs/mountTarget:MountTarget": "fsmt-", "aws:efs/accessPoint:AccessPoint": "fsap-",
                "aws:fsx/lustreFileSystem:LustreFileSystem": "fs-",
                "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "dra-"}
    prefix = prefixes.get(type_token)
    return f"{prefix}{digest}" if prefix else f"{name}-offline-id"


class OfflineMocks(Mocks):
    """pulumi.runtime.Mocks: resources echo their inputs plus the computed outputs the program reads."""

    def __init__(self, fixtures: Fixtures, region: str | None, account: str):
        self.fixtures, self.region, self.account = fixtures, region, account
        self.errors: list[FixtureError] = []

    def call(self, args: Any) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        try:
            answer = self.fixtures.answer(args.token, args.args, self.region)
            if args.token == CALLER_IDENTITY:  # the stack's pinned account, if any: the fixtures answer the rest
                answer = {**answer, "accountId": self.account, "id": self.account,
                          "arn": re.sub(r"::\d{12}:", f"::{self.account}:", str(answer.get("arn", "")))}
            return answer, []  # no check failures
        except FixtureError as exc:
            self.errors.append(exc)
            raise

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        token, name, inputs = args.typ, args.name, dict(args.inputs)
        resource_id = offline_id(token, name)
        state = dict(inputs)
        if token.startswith("aws:"):
            physical = inputs.get("name") or inputs.get("bucket") or name
            service, _, kind = token.removeprefix("aws:").partition("/")
            kind = kind.split(":")[0].lower()
            state.setdefault("name", physical)
            state.setdefault("arn", f"arn:aws:{service}:{self.region}:{self.account}:{kind}/{physical}")
            state.setdefault("tagsAll", inputs.get("tags") or {})
            state.update(self._computed(token, physical, resource_id, inputs))
        return resource_id, state

    def _computed(self, token: str, physical: str, resource_id: str, inputs: dict[str, Any]) -> dict[str, Any]:
        region, account = self.region, self.account
        if token == "aws:eks/cluster:Cluster":
            vpc_config = dict(inputs.get("vpcConfig") or {})
            vpc_config["clusterSecurityGroupId"] = offline_id("aws:ec2/securityGroup:SecurityGroup", physical)
            return {
                "endpoint": f"https://{hashlib.sha256(physical.encode()).hexdigest()[:32].upper()}"
                            f".gr7.{region}.eks.amazonaws.com",
                "certificateAuthority": {"data": "T0ZGTElORS1DQQ=="},
                "vpcConfig": vpc_config,
                "arn": f"arn:aws:eks:{region}:{account}:cluster/{physical}",
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/OFFLINE"}]}],
                "status": "ACTIVE",
            }
        if token == "aws:eks/nodeGroup:NodeGroup":
            return {"resources": [{"autoscalingGroups": [{"name": f"eks-{physical}-offline-asg"}]}],
                    "status": "ACTIVE"}
        if token == "aws:iam/role:Role":
            return {"arn": f"arn:aws:iam::{account}:role/{physical}", "uniqueId": f"AROA{resource_id[:16].upper()}"}
        if token == "aws:iam/policy:Policy":
            return {"arn": f"arn:aws:iam::{account}:policy/{physical}"}
        if token == "aws:s3/bucket:Bucket":
            return {"bucket": physical, "arn": f"arn:aws:s3:::{physical}",
                    "bucketRegionalDomainName": f"{physical}.s3.{region}.amazonaws.com", "region": region}
        if token == "aws:efs/fileSystem:FileSystem":
            return {"arn": f"arn:aws:elasticfilesystem:{region}:{account}:file-system/{resource_id}",
                    "dnsName": f"{resource_id}.efs.{region}.amazonaws.com"}
        if token == "aws:fsx/lustreFileSystem:LustreFileSystem":  # AWS's mount name: 8 characters
            return {"arn": f"arn:aws:fsx:{region}:{account}:file-system/{resource_id}",
                    "dnsName": f"{resource_id}.fsx.{region}.amazonaws.com", "mountName": resource_id[-8:]}
        if token == "aws:ec2/launchTemplate:LaunchTemplate":
            return {"latestVersion": 1, "defaultVersion": 1}
        if token == "aws:ecr/repository:Repository":
            return {"repositoryUrl": f"{account}.dkr.ecr.{region}.amazonaws.com/{physical}",
                    "registryId": account}
        if token == "aws:kms/key:Key":
            return {"arn": f"arn:aws:kms:{region}:{account}:key/{resource_id}", "keyId": resource_id}
        return {}


def _make_monitor(mocks: OfflineMocks, recorded: list[RecordedResource]) -> Any:
    from pulumi.runtime.mocks import MockMonitor

    class RecordingMonitor(MockMonitor):
        def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            if request.type != "pulumi:pulumi:Stack":
                raw = json_format.MessageToDict(request.object, preserving_proto_field_name=True)
                implicit = {urn for deps in request.propertyDependencies.values() for urn in deps.urns}
                recorded.append(RecordedResource(
                    type=request.type,
                    name=request.name,
                    urn=self.make_urn(request.parent, request.type, request.name),
                    parent_urn=request.parent,
                    provider_ref=request.provider,
                    inputs=_restore(raw),
                    options={
                        "protect": bool(request.protect),
                        "retainOnDelete": bool(request.retainOnDelete),
                        "deleteBeforeReplace": bool(request.deleteBeforeReplace),
                        "dependsOn": sorted(urn for urn in request.dependencies if urn not in implicit),
                        "ignoreChanges": list(request.ignoreChanges),
                    },
                ))
            return super().RegisterResource(request)

        def Invoke(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
            # The SDK runs each invoke on a worker thread and gives that thread an event loop it never closes;
            # closed here, so interpreter exit does not garbage-collect it after its self-pipe socket (a
            # "ValueError: Invalid file descriptor: -1" traceback on stderr).
            try:
                return super().Invoke(request)
            finally:
                if threading.current_thread() is not threading.main_thread():
                    loop = asyncio.get_event_loop_policy().get_event_loop()
                    if not loop.is_running():
                        asyncio.set_event_loop(None)
                        loop.close()

    return RecordingMonitor(mocks)


@dataclass
class StackFile:
    stack: str
    path: Path
    values: dict[str, Any]
    secure_keys: list[str] = field(default_factory=list)


def stack_file_path(stack: str, config_path: str | Path | None = None) -> Path:
    return Path(config_path) if config_path else STACKS_DIR / f"Pulumi.{stack}.yaml"


def load_stack_file(stack: str, config_path: str | Path | None = None) -> StackFile:
    from infra.config.names import check_stack_name

    problems = check_stack_name(stack)  # `../x` would name a file outside stacks/ and a bucket S3 refuses
    if problems:
        raise ConfigError(problems)
    path = stack_file_path(stack, config_path)
    named = re.fullmatch(r"Pulumi\.(.+)\.ya?ml", path.name)
    if named and named.group(1) != stack:
        # The stack name picks the resource names, the fixtures and the Pulumi stack: another stack's file under
        # this name would plan one stack with another's settings.
        raise ConfigError([("--config", f"{path} is stack {named.group(1)}'s file, but --stack is {stack}: name the "
                                        f"same stack in both (or copy the file to Pulumi.{stack}.yaml)")])
    values, secure = read_stack_file(path)
    return StackFile(stack=stack, path=path, values=values, secure_keys=secure)


def offline_config(stack_file: StackFile) -> tuple[dict[str, str], list[str]]:
    """Stack-file values as the Pulumi CLI would hand them to the program; secrets become placeholders."""
    config: dict[str, str] = {}
    for key, value in stack_file.values.items():
        if key in stack_file.secure_keys:
            config[key] = OFFLINE_SECRET
        elif isinstance(value, str):
            config[key] = value
        else:
            config[key] = json.dumps(value)
    return config, list(stack_file.secure_keys)


def validate_stack_file(stack_file: StackFile) -> None:
    """Raise ConfigError (every problem, one line each) if the stack file cannot be deployed."""
    config, secret_keys = offline_config(stack_file)
    from infra.config.schema import decode_config_value

    parse_stack_config({key: decode_config_value(value) for key, value in config.items()}, secret_keys)


CALLER_IDENTITY = "aws:index/getCallerIdentity:getCallerIdentity"


def offline_account(stack_file: StackFile, fixtures: Fixtures | None = None) -> tuple[str, str | None]:
    """The account the offline plan runs as, and a note when that is not the user's (infra.plan.account)."""
    fixture = str((fixtures or Fixtures()).answer(CALLER_IDENTITY, {}, None)["accountId"])
    return plan_account(stack_file.values, fixture)


def placeholders_left(stack_file: StackFile) -> list[tuple[str, str]]:
    """What a real `pulumi preview`/`up` of this stack file would refuse as placeholders (the offline plan accepts
    them: they are its fixtures' world), so the plan can say so."""
    from infra.config.placeholders import placeholder_problems
    from infra.config.schema import decode_config_value

    values = {key: decode_config_value(value) for key, value in stack_file.values.items()}
    return placeholder_problems(values, deploying=True, secret_keys=stack_file.secure_keys)


def plan_stack(stack: str, config_path: str | Path | None = None, fixtures: Fixtures | None = None,
               offline: bool = True) -> dict[str, Any]:
    """Run the real program for `stack` offline; return the plan document (see scripts/plan.py --json).

    `offline=False` runs the program as a real `pulumi up` would (still under the mock engine): the checks only a
    deploying run makes (placeholders, the pinned account) apply.

    Raises ConfigError for an invalid stack file (before any resource is registered) and FixtureError for a data
    source the fixtures cannot answer.
    """
    import pulumi
    from pulumi.runtime import settings as pulumi_settings
    from pulumi.runtime.config import set_all_config
    from pulumi.runtime.mocks import set_mocks
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    stack_file = load_stack_file(stack, config_path)
    # The program validates its config itself (and, on a schema error, still checks the pools it can, so one
    # error does not hide another): a bad stack file ends in the program's ConfigError below.
    config, secret_keys = offline_config(stack_file)
    region = stack_file.values.get("aws:region")
    fixtures = fixtures or Fixtures()
    # Offline, the plan runs as the account the stack pins; a deploying run (offline=False) as its credentials' one,
    # which the fixture stands for, so the pinned-account check can refuse a mismatch.
    account = offline_account(stack_file, fixtures)[0] if offline else str(
        fixtures.answer(CALLER_IDENTITY, {}, None)["accountId"])
    mocks = OfflineMocks(fixtures, region, account)
    recorded: list[RecordedResource] = []

    # The engine's own event loop (the mocks' root resource is created on it too), closed when the run ends: a loop
    # left open is garbage-collected at interpreter exit after its self-pipe socket, which prints a
    # "ValueError: Invalid file descriptor: -1" traceback.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        set_all_config(config, secret_keys)
        pulumi_settings.ROOT.set(None)
        set_mocks(mocks, project=PROJECT, stack=stack, preview=True, monitor=_make_monitor(mocks, recorded))
        root = pulumi_settings.get_root_resource()
        main = str(REPO_ROOT / "__main__.py")
        program_stderr = io.StringIO()  # the program's own messages, replayed unless they repeat a ConfigError
        stopped: list[ConfigError] = []
        try:
            with contextlib.redirect_stderr(program_stderr):
                _sync_await(run_pulumi_func(lambda: _run_program(main, stopped, offline)))
        except Exception:
            if mocks.errors and not stopped:
                raise mocks.errors[0] from None
            if not stopped:
                raise
        if stopped:  # the program rejected its config; say which fixture was missing too, if that was the cause
            extra = [(error.fixture, error.why) for error in mocks.errors]
            raise ConfigError([*stopped[0].problems, *extra])
        sys.stderr.write(program_stderr.getvalue().replace(OFFLINE_SECRET, SECRET_MARK))
        if mocks.errors:
            raise mocks.errors[0]
        shared = _shared_names(recorded)
        if shared:  # a name the config-layer check (infra.config.names) missed: still never a plan that exits 0
            raise ConfigError([("stack", why) for why in shared])
        outputs = _resolve_outputs(root, pulumi) if root is not None else {}
        return _plan_document(stack, recorded, outputs)
    finally:
        # Tasks still pending (cancelled above, or left by a failed run) finish here, not as "Task was destroyed but
        # it is pending" noise when the loop is collected.
        leftover = asyncio.all_tasks(loop)
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        asyncio.set_event_loop(None)
        loop.close()


def _shared_names(recorded: list[RecordedResource]) -> list[str]:
    """Names two registered resources share: URNs (Pulumi refuses them), Kubernetes kind/namespace/name, S3 buckets
    behind one provider. The engine-side twin of infra.config.names.check_derived_names."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for item in recorded:
        keys: list[tuple[str, ...]] = [("urn", item.urn)]
        if item.type.startswith("kubernetes:") and not item.type.startswith(("kubernetes:helm.sh/", "pulumi:")):
            metadata = item.inputs.get("metadata") or {}
            kind = item.inputs.get("kind") or item.type.rsplit(":", 1)[-1]
            if metadata.get("name"):
                keys.append(("kubernetes", str(kind), str(metadata.get("namespace") or ""), str(metadata["name"])))
        if item.type == "aws:s3/bucket:Bucket" and item.inputs.get("bucket"):
            keys.append(("bucket", item.provider_ref.split("::")[-1], str(item.inputs["bucket"])))
        for key in keys:
            seen.setdefault(key, []).append(item.name)
    problems = []
    for key, owners in seen.items():
        if len(owners) > 1:
            what = {"urn": "URN", "kubernetes": "Kubernetes object", "bucket": "bucket name"}[key[0]]
            problems.append(f"{what} {'/'.join(part for part in key[1:] if part)} is used by "
                            f"{', '.join(sorted(owners))}: two resources cannot share one name")
    return problems


def _run_program(main: str, stopped: list[ConfigError], offline: bool) -> None:
    """Run __main__.py; a ConfigExit (exit status 2 for a bad config) is kept rather than sent through asyncio.

    The program learns that it runs offline from its own globals (OFFLINE_PLAN), set only here: nothing a stack
    file or the environment holds can make a real `pulumi up` skip its deploy-time checks."""
    try:
        runpy.run_path(main, init_globals={"OFFLINE_PLAN": offline}, run_name="__pulumi_main__")
    except ConfigExit as exc:
        stopped.append(exc.error)
        _drop_pending_engine_work()


def _drop_pending_engine_work() -> None:
    """Cancel the Outputs and RPCs a program left behind when it stopped on its config. Nothing they would produce is
    used, and the engine waits for every one of them before it returns (pulumi/runtime/stack.py wait_for_rpcs): one
    that waits for a value the stopped program never provides would keep the plan waiting forever."""
    from pulumi.runtime.settings import SETTINGS

    with SETTINGS.lock:
        pending = list(SETTINGS.outputs)
        SETTINGS.outputs.clear()
    rpcs = SETTINGS.rpc_manager.rpcs
    pending += [rpc for rpc in rpcs if isinstance(rpc, asyncio.Future)]
    rpcs.clear()
    for task in pending:
        task.cancel()


def _resolve_outputs(root: Any, pulumi: Any) -> dict[str, Any]:
    from pulumi.runtime.sync_await import _sync_await

    resolved: dict[str, Any] = {}
    for key, value in getattr(root, "outputs", {}).items():
        output = pulumi.Output.from_input(value)
        is_secret = _sync_await(output.is_secret())
        resolved[key] = SECRET_MARK if is_secret else _restore(_sync_await(output.future()))
    return resolved


# Keys that lead a mapping, in this order (the conventional Kubernetes manifest order); the rest follow sorted.
_LEADING_KEYS = ("apiVersion", "kind", "metadata", "name", "namespace", "spec")


def canonical(value: Any) -> Any:
    """The same value with every mapping's keys in one fixed order, so a plan's bytes never depend on the order in
    which the engine (asyncio, protobuf maps) happened to deliver resources and properties."""
    if isinstance(value, dict):
        def order(key: Any) -> tuple[int, str]:
            text = str(key)
            return (_LEADING_KEYS.index(text) if text in _LEADING_KEYS else len(_LEADING_KEYS), text)

        return {key: canonical(value[key]) for key in sorted(value, key=order)}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    return value


def _plan_document(stack: str, recorded: list[RecordedResource], outputs: dict[str, Any]) -> dict[str, Any]:
    names = {item.urn: item.name for item in recorded}
    resources = []
    # Registration order varies from run to run (resources are registered from asyncio callbacks); the URN
    # (parent types, type, name) is unique and stable, so resources are listed in URN order.
    for item in sorted(recorded, key=lambda item: item.urn):
        provider_urn = item.provider_ref.split("::")
        provider = "::".join(provider_urn[:-1]) if len(provider_urn) > 1 else ""
        resources.append({
            "type": item.type,
            "name": item.name,
            "parent": names.get(item.parent_urn) or None,
            "provider": _name_of(provider) if provider else None,
            "inputs": canonical(item.inputs),
            "options": {**item.options,
                        "dependsOn": sorted(names.get(urn, urn) for urn in item.options["dependsOn"])},
        })
    return {"project": PROJECT, "stack": stack, "resources": resources, "outputs": canonical(outputs)}


def kubernetes_objects(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every Kubernetes object of a plan (its inputs are the complete manifest)."""
    for resource in plan["resources"]:
        token = resource["type"]
        # Helm releases and YAML components (a ConfigFile applies the objects of a file) are not objects.
        if token.startswith("kubernetes:") and not token.startswith(("kubernetes:helm.sh/", "kubernetes:yaml/")):
            yield resource


# API groups whose CRDs a chart renders as templates (Kueue's): scripts/render_charts.py validates their objects.
CHART_TEMPLATE_GROUPS = frozenset({"kueue.x-k8s.io"})


def validate_kubernetes_objects(
    plan: dict[str, Any], kubernetes_version: str,
    custom: Callable[[dict[str, Any]], list[str] | None] | None = None,
) -> list[str]:
    """kubernetes-validate (strict) on every object; returns one problem line per invalid object.

    `custom` validates the kinds a CRD defines (it returns None for a kind it does not know): kubernetes-validate
    only has the built-in API's schemas."""
    import kubernetes_validate

    from infra.plan.kubeschema import validate

    problems: list[str] = []
    for resource in kubernetes_objects(plan):
        manifest = resource["inputs"]
        found = custom(manifest) if custom is not None else None
        if found is not None:
            problems.extend(f"{resource['type']} {resource['name']}: {problem}" for problem in found)
            continue
        if str(manifest.get("apiVersion") or "").split("/")[0] in CHART_TEMPLATE_GROUPS:
            continue  # defined by a chart's rendered CRDs: scripts/render_charts.py validates them against those
        try:
            validate(manifest, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path) or "(root)"
            problems.append(f"{resource['type']} {resource['name']}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{resource['type']} {resource['name']}: no schema: {exc}")
    return problems


__all__ = [
    "ConfigError",
    "FixtureError",
    "kubernetes_objects",
    "load_stack_file",
    "offline_account",
    "placeholders_left",
    "plan_stack",
    "validate_kubernetes_objects",
    "validate_stack_file",
]
