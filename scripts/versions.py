"""What the project pins against what is current: every Helm chart the stacks release (pinned vs the newest in its
repository), every stack's Kubernetes minor against the support calendar, the training image's base (tag, digest,
CUDA and the driver it needs, torch, the EFA installer), the Pulumi SDK and provider packages (pyproject's range,
installed, provider plugin), and the GPU nodes' EKS AMI types and releases.

    python scripts/versions.py [--online] [--fail-behind] [--today YYYY-MM-DD] [--stacks dev,prod,...]

Offline (the default, as CI runs it) the newest chart versions are not known and only the calendar is read.
--online reads each chart repository's index.yaml (OCI charts are listed as not checked), PyPI's newest release of
each Pulumi package, and the registry's current digest of the base image's tag. --fail-behind exits 1 when a chart
is behind its repository's newest release, a stack's minor leaves (standard) support within the calendar's warning
window, a Pulumi package's newest release is outside pyproject's range (or the installed one is), or the base
image's tag no longer points at the pinned digest: the scheduled versions workflow turns that into an issue.
Exit 0, 1 (behind, with --fail-behind) or 2 with `error: <where>: <why>`.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.config.support import WARN_DAYS, calendar  # noqa: E402
from infra.plan.engine import STACKS_DIR, PlanStopped, plan_error_lines, plan_stack  # noqa: E402
from workloads.cli import ArgumentParser, parse_day  # noqa: E402

RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "workloads" / "Dockerfile"
PYPROJECT = ROOT / "pyproject.toml"
PULUMI_PACKAGES = ("pulumi", "pulumi-aws", "pulumi-kubernetes")
# The oldest Linux driver each CUDA release needs (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver
# Versions", the GA rows); newer drivers run older CUDA.
CUDA_MIN_DRIVER = {"12.4": "550.54.14", "12.6": "560.28.03", "12.8": "570.26", "13.0": "580.65.06"}
MAX_JSON_BYTES = 16 * 1024 * 1024
INDEX_TIMEOUT_S = 30
MAX_INDEX_BYTES = 64 * 1024 * 1024
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")  # releases only: no -rc, -beta


@dataclass(frozen=True)
class Chart:
    name: str
    repo: str
    pinned: str
    stacks: tuple[str, ...]


def pinned_charts(plans: Iterable[dict[str, Any]]) -> list[Chart]:
    found: dict[tuple[str, str, str], list[str]] = {}
    for plan in plans:
        for resource in plan["resources"]:
            if resource["type"] == RELEASE:
                inputs = resource["inputs"]
                repo = (inputs.get("repositoryOpts") or {}).get("repo") or inputs["chart"]
                name = str(inputs["chart"]).rsplit("/", 1)[-1]
                found.setdefault((name, str(repo), str(inputs.get("version"))), []).append(str(plan["stack"]))
    return [Chart(n, r, v, tuple(sorted(set(s)))) for (n, r, v), s in sorted(found.items())]


def newest_release(index: dict[str, Any], chart: str) -> str | None:
    """The highest release version of `chart` in a Helm repository index (pre-releases left out)."""
    entries = (index.get("entries") or {}).get(chart) or []
    versions = [str(e.get("version")) for e in entries if isinstance(e, dict) and _SEMVER.match(str(e.get("version")))]
    return max(versions, key=_key) if versions else None


def _key(version: str) -> tuple[int, int, int]:
    match = _SEMVER.match(version)
    assert match is not None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def fetch_index(repo: str) -> dict[str, Any]:
    """A repository's index.yaml over HTTPS, with a deadline and a size cap. Raises OSError / ValueError."""
    import yaml

    url = repo.rstrip("/") + "/index.yaml"
    body = _get_bounded(url, MAX_INDEX_BYTES, chunk_size=1 << 20)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = yaml.load(body, Loader=loader)  # noqa: S506 (a safe loader)
    if not isinstance(document, dict):
        raise ValueError(f"{url}: not a Helm repository index")
    return document


