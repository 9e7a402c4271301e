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

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

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

            meta = yaml.safe_load(chart_yaml.read_text()) or {}
            if str(meta.get("name")) == chart and str(meta.get("version")) == version:
                return path
    return None


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


def render_release(release: Mapping[str, Any], charts: Path, kubernetes_version: str,
                   crds: list[dict[str, Any]] | None = None) -> int:
    """Render one release; returns the number of objects, raises RenderProblem on the first class of failure.
    The CustomResourceDefinitions it renders are appended to `crds`."""
    import kubernetes_validate
    from helm_python import Chart, HelmError

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
    unknown = unknown_keys(values, chart.values, subcharts)
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
            crds.append(manifest)
        what = f"{template}: {manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name')}"
        try:
            kubernetes_validate.validate(manifest, kubernetes_version, strict=True)
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


def structural(schema: Any) -> Any:
    """A CRD's openAPIV3Schema as a strict JSON Schema: an object schema with `properties` admits no other key
    (the API server prunes unknown fields of a structural schema; here they are errors, so a misspelt field cannot
    pass), `x-kubernetes-int-or-string` admits both, `x-kubernetes-preserve-unknown-fields` keeps anything."""
    if isinstance(schema, list):
        return [structural(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: structural(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def custom_resource_problems(plan: Mapping[str, Any], crds: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """Validate every custom resource of the plan whose group one of `crds` defines, strictly, against the schema of
    its version (which must be served). CEL rules (x-kubernetes-validations) are not evaluated here."""
    import jsonschema

    schemas: dict[tuple[str, str], tuple[bool, Any]] = {}
    groups = set()
    for crd in crds:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        groups.add(group)
        for version in crd["spec"]["versions"]:
            schemas[(f"{group}/{version['name']}", kind)] = (
                bool(version.get("served")), structural(version["schema"]["openAPIV3Schema"]))
    problems, count = [], 0
    for resource in plan["resources"]:
        manifest = resource["inputs"]
        api_version = str(manifest.get("apiVersion") or "")
        if not resource["type"].startswith("kubernetes:") or api_version.split("/")[0] not in groups:
            continue
        count += 1
        served, schema = schemas.get((api_version, str(manifest.get("kind"))), (False, None))
        if schema is None or not served:
            problems.append(f"{resource['name']}: {api_version} {manifest.get('kind')} is not served by the CRDs")
            continue
        # metadata is the API server's, not the CRD's: check it is an object; labels/names by kubernetes rules.
        body = {**manifest, "metadata": {}}
        for error in sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=str):
            where = ".".join(str(part) for part in error.absolute_path) or "(root)"
            problems.append(f"{resource['name']}: {where}: {error.message}")
    return count, problems


def check_plan(plan: Mapping[str, Any], charts: Path, kubernetes_version: str) -> list[str]:
    """One `error: ...` or `ok: ...` line per release, then one for the custom resources the charts define."""
    lines = []
    crds: list[dict[str, Any]] = []
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
    import yaml

    raw = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    for section in ("ml-cluster:cluster", "ml-cluster:onprem"):
        version = (raw.get(section) or {}).get("kubernetesVersion")
        if version:
            return str(version)
    raise RenderProblem(f"stacks/Pulumi.{stack}.yaml sets no kubernetesVersion")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="plan this stack offline first (dev, staging, prod, onprem)")
    source.add_argument("--plan", type=Path, help="a plan document (scripts/plan.py --json)")
    parser.add_argument("--charts", type=Path, required=True, help="directory of pulled charts")
    parser.add_argument("--kubernetes-version", help="default: the stack's kubernetesVersion")
    args = parser.parse_args(argv)
    try:
        if args.plan is not None:
            plan = json.loads(args.plan.read_text())
            version = args.kubernetes_version or stack_kubernetes_version(plan["stack"])
        else:
            from infra.offline import plan_stack

            plan = plan_stack(args.stack)
            version = args.kubernetes_version or stack_kubernetes_version(args.stack)
    except (OSError, ValueError, KeyError, RenderProblem) as exc:
        print(f"error: {args.stack or args.plan}: {exc}", file=sys.stderr)
        return 2
    lines = check_plan(plan, args.charts, version)
    for line in lines:
        print(line)
    return 2 if any(line.startswith("error:") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
