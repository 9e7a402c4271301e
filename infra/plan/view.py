"""Views of a plan document: the readable summary, the diff against an earlier plan, and manifest files."""

from __future__ import annotations

import errno
import json
import os
import re
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

from infra.config.names import check_stack_name
from infra.config.support import support_notes
from infra.plan.engine import canonical, kubernetes_objects
from infra.plan.goodput import goodput_lines, job_predictions
from workloads.jobspec.launcher import launcher_notes
from workloads.manifest_yaml import dump_manifest
from workloads.safeio import StateFileError, read_regular

Key = tuple[str, str]


def summary(plan: dict[str, Any]) -> str:
    """The readable plan, each Job's predicted goodput (from its `jobGoodput` output) included."""
    resources = plan["resources"]
    lines = [f"{plan['project']} / {plan['stack']}: {len(resources)} resources", "", "  count  type"]
    for token, count in sorted(Counter(r["type"] for r in resources).items()):
        lines.append(f"  {count:5d}  {token}")
    lines += ["", "resources:"]
    for resource in resources:
        options = resource["options"]
        flags = [flag for flag, on in (("protect", options["protect"]), ("retain", options["retainOnDelete"]),
                                       ("delete-before-replace", options["deleteBeforeReplace"])) if on]
        parent = f"  (in {resource['parent']})" if resource["parent"] else ""
        marks = f"  [{', '.join(flags)}]" if flags else ""
        lines.append(f"  {resource['type']}  {resource['name']}{parent}{marks}")
    lines += team_summary(plan)
    lines += coldstart_lines(plan)
    lines += goodput_lines(job_predictions(plan))
    if plan.get("outputs"):
        lines += ["", "outputs:"]
        lines += [f"  {key}: {value}" for key, value in plan["outputs"].items()]
    return "\n".join(lines) + "\n"


def coldstart_lines(plan: dict[str, Any]) -> list[str]:
    """The cold-start budget per GPU pool (the `coldStart` output, infra/nodes/coldstart.py), in minutes, against
    Kueue's gang timeout. Empty when the stack has no EKS GPU pool."""
    cold = (plan.get("outputs") or {}).get("coldStart")
    if not cold:
        return []
    timeout = cold.get("timeout")
    limit = None
    if timeout:
        limit = int(timeout[:-1]) * {"s": 1 / 60, "m": 1, "h": 60}[timeout[-1]]
    lines = ["", f"cold start (kueue.waitForPodsReady.timeout {timeout or '-, no Kueue'}; minutes):",
             "  pool  type  boot  burn-in  image-pull  first-shard  total  timed  verdict"]
    for row in cold["pools"]:
        pull = (f"{row['pullMinutes']:.1f} ({row['pullGB']:.1f} GB @ {row['pullMBps']:.1f} MB/s, "
                f"{'parallel' if row['parallelPull'] else 'serial'})")
        verdict = "-" if limit is None else ("ok" if row["timedMinutes"] <= limit else "BELOW BUDGET")
        lines.append(f"  {row['pool']}  {row['instanceType']}  {row['bootMinutes']:.1f}  {row['burnInMinutes']:.1f}  "
                     f"{pull}  {row['firstShardMinutes']:.1f}  {row['totalMinutes']:.1f}  {row['timedMinutes']:.1f}  "
                     f"{verdict}")
    lines.append("  (timed: what the timeout covers; on a topology flavor Kueue admits after the nodes are Ready, "
                 "so boot and burn-in are not timed. Boot and burn-in are model figures: docs/operations.md)")
    return lines