def report(plans: list[dict[str, Any]], today: date, online: bool,
           index_of: Callable[[str], dict[str, Any]] = fetch_index) -> tuple[list[str], list[str]]:
    """The report's lines, and what is behind (for --fail-behind)."""
    lines, behind = [f"versions on {today}", "", "charts (pinned / newest in its repository):"], []
    for chart in pinned_charts(plans):
        newest = "not checked (offline)"
        if online and chart.repo.startswith("oci://"):
            newest = "not checked (OCI registry: see the chart's releases)"
        elif online:
            try:
                newest = newest_release(index_of(chart.repo), chart.name) or "not in the index"
            except (OSError, ValueError) as exc:
                newest = f"unreadable ({str(exc).splitlines()[0][:120]})"
            if _SEMVER.match(newest) and _key(newest) > _key(chart.pinned):
                behind.append(f"chart {chart.name} {chart.pinned} is behind {newest}")
        lines.append(f"  {chart.name:28} {chart.pinned:10} {newest:12} {', '.join(chart.stacks)}")
    lines += ["", "Kubernetes (stack: minor, tier today, end of (standard) support):"]
    for plan in plans:
        outputs = plan.get("outputs") or {}
        version, platform = str(outputs.get("kubernetesVersion")), str(outputs.get("platform"))
        releases = calendar().eks if platform == "eks" else calendar().upstream
        release = releases.get(version)
        if release is None:
            lines.append(f"  {plan['stack']:10} {version:6} not in the support calendar")
            behind.append(f"stack {plan['stack']}: Kubernetes {version} is not in the support calendar")
            continue
        days = (release.end_of_standard - today).days
        lines.append(f"  {plan['stack']:10} {version:6} {release.tier(today):10} {release.end_of_standard} "
                     f"({days} days; {'EKS' if platform == 'eks' else 'upstream'})")
        if days <= WARN_DAYS:
            behind.append(f"stack {plan['stack']}: Kubernetes {version} leaves support on {release.end_of_standard}")
    return lines, behind



@dataclass(frozen=True)
class BaseImage:
    repository: str  # pytorch/pytorch
    tag: str | None
    digest: str | None  # sha256:... when the FROM line pins one

    @property
    def reference(self) -> str:
        return self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def cuda(self) -> str | None:
        match = re.search(r"cuda(\d+\.\d+)", self.tag or "")
        return match.group(1) if match else None

    @property
    def cudnn(self) -> str | None:
        match = re.search(r"cudnn(\d+)", self.tag or "")
        return match.group(1) if match else None


def base_image(dockerfile: str) -> BaseImage:
    """The image of the Dockerfile's first FROM (flags such as --platform skipped). Raises ValueError."""
    for line in dockerfile.splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            ref = next((word for word in words[1:] if not word.startswith("--")), "")
            if not ref or "$" in ref:
                raise ValueError(f"FROM {ref!r}: not a literal image reference")
            name, _, digest = ref.partition("@")
            repository, tag = name, None
            if ":" in name.rsplit("/", 1)[-1]:
                repository, tag = name.rsplit(":", 1)
            return BaseImage(repository, tag, digest or None)
    raise ValueError("no FROM line")


def installer_version(dockerfile: str) -> str | None:
    match = re.search(r"aws-efa-installer-(\d+\.\d+\.\d+)\.tar\.gz", dockerfile)
    return match.group(1) if match else None


def declared_requirements(pyproject: str) -> dict[str, str]:
    """Package name -> specifier, from [project] dependencies and every optional-dependency list."""
    from packaging.requirements import Requirement

    project = tomllib.loads(pyproject)["project"]
    found: dict[str, str] = {}
    for text in [*project.get("dependencies", []), *(r for group in project.get("optional-dependencies", {}).values()
                                                     for r in group)]:
        requirement = Requirement(text)
        found.setdefault(requirement.name.lower(), str(requirement.specifier))
    return found


def installed_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def provider_plugin(package: str) -> str | None:
    """The provider plugin a Pulumi provider package runs (its pulumi-plugin.json): `aws v7.51.1`."""
    from importlib import metadata

    try:
        files = metadata.files(package) or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "pulumi-plugin.json":
            try:
                data = json.loads(file.read_text() or "{}")
            except (OSError, ValueError):
                return "unreadable pulumi-plugin.json"
            if not isinstance(data, dict) or not data.get("resource"):
                return None
            return f"{data.get('name')} v{data.get('version')}"
    return None


def _get_bounded(url: str, max_bytes: int, headers: dict[str, str] | None = None, chunk_size: int = 1 << 16) -> bytes:
    """The body of a GET, with a deadline and at most `max_bytes`. Raises OSError (requests') / ValueError."""
    import requests

    with requests.get(url, headers=headers, timeout=INDEX_TIMEOUT_S, stream=True) as response:
        response.raise_for_status()
        body = bytearray()
        for chunk in response.iter_content(chunk_size):
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"{url}: larger than {max_bytes} bytes")
    return bytes(body)


