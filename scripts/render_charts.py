"""Render every Helm release of a stack's plan with its real chart, at its pinned version, under the real Helm
template engine (helm-python-sdk, no Helm binary), and check what comes out.

    scripts/render_charts.py --stack dev --charts DIR            # plan the stack offline, then render
    scripts/render_charts.py --plan plan.json --charts DIR --kubernetes-version 1.33

DIR holds the pulled charts, one per release: `<chart>-<version>.tgz` (what `helm pull --version` writes), or a
directory `<chart>-<version>/<chart>/`, `<chart>-<version>/` or `<chart>/` whose Chart.yaml has that version.

A release fails when: its chart at the pinned version is not in DIR; the plan's values name a key the chart does
not have (or its values.schema.json rejects them); the chart does not render; or a rendered object is not valid,
strictly, for the stack's Kubernetes version (kubernetes-validate; a kind the cluster does not serve, such as
OpenShift's SecurityContextConstraints, is an error). The plan's custom resources (Kueue's queues) are validated,
strictly, against the CRDs the charts render. Output: `error: <release>: <why>` lines, exit 2 on failure;
`ok: <release>: <chart> <version>: <n> objects` otherwise.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workloads.cli import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Maps whose keys are free by design (arguments, labels, annotations) or Kubernetes types that kubernetes-validate
# checks once rendered: a key below them is not a chart values key.
FREE_FORM = frozenset({
    "extraArgs", "extraEnv", "podAnnotations", "podLabels", "annotations", "labels", "nodeSelector",
    "affinity", "resources", "securityContext", "podSecurityContext", "containerSecurityContext",
    "additionalLabels", "commonLabels",
})
NOT_MANIFESTS = ("NOTES.txt",)


class RenderProblem(Exception):
    """One reason a release does not render cleanly."""


def helm_releases(plan: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for resource in plan["resources"]:
        if resource["type"] == "kubernetes:helm.sh/v3:Release":
            yield resource


def chart_name(chart: str) -> str:
    """A release's chart as `helm pull` names the package: `oci://registry.k8s.io/kueue/charts/kueue` -> kueue."""
    return chart.rstrip("/").rsplit("/", 1)[-1] if chart.startswith("oci://") else chart


def find_chart(charts: Path, chart: str, version: str) -> Path | None:
    candidates = [
        charts / f"{chart}-{version}.tgz",
        charts / f"{chart}-{version}" / chart,
        charts / f"{chart}-{version}",
        charts / chart,
    ]
    for path in candidates:
        if path.is_file():
            return path
        chart_yaml = path / "Chart.yaml"
        if chart_yaml.is_file():
            import yaml

            try:
                meta = yaml.safe_load(chart_yaml.read_text(encoding="utf-8")) or {}
            except (UnicodeDecodeError, yaml.YAMLError) as exc:
                raise RenderProblem(f"{chart_yaml}: not a YAML text ({type(exc).__name__})") from exc
            if not isinstance(meta, Mapping):
                raise RenderProblem(f"{chart_yaml}: not a chart's metadata (a mapping with name and version)")
            if str(meta.get("name")) == chart and str(meta.get("version")) == version:
                return path
    return None