def team_summary(plan: dict[str, Any]) -> list[str]:
    """Per tenant team (a namespace labelled `<prefix>/team`): its quota, role, EFS directory, people and the
    Kubernetes objects in its namespace. Empty when the stack has no tenant teams."""
    teams: dict[str, str] = {}  # namespace -> team
    for resource in plan["resources"]:
        metadata = resource["inputs"].get("metadata") or {}
        if resource["type"] == "kubernetes:core/v1:Namespace":
            team = next((v for k, v in (metadata.get("labels") or {}).items() if k.endswith("/team")), None)
            if team:
                teams[str(metadata.get("name"))] = str(team)
    if not teams:
        return []
    lines = ["", "teams:"]
    for namespace, team in sorted(teams.items(), key=lambda item: item[1]):
        kinds: Counter[str] = Counter()
        gpus, claims, roles, paths, people = "-", [], [], [], []
        for resource in plan["resources"]:
            inputs = resource["inputs"]
            metadata = inputs.get("metadata") or {}
            if resource["type"].startswith("kubernetes:") and metadata.get("namespace") == namespace:
                kinds[resource["type"].rsplit(":", 1)[1]] += 1
                if resource["type"] == "kubernetes:core/v1:ResourceQuota":
                    gpus = str(((inputs.get("spec") or {}).get("hard") or {}).get("requests.nvidia.com/gpu", "-"))
                if resource["type"] == "kubernetes:core/v1:PersistentVolumeClaim":
                    claims.append(str(metadata.get("name")))
                if resource["type"] == "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding":
                    role = (inputs.get("roleRef") or {}).get("name")
                    people += [f"group {subject.get('name')} ({role})" for subject in inputs.get("subjects") or []
                               if subject.get("kind") == "Group"]
            elif (inputs.get("tags") or {}).get("ml-cluster-team") == team:
                if resource["type"] == "aws:iam/role:Role":
                    roles.append(str(inputs.get("name") or resource["name"]))
                elif resource["type"] == "aws:efs/accessPoint:AccessPoint":
                    paths.append(str((inputs.get("rootDirectory") or {}).get("path")))
            elif resource["type"] == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation" and namespace in (
                    (inputs.get("accessScope") or {}).get("namespaces") or []):
                people.append(f"{inputs.get('principalArn')} ({str(inputs.get('policyArn')).rsplit('/', 1)[-1]})")
        lines.append(f"  {team} (namespace {namespace}): GPU quota {gpus}; role {', '.join(roles) or '-'}; "
                     f"EFS {', '.join(paths) or '-'} (claims: {', '.join(claims) or '-'})")
        lines += [f"    access: {who}" for who in sorted(people)]
        lines.append("    objects: " + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())))
    return lines