def _get_json(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    document = json.loads(_get_bounded(url, MAX_JSON_BYTES, headers))
    if not isinstance(document, dict):
        raise ValueError(f"{url}: not a JSON object")
    return document


def pypi_newest(package: str) -> str:
    """PyPI's newest release of `package` (its JSON API's info.version). Raises OSError / ValueError."""
    version = (_get_json(f"https://pypi.org/pypi/{quote(package)}/json").get("info") or {}).get("version")
    if not isinstance(version, str):
        raise ValueError(f"{package}: PyPI names no version")
    return version


def docker_hub_digest(repository: str, tag: str) -> str:
    """The digest Docker Hub serves for repository:tag now (the manifest list's, what `docker pull` resolves):
    an anonymous pull token, then HEAD on the manifest. Raises OSError / ValueError."""
    import requests

    repo = repository if "/" in repository else f"library/{repository}"
    token = _get_json("https://auth.docker.io/token?service=registry.docker.io&scope="
                      + quote(f"repository:{repo}:pull", safe="")).get("token")
    if not isinstance(token, str):
        raise ValueError("auth.docker.io: no token")
    accept = ", ".join(["application/vnd.oci.image.index.v1+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.docker.distribution.manifest.v2+json"])
    response = requests.head(f"https://registry-1.docker.io/v2/{repo}/manifests/{quote(tag)}",
                             headers={"Authorization": f"Bearer {token}", "Accept": accept},
                             timeout=INDEX_TIMEOUT_S)
    response.raise_for_status()
    digest = response.headers.get("Docker-Content-Digest", "")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"{repository}:{tag}: no digest in the registry's answer")
    return digest


AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"


def registry_k8s_tags(repository: str) -> list[str]:
    """The tags registry.k8s.io publishes for a repository (the OCI distribution API's tags/list, anonymous)."""
    path = repository.removeprefix("registry.k8s.io/")
    tags = _get_json(f"https://registry.k8s.io/v2/{path}/tags/list").get("tags")
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise ValueError(f"{repository}: tags/list: no list of tags")
    return tags


