"""What `submit` reads before it talks to the cluster: spec files and facts files (bounded, refused in one line
when they are not what they should be), the stack's facts from its `jobFacts` output (the facts in the cluster:
workloads/submit/facts.py), and the manifests they render to."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import yaml

from workloads.cluster_facts import ClusterFacts, facts_from_dict
from workloads.jobspec import JobSpecError, load_job_file, render_job
from workloads.jobspec.goodput import far_note, prediction_line
from workloads.jobspec.launcher import launcher_notes
from workloads.jobspec.prediction import annotate_prediction
from workloads.safeio import StateFileError, read_text_file
from workloads.submit.errors import RuntimeFailure, UsageError

MAX_NESTING = 64  # a job spec or facts file nests a handful of levels; deeper is hostile or broken input
MAX_INPUT_BYTES = 16 << 20  # a job spec or facts file is kilobytes; a FIFO or /dev/zero must not hang or fill memory
PULUMI_TIMEOUT_S = 120.0


def _read_text(path: str) -> str:
    """The file as UTF-8 text, or a UsageError (missing, not a regular file, too large, binary, NUL bytes).
    A link the user names is followed; a FIFO or a device is refused without blocking."""
    try:
        return read_text_file(path, MAX_INPUT_BYTES)
    except StateFileError as exc:
        raise UsageError(path, exc.why) from None


def _check_yaml_nesting(path: str) -> None:
    """Refuse binary or absurdly nested YAML before the recursive loader sees it (one-line error, no traceback).

    yaml.parse is an iterative event stream, so measuring depth cannot itself overflow the stack."""
    text = _read_text(path)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise UsageError(path, f"nested deeper than {MAX_NESTING} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        raise UsageError(path, f"not valid YAML: {exc}".splitlines()[0]) from None


def load_facts(path: str) -> ClusterFacts:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(path, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(path, "nested too deeply to be cluster facts") from None
    if not isinstance(data, dict):
        raise UsageError(path, "expected a JSON object of cluster facts")
    try:
        return facts_from_dict(data)
    except ValueError as exc:
        raise UsageError(path, str(exc)) from None


def stack_facts(stack: str) -> ClusterFacts:
    """The stack's ClusterFacts from its `jobFacts` output (the Pulumi CLI, logged in to the stack's backend)."""
    where = f"pulumi stack output jobFacts --stack {stack}"
    try:
        done = subprocess.run(["pulumi", "stack", "output", "jobFacts", "--json", "--stack", stack],
                              capture_output=True, text=True, check=False, timeout=PULUMI_TIMEOUT_S)
    except FileNotFoundError:
        raise UsageError("pulumi", "not installed: pass --facts FILE instead of reading the stack") from None
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(where, f"no answer within {PULUMI_TIMEOUT_S:g}s (is the state backend reachable?); "
                                    "or pass --facts FILE") from None
    if done.returncode != 0:
        raise UsageError(where, (done.stderr.strip().splitlines() or ["failed"])[-1])
    try:
        data = json.loads(done.stdout)
        return facts_from_dict(data)
    except (json.JSONDecodeError, ValueError, AttributeError) as exc:
        raise UsageError(where, f"not cluster facts ({exc}); run make up first") from None


def render_spec_file(job_file: str, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The manifests of every spec in `job_file`; a note on stderr for each that runs without the launcher."""
    _check_yaml_nesting(job_file)
    specs = load_job_file(job_file)
    manifests: list[dict[str, Any]] = []
    lines: list[str] = []
    for index, spec in enumerate(specs):
        try:
            rendered = render_job(spec, facts)
        except JobSpecError as exc:
            where = f"jobs[{index}].{exc.path}" if len(specs) > 1 else exc.path
            raise JobSpecError(f"{job_file}: {where}", exc.reason) from None
        lines += goodput_lines(spec, facts, rendered[0])
        manifests += rendered
    for note in launcher_notes(manifests, facts.label_prefix):
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(lines), file=sys.stderr)
    return manifests


def goodput_lines(spec: Any, facts: ClusterFacts, run: dict[str, Any]) -> list[str]:
    """The spec's predicted goodput (workloads/jobspec/goodput.py) and, when its checkpoint interval is far from the
    optimum, a note: what `render` and `submit` print on stderr, whatever the controller kind. The prediction also
    goes on the run (`run`, the controller object) as an annotation, for `submit status` to print beside the
    measured goodput; added after the name is hashed, so it changes no Job name."""
    prediction, where = annotate_prediction(run, spec, facts)
    if prediction is None:
        return [f"predicted goodput: {spec.name}: not predicted: {where}"]
    note = far_note(spec.name, prediction)
    return [f"predicted goodput: {prediction_line(spec.name, prediction, where)}",
            *([f"note: {note}"] if note else [])]


def render_pack(args: argparse.Namespace, facts: ClusterFacts) -> list[dict[str, Any]]:
    from workloads.jobspec.packjob import PackJobSpec, render_pack_job

    image = args.image
    if image is None:
        if args.image_tag is None or facts.image_repository is None:
            raise UsageError("--image", "give --image, or --image-tag on a stack with its own registry")
        image = f"{facts.image_repository}:{args.image_tag}"
    spec = PackJobSpec(name=args.name, source=args.source, dest=args.dest, slices=args.slices, image=image,
                       layout=args.layout, image_size=args.size, shard_size=args.shard_size,
                       cpu_millicores=args.cpu * 1000, memory=args.memory, queue=args.queue,
                       fields=args.fields, map_hook=args.map_hook, image_columns=tuple(args.image_column),
                       images=args.images, shard_rows=args.shard_rows)
    return render_pack_job(spec, facts)