# Input paths each provider treats as force-new (a change replaces the resource instead of updating it), from the
# providers' schemas (pulumi-aws / terraform-provider-aws ForceNew, Kubernetes immutable fields). A path matches a
# changed leaf when it is the leaf's path or one of its prefixes.
_K8S_IDENTITY = ("metadata.name", "metadata.namespace", "apiVersion", "kind")
FORCE_NEW: dict[str, tuple[str, ...]] = {
    "aws:s3/bucket:Bucket": ("bucket", "bucketPrefix"),
    "aws:efs/fileSystem:FileSystem": ("performanceMode", "encrypted", "kmsKeyId", "creationToken",
                                      "availabilityZoneName"),
    "aws:fsx/lustreFileSystem:LustreFileSystem": ("deploymentType", "storageType", "subnetIds", "kmsKeyId",
                                                  "fileSystemTypeVersion", "securityGroupIds"),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": ("fileSystemId", "fileSystemPath",
                                                                    "dataRepositoryPath"),
    "aws:efs/mountTarget:MountTarget": ("fileSystemId", "subnetId", "ipAddress"),
    "aws:efs/accessPoint:AccessPoint": ("fileSystemId", "posixUser", "rootDirectory"),
    "aws:eks/cluster:Cluster": ("name", "roleArn", "kubernetesNetworkConfig", "outpostConfig"),
    "aws:eks/nodeGroup:NodeGroup": ("clusterName", "nodeGroupName", "nodeGroupNamePrefix", "nodeRoleArn",
                                    "subnetIds", "instanceTypes", "capacityType", "amiType", "diskSize",
                                    "remoteAccess"),
    "aws:eks/addon:Addon": ("addonName", "clusterName"),
    "aws:eks/accessEntry:AccessEntry": ("clusterName", "principalArn"),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ("clusterName", "namespace", "serviceAccount"),
    "aws:iam/role:Role": ("name", "namePrefix", "path"),
    "aws:iam/rolePolicy:RolePolicy": ("name", "namePrefix", "role"),
    "aws:cloudwatch/logGroup:LogGroup": ("name", "namePrefix"),
    "aws:kms/alias:Alias": ("name", "namePrefix"),
    "aws:ec2/vpc:Vpc": ("cidrBlock", "instanceTenancy"),
    "aws:ec2/subnet:Subnet": ("vpcId", "cidrBlock", "availabilityZone", "availabilityZoneId"),
    "aws:ec2/securityGroup:SecurityGroup": ("name", "namePrefix", "description", "vpcId"),
    "aws:ec2/natGateway:NatGateway": ("allocationId", "subnetId", "connectivityType"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", "namePrefix"),
    "kubernetes:batch/v1:Job": _K8S_IDENTITY + ("spec.template", "spec.selector", "spec.completionMode",
                                                "spec.completions"),
    "kubernetes:core/v1:PersistentVolumeClaim": _K8S_IDENTITY + ("spec.accessModes", "spec.storageClassName",
                                                                 "spec.volumeName", "spec.selector",
                                                                 "spec.volumeMode", "spec.dataSource"),
    "kubernetes:core/v1:PersistentVolume": _K8S_IDENTITY + ("spec.csi", "spec.nfs", "spec.volumeMode"),
    "kubernetes:storage.k8s.io/v1:StorageClass": _K8S_IDENTITY + ("provisioner", "parameters", "reclaimPolicy",
                                                                  "volumeBindingMode", "mountOptions"),
    "kubernetes:core/v1:Service": _K8S_IDENTITY + ("spec.clusterIP", "spec.clusterIPs"),
    "kubernetes:core/v1:Secret": _K8S_IDENTITY + ("type",),
    "kubernetes:apps/v1:DaemonSet": _K8S_IDENTITY + ("spec.selector",),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": _K8S_IDENTITY + ("roleRef",),
}
_MAX_VALUE = 160  # characters of a value shown in the text diff


def forces_replacement(token: str, path: str) -> bool:
    """Whether changing input `path` ("inputs.spec.template.spec...") of a `token` resource replaces it."""
    if path in ("parent", "provider"):
        return True  # another parent changes the URN; another provider is another cloud account or cluster
    if not path.startswith("inputs."):
        return False  # resource options change Pulumi's state only
    field = path.removeprefix("inputs.")
    prefixes = FORCE_NEW.get(token, _K8S_IDENTITY if token.startswith("kubernetes:") else ())
    return any(field == prefix or field.startswith((f"{prefix}.", f"{prefix}[")) for prefix in prefixes)


def _json_document(value: Any) -> Any:
    """A string holding a JSON object or list (IAM policies) is compared as the document it holds."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return None


def _changed_leaves(old: Any, new: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(path, old, new) for every changed leaf; a key only on one side is a leaf with None on the other."""
    if isinstance(old, dict) and isinstance(new, dict):
        leaves: list[tuple[str, Any, Any]] = []
        for key in sorted(set(old) | set(new), key=str):
            text = str(key)
            child = (f"{path}[{json.dumps(text)}]" if "." in text or " " in text
                     else f"{path}.{text}" if path else text)
            leaves.extend(_changed_leaves(old.get(key), new.get(key), child) if key in old and key in new
                          else [(child, old.get(key), new.get(key))])
        return leaves
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [leaf for i, (a, b) in enumerate(zip(old, new, strict=True))
                for leaf in _changed_leaves(a, b, f"{path}[{i}]")]
    if old != new:
        old_doc, new_doc = _json_document(old), _json_document(new)
        if old_doc is not None and new_doc is not None:
            return _changed_leaves(old_doc, new_doc, path)
        return [(path, old, new)]
    return []


def _changed_paths(old: Any, new: Any, path: str) -> list[str]:
    return [leaf for leaf, _, _ in _changed_leaves(old, new, path)]


PLAN_MAX_BYTES = 256 << 20  # the committed stacks' plans are under 1 MiB