def checked_kubernetes_version(version: str) -> str:
    """`version` (1.33 or 1.33.0) if kubernetes-validate has its schemas, else RenderProblem saying which it has."""
    from kubernetes_validate.utils import all_versions

    known = sorted({".".join(v.split(".")[:2]) for v in all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        raise RenderProblem(f"--kubernetes-version: {version!r} is not a Kubernetes version such as {known[-1]}")
    if ".".join(version.split(".")[:2]) not in known:
        raise RenderProblem(f"--kubernetes-version: {version}: kubernetes-validate has schemas for {known[0]} to "
                            f"{known[-1]} only")
    return version


def unknown_keys(values: Any, defaults: Any, subcharts: frozenset[str], path: str = "") -> list[str]:
    """Keys of `values` that the chart's values.yaml does not have (free-form maps and subcharts excepted)."""
    if not isinstance(values, Mapping) or not isinstance(defaults, Mapping) or not defaults:
        return []
    problems = []
    for key, value in values.items():
        where = f"{path}.{key}" if path else str(key)
        if not path and key in subcharts:
            continue
        if key not in defaults:
            problems.append(where)
        elif key not in FREE_FORM:
            problems.extend(unknown_keys(value, defaults[key], subcharts, where))
    return problems


def _documents(rendered: Mapping[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    import yaml

    # libyaml where PyYAML has it: a chart with large CRDs (Kueue's) takes seconds to parse in pure Python.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for template, text in sorted(rendered.items()):
        if template.endswith(NOT_MANIFESTS) or "/tests/" in template:
            continue
        for document in yaml.load_all(text, Loader=loader):
            if document:
                yield template, document


def _crd_loader() -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the operator's CRDs are megabytes of YAML

    class Loader(base):  # type: ignore[misc,valid-type]
        """PyYAML cannot construct a plain `=` scalar (YAML's obsolete value tag), which some CRDs' enums hold."""

    Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))
    return Loader


def chart_crds(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """{(apiVersion, kind): openAPIV3Schema} of every CRD in a chart's crds/ directories (subcharts included),
    the schemas the API server will enforce once Helm has applied them. Parsed once per chart file and process:
    the Prometheus operator's CRDs are megabytes."""
    stat = path.stat()
    return _chart_crds(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _chart_crds(path: Path, _mtime_ns: int, _size: int) -> dict[tuple[str, str], dict[str, Any]]:
    import tarfile

    import yaml

    texts: list[str] = []
    if path.is_file():
        with tarfile.open(path) as archive:
            for member in archive.getmembers():
                # Helm applies the files directly in a crds/ directory (not templates under a chart named crds).
                if Path(member.name).parent.name == "crds" and member.name.endswith((".yaml", ".yml")) \
                        and member.isfile():
                    handle = archive.extractfile(member)
                    if handle is not None:
                        texts.append(handle.read().decode())
    else:
        texts = [p.read_text() for p in sorted(path.rglob("*.y*ml")) if p.parent.name == "crds"]
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for text in texts:
        for document in yaml.load_all(text, Loader=_crd_loader()):
            if document and document.get("kind") == "CustomResourceDefinition":
                schemas.update(crd_schemas(document))
    return schemas


def strict_schema(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that rejects unknown fields, as the API server prunes/rejects them
    (`kubectl apply --validate=strict`): additionalProperties false wherever properties are listed and unknown
    fields are not preserved; int-or-string accepted as either."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict_schema(value) for key, value in schema.items()}
    pattern = out.get("pattern")
    if isinstance(pattern, str) and (flags := re.match(r"\^\(\?([a-zA-Z]+)\)", pattern)):
        # Go's RE2 takes inline flags anywhere (Kueue's AdmissionCheck: `^(?i)[a-z]...`); Python only at the start.
        out["pattern"] = f"(?{flags.group(1)})^{pattern[flags.end():]}"
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields") and \
            "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def validate_custom(manifest: Mapping[str, Any], crds: Mapping[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Problems of a custom resource against its CRD's schema ([] when valid); raises KeyError for an unknown kind."""
    import jsonschema

    schema = strict_schema(crds[(str(manifest.get("apiVersion")), str(manifest.get("kind")))])
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in sorted(validator.iter_errors(dict(manifest)), key=lambda e: list(e.absolute_path))]


def crd_schemas(document: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """{(apiVersion, kind): openAPIV3Schema} of one CustomResourceDefinition's served versions."""
    spec = document["spec"]
    return {(f"{spec['group']}/{version['name']}", spec["names"]["kind"]): version["schema"]["openAPIV3Schema"]
            for version in spec["versions"] if version.get("served", True)}


def render_release(release: Mapping[str, Any], charts: Path, kubernetes_version: str,
                   crds: dict[tuple[str, str], dict[str, Any]] | None = None) -> int:
    """Render one release; returns the number of objects, raises RenderProblem on the first class of failure.
    Custom resources are validated against `crds`; the CRDs a chart renders as templates (Kueue's) are added."""
    import kubernetes_validate
    from helm_python import Chart, HelmError

    from infra.plan.kubeschema import validate

    inputs = release["inputs"]
    name, version = chart_name(inputs["chart"]), str(inputs.get("version") or "")
    if not version:
        raise RenderProblem(f"chart {name} has no pinned version")
    path = find_chart(charts, name, version)
    if path is None:
        raise RenderProblem(f"chart {name} {version} is not in {charts} (was it ever published?)")
    values = inputs.get("values") or {}
    try:
        chart = Chart.load(path)
    except HelmError as exc:
        raise RenderProblem(f"chart {name} {version} does not load: {exc}") from exc
    if str(chart.version) != version:
        raise RenderProblem(f"{path} is chart version {chart.version}, the plan pins {version}")
    subcharts = frozenset(
        str(dep.get("alias") or dep.get("name")) for dep in (chart.metadata.get("dependencies") or [])
    ) | frozenset(str(dep.get("name")) for dep in chart.dependencies)
    # A top-level key the templates read although values.yaml only documents it in a comment (dcgm-exporter's
    # customMetrics, templates/metrics-configmap.yaml:9) is the chart's too.
    texts = [str(template.get("data", "")) for template in chart.templates or []]
    read = {key for key in values if key not in (chart.values or {})
            and any(re.search(rf"\.Values\.{re.escape(str(key))}\b", text) for text in texts)}
    unknown = unknown_keys({k: v for k, v in values.items() if k not in read}, chart.values, subcharts)
    if unknown:
        raise RenderProblem(f"values key(s) the chart {name} {version} does not have: {', '.join(unknown)}")
    try:
        rendered = chart.render(values, name=inputs.get("name") or name,
                                namespace=inputs.get("namespace") or "default", is_install=True)
    except HelmError as exc:
        raise RenderProblem(f"helm template fails: {exc}") from exc
    problems, count = [], 0
    for template, manifest in _documents(rendered):
        count += 1
        if crds is not None and manifest.get("kind") == "CustomResourceDefinition":
            crds.update(crd_schemas(manifest))
        what = f"{template}: {manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name')}"
        key = (str(manifest.get("apiVersion")), str(manifest.get("kind")))
        if crds and key in crds:  # a kind another release's chart defines (the Prometheus operator's monitors)
            problems.extend(f"{what}: {problem}" for problem in validate_custom(manifest, crds))
            continue
        try:
            validate(manifest, kubernetes_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{what}: {manifest.get('apiVersion')} {manifest.get('kind')} is not served by "
                            f"Kubernetes {kubernetes_version}")
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{what}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")
    if problems:
        raise RenderProblem("; ".join(problems))
    return count


def rendered_objects(release: Mapping[str, Any], charts: Path) -> list[dict[str, Any]]:
    """The objects a release's chart renders with the plan's values (for tests and placement checks)."""
    from helm_python import Chart

    inputs = release["inputs"]
    path = find_chart(charts, chart_name(inputs["chart"]), str(inputs.get("version")))
    if path is None:
        raise RenderProblem(f"chart {inputs['chart']} {inputs.get('version')} is not in {charts}")
    rendered = Chart.load(path).render(inputs.get("values") or {},
                                       name=inputs.get("name") or chart_name(inputs["chart"]),
                                       namespace=inputs.get("namespace") or "default", is_install=True)
    return [manifest for _, manifest in _documents(rendered)]


def custom_resource_problems(plan: Mapping[str, Any],
                             crds: Mapping[tuple[str, str], dict[str, Any]]) -> tuple[int, list[str]]:
    """Validate, strictly, every custom resource of the plan whose API group one of `crds` defines (Kueue's queues,
    the Prometheus operator's monitors) against its served version's schema. CEL rules (x-kubernetes-validations)
    are not evaluated here."""
    groups = {api_version.split("/")[0] for api_version, _ in crds}
    problems, count = [], 0
    for resource in plan["resources"]:
        manifest = resource["inputs"]
        api_version = str(manifest.get("apiVersion") or "")
        if not resource["type"].startswith("kubernetes:") or api_version.split("/")[0] not in groups:
            continue
        count += 1
        if (api_version, str(manifest.get("kind"))) not in crds:
            problems.append(f"{resource['name']}: {api_version} {manifest.get('kind')} is not served by the CRDs")
            continue
        problems.extend(f"{resource['name']}: {problem}" for problem in validate_custom(manifest, crds))
    return count, problems


def check_plan(plan: Mapping[str, Any], charts: Path, kubernetes_version: str) -> list[str]:
    """One `error: ...` or `ok: ...` line per release, then one for the custom resources the charts define."""
    import tarfile

    import yaml

    lines = []
    crds: dict[tuple[str, str], dict[str, Any]] = {}
    for release in helm_releases(plan):  # the CRDs every chart of the plan brings, for every other release
        try:
            path = find_chart(charts, chart_name(release["inputs"]["chart"]),
                              str(release["inputs"].get("version") or ""))
            if path is not None:
                crds.update(chart_crds(path))
        except (RenderProblem, OSError, ValueError, tarfile.TarError, yaml.YAMLError):
            continue  # the release's own line below says what is wrong with its chart
    for release in helm_releases(plan):
        inputs = release["inputs"]
        try:
            count = render_release(release, charts, kubernetes_version, crds)
        except RenderProblem as exc:
            lines.append(f"error: {release['name']}: {exc}")
        else:
            lines.append(f"ok: {release['name']}: {inputs['chart']} {inputs.get('version')}: {count} objects")
    count, problems = custom_resource_problems(plan, crds)
    lines += [f"error: custom resource {problem}" for problem in problems]
    if count and not problems:
        lines.append(f"ok: custom resources: {count} valid against the charts' CRDs")
    return lines


def stack_kubernetes_version(stack: str) -> str:
    from infra.stackyaml import read_stack_document

    raw = read_stack_document(ROOT / "stacks" / f"Pulumi.{stack}.yaml")["config"]
    for section in ("ml-cluster:cluster", "ml-cluster:onprem"):
        version = (raw.get(section) or {}).get("kubernetesVersion")
        if version:
            return str(version)
    raise RenderProblem(f"stacks/Pulumi.{stack}.yaml sets no kubernetesVersion")


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="plan this stack offline first (dev, staging, prod, onprem)")
    source.add_argument("--plan", type=Path, help="a plan document (scripts/plan.py --json)")
    parser.add_argument("--charts", type=Path, required=True, help="directory of pulled charts")
    parser.add_argument("--kubernetes-version", help="default: the stack's kubernetesVersion")
    args = parser.parse_args(argv)
    try:
        if args.plan is not None:
            from infra.plan.view import load_plan_document

            plan = load_plan_document(args.plan)
            if args.kubernetes_version is None and "stack" not in plan:
                raise RenderProblem("names no stack: pass --kubernetes-version")
            version = args.kubernetes_version or stack_kubernetes_version(plan["stack"])
        else:
            from infra.plan.engine import plan_stack

            plan = plan_stack(args.stack)
            version = args.kubernetes_version or stack_kubernetes_version(args.stack)
        version = checked_kubernetes_version(version)
    except (OSError, ValueError, KeyError, RenderProblem) as exc:
        print(f"error: {args.stack or args.plan}: {exc}", file=sys.stderr)
        return 2
    lines = check_plan(plan, args.charts, version)
    for line in lines:
        print(line)
    return 2 if any(line.startswith("error:") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
