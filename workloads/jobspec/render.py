"""Spec + ClusterFacts -> the manifests of a run: the pod template (workloads.jobspec.pod) wrapped by the
controller of the spec's kind (workloads.jobspec.kinds), named by the hash of what is rendered. A run is rendered
once: under a stand-in name as long as the hashed one, then renamed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from workloads.cluster_facts import ClusterFacts, TeamFacts
from workloads.jobspec.fields import HASH_LENGTH, JobSpecError
from workloads.jobspec.kinds import controller_for
from workloads.jobspec.pod import build_pod
from workloads.jobspec.spec import TrainingJobSpec
from workloads.jobspec.teamdata import TeamPrefixes, team_prefix_problems


def _render_manifests(spec: TrainingJobSpec, facts: ClusterFacts, run_name: str) -> list[dict[str, Any]]:
    controller = controller_for(spec)
    return controller.wrap(build_pod(spec, facts, run_name, controller.gang_address(run_name, facts.namespace)))


def _digest(manifests: list[dict[str, Any]]) -> str:
    canonical = json.dumps(manifests, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def _stand_in(spec: TrainingJobSpec, facts: ClusterFacts) -> str | None:
    """A run name as long as the hashed one (so every length check sees what the real name gives) that neither the
    spec nor the facts hold, so that each place it stands in the rendered run is a place of the run name; None when
    every candidate occurs there."""
    held = spec.model_dump_json() + repr(facts)
    for letter in "zyxwvutsrqponmlkjihg":  # never a hex digit: a hashed name is never a stand-in
        candidate = f"{spec.name}-{letter * HASH_LENGTH}"
        if candidate not in held:
            return candidate
    return None


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {_renamed(key, old, new): _renamed(item, old, new) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_renamed(item, old, new) for item in value)
    return value


def _named_run(spec: TrainingJobSpec, facts: ClusterFacts) -> tuple[str, list[dict[str, Any]]]:
    """The run's hashed name and its manifests, rendered once: under a stand-in name, which is then read as
    `spec.name` for the hash (what a render named `spec.name` gives) and replaced by the hashed name."""
    stand_in = _stand_in(spec, facts)
    if stand_in is None:  # the spec or the facts hold every stand-in: render under the plain name, then the real one
        name = f"{spec.name}-{_digest(_render_manifests(spec, facts, spec.name))}"
        return name, _render_manifests(spec, facts, name)
    manifests = _render_manifests(spec, facts, stand_in)
    name = f"{spec.name}-{_digest(_renamed(manifests, stand_in, spec.name))}"
    return name, _renamed(manifests, stand_in, name)


def spec_hash(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    """A short hash of everything rendered for the spec (under its plain name): any change to the Job's content
    changes the name."""
    return job_name(spec, facts).rpartition("-")[2]


def job_name(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    return _named_run(spec, facts)[0]


def team_facts(team: str | None, facts: ClusterFacts) -> ClusterFacts:
    """The facts a Job of `team` renders against: the team's namespace, its LocalQueue and its claims only (the
    stack's claims live in the training namespace; a pod cannot mount a claim of another namespace)."""
    if team is None:
        return facts
    if facts.teams is None:
        raise JobSpecError("team", f"{team}: these cluster facts name no teams (read the stack's jobFacts again)")
    if team not in facts.teams:
        raise JobSpecError("team", f"{team} is not a team with a namespace (teams with one: "
                                   f"{', '.join(sorted(facts.teams)) or 'none'})")
    own = facts.teams[team]
    return replace(facts, namespace=own.namespace, local_queue=team if facts.kueue else None,
                   volume_claims=own.volume_claims, teams={team: own})


def _prefixes(team: TeamFacts) -> TeamPrefixes | None:
    if team.datasets is None or team.checkpoints is None:
        return None
    return TeamPrefixes(reads=team.datasets, writes=team.checkpoints)


def render_job(
    spec: TrainingJobSpec, facts: ClusterFacts, *, suspended_by_default: bool = False
) -> list[dict[str, Any]]:
    """The controller object of the spec's kind (first) and its companions (for a multi-node Indexed Job: the
    headless Service and NetworkPolicy); a spec of a `team` in that team's namespace.

    `suspended_by_default` decides `spec.suspend` where the spec leaves it unset. Raises JobSpecError (field path),
    among others for a dataset or checkpoint outside what the spec's team may use (workloads.jobspec.teamdata).
    """
    own = team_facts(spec.team, facts)
    problems = team_prefix_problems(spec, {name: _prefixes(team) for name, team in (facts.teams or {}).items()},
                                    facts.buckets)
    if problems:
        raise JobSpecError(*problems[0])
    facts = own
    if spec.suspend is None:
        spec = spec.model_copy(update={"suspend": suspended_by_default})
    return _named_run(spec, facts)[1]