class PlanDocumentError(ValueError):
    """An earlier plan document (`--diff OLD.json`) that cannot be read or is not a plan of this stack."""


def load_plan_document(path: Path, stack: str | None = None) -> dict[str, Any]:
    """The `scripts/plan.py --json` document at `path`, checked to be a plan of `stack` (of any stack when None)
    whose every resource has the shape diff(), the cost estimate and the chart renderer read (type and name
    strings, inputs and options mappings)."""
    try:
        # The project's hostile-file reader: a regular file (a FIFO blocked forever, /dev/zero ran out of memory),
        # at most PLAN_MAX_BYTES, a link the user named followed.
        content, _ = read_regular(path, PLAN_MAX_BYTES, follow=True)
        if content is None:
            raise PlanDocumentError("does not exist")
        document = json.loads(content.decode("utf-8"))
    except StateFileError as exc:
        raise PlanDocumentError(exc.why) from None
    except OSError as exc:
        raise PlanDocumentError(exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise PlanDocumentError(f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise PlanDocumentError("is nested too deeply to be a plan document") from None
    except ValueError as exc:
        raise PlanDocumentError(f"is not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("resources"), list):
        raise PlanDocumentError("not a plan document (no resources list)")
    if "stack" in document:
        named = document["stack"]
        for _, why in check_stack_name(named) if isinstance(named, str) else [("", "stack: not a string")]:
            raise PlanDocumentError(why)
        if stack is not None and named != stack:
            raise PlanDocumentError(f"is a plan of stack {named}, not {stack}")
    if not isinstance(document.get("outputs", {}), dict):
        raise PlanDocumentError("outputs: not a mapping")
    for index, resource in enumerate(document["resources"]):
        if not (isinstance(resource, dict) and isinstance(resource.get("type"), str)
                and isinstance(resource.get("name"), str)):
            raise PlanDocumentError(f"resources[{index}]: not a resource (a mapping with type and name)")
        for part in ("inputs", "options"):
            if not isinstance(resource.setdefault(part, {}), dict):
                raise PlanDocumentError(f"resources[{index}].{part}: not a mapping")
    return document


def diff(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> dict[str, Any]:
    """Resources added, removed and changed, keyed by (type, name).

    A changed resource lists every changed leaf with its old and new value (secrets stay "[secret]", as in the
    plan), marks the leaves that force a replacement, and is `replace` when any does; `protected` says the
    resource is protected (a replacement or removal of it fails until it is unprotected, and loses data if done).
    """
    old = {(r["type"], r["name"]): r for r in old_plan["resources"]}
    new = {(r["type"], r["name"]): r for r in new_plan["resources"]}
    changed = []
    for key in sorted(old.keys() & new.keys()):
        before, after = old[key], new[key]
        leaves = [leaf for part in ("inputs", "options", "parent", "provider")
                  for leaf in _changed_leaves(before.get(part), after.get(part), part)]
        if not leaves:
            continue
        changes = [{"path": path, "old": was, "new": now, "replace": forces_replacement(key[0], path)}
                   for path, was, now in leaves]
        replace = any(change["replace"] for change in changes)
        changed.append({"type": key[0], "name": key[1], "op": "replace" if replace else "update",
                        "protected": bool(before["options"].get("protect") or after["options"].get("protect")),
                        "paths": [change["path"] for change in changes], "changes": changes})

    def listed(keys: set[Key], plan: dict[Key, Any]) -> list[dict[str, Any]]:
        return [{"type": t, "name": n, **({"protected": True} if plan[(t, n)]["options"].get("protect") else {})}
                for t, n in sorted(keys)]

    return {
        "stack": new_plan["stack"],
        "added": listed(new.keys() - old.keys(), new),
        "removed": listed(old.keys() - new.keys(), old),
        "changed": changed,
    }


_MINOR = re.compile(r"^1\.(\d{1,3})$")
EKS_CLUSTER, EKS_NODE_GROUP = "aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup"
VERSION_KEY = "ml-cluster:cluster.kubernetesVersion"


def _minor(value: Any) -> int | None:
    match = _MINOR.match(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def plan_support_notes(plan: dict[str, Any], today: date) -> list[tuple[str, str]]:
    """The support calendar's notes on the plan's Kubernetes minor (infra.config.support.support_notes)."""
    outputs = plan.get("outputs")
    outputs = outputs if isinstance(outputs, dict) else {}
    version, platform = outputs.get("kubernetesVersion"), outputs.get("platform")
    if not isinstance(version, str) or _minor(version) is None or not isinstance(platform, str):
        return []
    policies = [r["inputs"].get("upgradePolicy") for r in plan["resources"] if r["type"] == EKS_CLUSTER]
    support_type = policies[0].get("supportType") if policies and isinstance(policies[0], dict) else None
    policy = "standard" if not policies or support_type == "STANDARD" else "extended"  # EKS's default: EXTENDED
    return [(level, text) for level, text in support_notes(version, platform, policy, today)]


def plan_job_notes(plan: dict[str, Any]) -> list[str]:
    """A note for each Job the plan runs outside the launcher (a spec's `launcher: none`): what it loses."""
    outputs = plan.get("outputs") if isinstance(plan.get("outputs"), dict) else {}
    prefix = (outputs.get("jobFacts") or {}).get("label_prefix") if isinstance(outputs, dict) else None
    if not isinstance(prefix, str):
        return []
    return launcher_notes([r["inputs"] for r in plan["resources"]
                           if r["type"].startswith("kubernetes:") and isinstance(r.get("inputs"), dict)], prefix)


def upgrade_problems(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> list[tuple[str, str]]:
    """What EKS (and kubeadm) would refuse in going from `old_plan` to `new_plan`: a control plane that moves more
    than one minor, or down; a node group newer than its control plane."""
    problems: list[tuple[str, str]] = []

    def control_plane(plan: dict[str, Any]) -> tuple[str, int] | None:
        version = (plan.get("outputs") or {}).get("kubernetesVersion") if isinstance(plan.get("outputs"), dict) \
            else None
        for resource in plan["resources"]:
            if resource["type"] == EKS_CLUSTER and _minor(resource["inputs"].get("version")) is not None:
                version = resource["inputs"]["version"]
        minor = _minor(version)
        return (str(version), minor) if minor is not None else None

    was, now = control_plane(old_plan), control_plane(new_plan)
    if was is not None and now is not None:
        if now[1] > was[1] + 1:
            steps = ", then ".join(f"1.{m}" for m in range(was[1] + 1, now[1] + 1))
            problems.append((VERSION_KEY, f"{was[0]} -> {now[0]} skips a minor: the control plane moves one minor "
                                          f"at a time; deploy {steps} (docs/operations.md, upgrades)"))
        elif now[1] < was[1]:
            problems.append((VERSION_KEY, f"{was[0]} -> {now[0]}: a control plane cannot be downgraded"))
    if now is not None:
        for resource in new_plan["resources"]:
            minor = _minor(resource["inputs"].get("version")) if resource["type"] == EKS_NODE_GROUP else None
            if minor is not None and minor > now[1]:
                problems.append((resource["name"], f"node group at {resource['inputs']['version']} is ahead of its "
                                                   f"control plane ({now[0]}): upgrade the control plane first"))
    return problems


def _shown(value: Any) -> str:
    text = "(none)" if value is None else json.dumps(value, sort_keys=True, separators=(", ", ": "))
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 15] + f"... ({len(text)} chars)"


def format_diff(changes: dict[str, Any]) -> str:
    """The diff as `pulumi preview --diff` marks it: + create, - delete, ~ update, +- replace; each changed leaf
    with old -> new; replacements and removals of protected resources called out first."""
    added, removed, changed = changes["added"], changes["removed"], changes["changed"]
    replaced = [item for item in changed if item.get("op") == "replace"]
    updated = [item for item in changed if item.get("op") != "replace"]
    lines = [f"stack {changes['stack']}: {len(added)} to add, {len(removed)} to remove, {len(updated)} to change, "
             f"{len(replaced)} to replace"]
    danger = [f"{item['type']}  {item['name']}" for item in replaced + removed if item.get("protected")]
    if danger:
        lines.append(f"!! {len(danger)} PROTECTED resource(s) would be replaced or deleted (data loss; `pulumi up` "
                     "refuses until they are unprotected):")
        lines += [f"!!   {entry}" for entry in danger]
    lines += [f"+ {item['type']}  {item['name']}" for item in added]
    lines += [f"- {item['type']}  {item['name']}" + ("  [PROTECTED]" if item.get("protected") else "")
              for item in removed]
    for item in changed:
        replace = item.get("op") == "replace"
        marks = ("  [replace]" if replace else "") + ("  [PROTECTED]" if item.get("protected") else "")
        lines.append(f"{'+-' if replace else '~'} {item['type']}  {item['name']}{marks}")
        for change in item.get("changes") or [{"path": path} for path in item["paths"]]:
            if "old" not in change:
                lines.append(f"    {change['path']}")
                continue
            forced = "  (forces replacement)" if change["replace"] else ""
            lines.append(f"    {change['path']}: {_shown(change['old'])} -> {_shown(change['new'])}{forced}")
    return "\n".join(lines) + "\n"


_MANIFEST_NAME = re.compile(r"\d{3,}-[a-z0-9.-]+\.yaml")  # what _file_name writes


def _file_name(index: int, manifest: dict[str, Any]) -> str:
    metadata = manifest.get("metadata") or {}
    parts = [manifest.get("kind", "object"), metadata.get("namespace") or "", metadata.get("name") or "unnamed"]
    slug = "-".join(part for part in parts if part).lower()
    return f"{index:03d}-{re.sub(r'[^a-z0-9.-]+', '-', slug)}.yaml"


def _object_key(manifest: dict[str, Any]) -> tuple[str, str, str, str]:
    metadata = manifest.get("metadata") or {}
    return (str(manifest.get("kind", "")), str(metadata.get("namespace") or ""), str(metadata.get("name") or ""),
            str(manifest.get("apiVersion", "")))


def write_manifests(plan: dict[str, Any], directory: Path) -> list[Path]:
    """Every Kubernetes object as its own YAML file (ready for `kubectl diff -f DIR`).

    Files are numbered in (kind, namespace, name) order and keys are in the conventional order (apiVersion, kind,
    metadata, spec, ...), so the same plan writes the same bytes on every run. Raises NotADirectoryError if
    `directory` exists and is not a directory. Each file is written to a temporary name, then renamed.
    """
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    manifests = sorted((canonical(resource["inputs"]) for resource in kubernetes_objects(plan)), key=_object_key)
    targets = [directory / _file_name(index, manifest) for index, manifest in enumerate(manifests)]
    for target in targets:  # a name taken by a directory (or a socket...) would stop the renames half-way
        if (target.exists() or target.is_symlink()) and not target.is_file():
            raise IsADirectoryError(errno.EISDIR, "is in the way of a manifest: not a regular file", str(target))
    partials: list[Path] = []
    try:  # every file first under a temporary name, then the renames: all of the new set or none of it
        for target, manifest in zip(targets, manifests, strict=True):
            partial = target.with_name(f".{target.name}.partial")
            partials.append(partial)
            with open(partial, "w", encoding="utf-8") as handle:
                handle.write(dump_manifest(manifest))
                handle.flush()
                os.fsync(handle.fileno())
        for partial, target in zip(partials, targets, strict=True):
            os.replace(partial, target)
            written.append(target)
    finally:
        for partial in partials:
            partial.unlink(missing_ok=True)
    # Manifests an earlier run left (another stack's, an older plan's objects) would be applied with these by
    # `kubectl diff -f DIR`: remove the files of this writer's naming that the new set does not hold, nothing else.
    kept = {target.name for target in targets}
    for stale in directory.iterdir():
        if stale.name not in kept and _MANIFEST_NAME.fullmatch(stale.name) and stale.is_file() \
                and not stale.is_symlink():
            stale.unlink()
    return written