def autoscaler_tags(plans: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """The cluster-autoscaler image tag each stack's release runs -> the stacks."""
    found: dict[str, list[str]] = {}
    for plan in plans:
        for resource in plan["resources"]:
            inputs = resource.get("inputs") or {}
            if resource["type"] == RELEASE and inputs.get("chart") == "cluster-autoscaler":
                tag = str(((inputs.get("values") or {}).get("image") or {}).get("tag") or "?")
                found.setdefault(tag, []).append(plan["stack"])
    return found


def autoscaler_report(plans: list[dict[str, Any]], online: bool,
                      tags_of: Callable[[str], list[str]] = registry_k8s_tags) -> tuple[list[str], list[str]]:
    """Each cluster-autoscaler image tag the stacks pin, against the tags the registry publishes (a git tag of
    kubernetes/autoscaler is not a published image)."""
    lines, behind = ["", f"cluster-autoscaler image ({AUTOSCALER_IMAGE}):"], []
    pinned = autoscaler_tags(plans)
    published: list[str] | str = "not checked (offline)"
    if online and pinned:
        try:
            published = tags_of(AUTOSCALER_IMAGE)
        except (OSError, ValueError) as exc:
            published = f"unreadable ({str(exc).splitlines()[0][:120]})"
    for tag, stacks in sorted(pinned.items()):
        if isinstance(published, str):
            state = published
        elif tag in published:
            state = "published"
        else:
            state = "NOT published in the registry"
            behind.append(f"cluster-autoscaler {tag} ({', '.join(stacks)}) is not a tag of {AUTOSCALER_IMAGE}")
        lines.append(f"  {tag:10} {', '.join(stacks):28} {state}")
    return lines, behind


def _online(fetch: Callable[[], str]) -> str:
    try:
        return fetch()
    except (OSError, ValueError) as exc:
        return f"unreadable ({str(exc).splitlines()[0][:120]})"


def toolchain_report(plans: list[dict[str, Any]], online: bool, dockerfile: str, pyproject: str,
                     digest_of: Callable[[str, str], str] = docker_hub_digest,
                     newest_of: Callable[[str], str] = pypi_newest,
                     installed_of: Callable[[str], str | None] = installed_version,
                     plugin_of: Callable[[str], str | None] = provider_plugin) -> tuple[list[str], list[str]]:
    """The training image, Pulumi and AMI lines of the report, and what is behind."""
    from packaging.specifiers import SpecifierSet

    lines, behind = ["", "training image (workloads/Dockerfile):"], []
    image = base_image(dockerfile)
    pinned = image.digest or "not pinned (tag only)"
    lines.append(f"  base           {image.repository}:{image.tag}  digest: {pinned}")
    if online and image.tag:
        current = _online(lambda: digest_of(image.repository, image.tag or ""))
        lines.append(f"                 the tag now: {current}")
        if image.digest and current.startswith("sha256:") and current != image.digest:
            behind.append(f"base image {image.repository}:{image.tag} now points at {current}, not the pinned "
                          f"{image.digest}")
    driver = CUDA_MIN_DRIVER.get(image.cuda or "")
    lines.append(f"  CUDA / cuDNN   {image.cuda or '?'} / {image.cudnn or '?'} (from the tag); nodes need an NVIDIA "
                 + (f"driver >= {driver}" if driver else "driver of this CUDA release (its release notes)"))
    declared = declared_requirements(pyproject)
    lines.append(f"  torch          {declared.get('torch', '?')} (pyproject; the image's build refuses another)")
    lines.append(f"  EFA installer  {installer_version(dockerfile) or 'not found'}")
    lines += ["", "Pulumi (package, pyproject's range, installed, provider plugin, newest on PyPI):"]
    for package in PULUMI_PACKAGES:
        spec = declared.get(package, "")
        have = installed_of(package)
        newest = _online(lambda package=package: newest_of(package)) if online else "not checked (offline)"
        plugin = plugin_of(package) or "-"
        lines.append(f"  {package:18} {spec or 'undeclared':14} {have or 'not installed':10} {plugin:18} {newest}")
        if have is not None and spec and have not in SpecifierSet(spec):
            behind.append(f"{package} {have} is installed, outside pyproject's {spec}")
        if online and spec and re.fullmatch(r"\d+(\.\d+)*", newest) and newest not in SpecifierSet(spec):
            behind.append(f"{package} {newest} is out, outside pyproject's {spec}")
    lines += ["", "EKS node AMIs (stack pool: AMI type, release):"]
    for plan in plans:
        for resource in plan["resources"]:
            if resource["type"] != NODE_GROUP:
                continue
            inputs = resource["inputs"]
            pool = str(resource["name"]).split("-nodepools-", 1)[-1].removesuffix("-ng")
            release = inputs.get("releaseVersion") or (f"not pinned: EKS's latest for {inputs.get('version')} when "
                                                       "the group is created or its Kubernetes version changes")
            lines.append(f"  {plan['stack']:10} {pool:14} {inputs.get('amiType')!s:28} {release}")
    return lines, behind


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Pinned chart and Kubernetes versions against what is current.")
    parser.add_argument("--online", action="store_true", help="read the chart repositories' index.yaml")
    parser.add_argument("--fail-behind", action="store_true", help="exit 1 when something is behind")
    parser.add_argument("--today", type=parse_day, default=datetime.now(UTC).date(), metavar="YYYY-MM-DD")
    parser.add_argument("--stacks", help="comma-separated stacks (default: every stacks/Pulumi.<stack>.yaml)")
    args = parser.parse_args(argv)
    stacks = args.stacks.split(",") if args.stacks else sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in STACKS_DIR.glob("Pulumi.*.yaml"))
    plans = []
    for stack in stacks:
        try:
            plans.append(plan_stack(stack))
        except PlanStopped as exc:
            print("\n".join(plan_error_lines(exc)), file=sys.stderr)
            return 2
    lines, behind = report(plans, args.today, args.online)
    try:
        more, more_behind = toolchain_report(plans, args.online, DOCKERFILE.read_text(), PYPROJECT.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {DOCKERFILE.relative_to(ROOT)} / {PYPROJECT.relative_to(ROOT)}: {exc}", file=sys.stderr)
        return 2
    scaler, scaler_behind = autoscaler_report(plans, args.online)
    lines, behind = lines + more + scaler, behind + more_behind + scaler_behind
    print("\n".join(lines))
    if behind:
        print("\nbehind:\n" + "\n".join(f"  {item}" for item in behind))
    return 1 if behind and args.fail_behind else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
