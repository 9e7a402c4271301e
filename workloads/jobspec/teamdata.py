"""Which bucket prefixes a Job may name: a tenant team's Job only its own team's, a Job of no team no team's.

One rule for both places a Job is checked: the stack file (infra's stack check passes the stack's teams) and
`submit render`/`submit` (the cluster facts carry each tenant team's prefixes, ClusterFacts.teams). Prefixes are
`<logical bucket>/<key prefix>` strings, as a spec names them (`bucket: datasets`, `prefix: vision/imagenet/`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workloads.jobspec.spec import TrainingJobSpec


@dataclass(frozen=True)
class TeamPrefixes:
    """A team's prefixes, each `<logical bucket>/<key prefix>` (the key prefix ends in '/')."""

    reads: tuple[str, ...]  # datasets: read only
    writes: tuple[str, ...]  # checkpoints: read and write

    @property
    def owned(self) -> tuple[str, ...]:
        return (*self.reads, *self.writes)


def _named_data(spec: TrainingJobSpec) -> list[tuple[str, str | None, str, str | None, bool]]:
    """(field path, logical bucket, prefix, uri, written) of every place the spec reads or writes: its dataset, each
    source of its dataset's mixture, its checkpoint."""
    named: list[tuple[str, str | None, str, str | None, bool]] = []
    if spec.dataset is not None:
        if spec.dataset.mixture:
            named += [(f"dataset.mixture[{index}]", source.bucket, source.prefix, source.uri, False)
                      for index, source in enumerate(spec.dataset.mixture)]
        else:
            named.append(("dataset", spec.dataset.bucket, spec.dataset.prefix, spec.dataset.uri, False))
    if spec.checkpoint is not None:
        named.append(("checkpoint", spec.checkpoint.bucket, spec.checkpoint.prefix, spec.checkpoint.uri, True))
    return named


def _owners(key: str, teams: Mapping[str, TeamPrefixes | None], but: str | None) -> list[str]:
    """The teams other than `but` whose prefixes hold `key` (`<logical bucket>/<key prefix>`) or lie under it."""
    return sorted({name for name, prefixes in teams.items() if prefixes is not None and name != but
                   for owned in prefixes.owned if key.startswith(owned) or owned.startswith(key)})


def _uri_problem(uri: str, teams: Mapping[str, TeamPrefixes | None], buckets: Mapping[str, str]) -> str | None:
    """Why a Job of no team may not name `uri` (s3://<physical bucket>/<key>): it lies in (or holds) a team's
    prefix of one of the stack's buckets. None where it does not, or names a bucket that is not the stack's."""
    physical, _, key = uri.removeprefix("s3://").partition("/")
    for logical in sorted(name for name, bucket in buckets.items() if bucket == physical):
        foreign = _owners(f"{logical}/{key}", teams, None)
        if foreign:
            return (f"{uri} is team {', '.join(foreign)}'s data (bucket {logical}): a Job of no team names no "
                    "team's prefix")
    return None


def team_prefix_problems(spec: TrainingJobSpec, teams: Mapping[str, TeamPrefixes | None],
                         buckets: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(field path in the spec, why) for each dataset, mixture source or checkpoint of `spec` outside what its team
    may use.

    `teams` maps every team whose prefixes are known to them (None: not known, e.g. facts published before the
    prefixes were; that team's own-prefix check is skipped). A Job of a team may read only under the team's
    datasets and checkpoints and write only under its checkpoints, naming them by bucket and prefix (not by uri);
    any Job naming another team's prefix (or a prefix holding one) is refused, a Job of no team also by uri: its
    bucket is resolved through `buckets` (logical name -> physical name, ClusterFacts.buckets; None: not known, a
    uri is not checked), since the shared Jobs role reads the whole of every bucket a Job names by uri."""
    job_team = spec.team
    mine = teams.get(job_team) if job_team is not None else None
    problems: list[tuple[str, str]] = []
    for field_name, bucket, prefix, uri, writes in _named_data(spec):
        if bucket is None:
            if uri is not None and job_team is not None:
                problems.append((f"{field_name}.uri", f"team {job_team}'s Jobs name their data by bucket and prefix "
                                                      "(one of the team's own), not by uri"))
            elif uri is not None and buckets is not None:
                why = _uri_problem(uri, teams, buckets)
                problems += [(f"{field_name}.uri", why)] if why is not None else []
            continue
        key = f"{bucket}/{prefix}"
        foreign = _owners(key, teams, job_team)
        if foreign:
            problems.append((f"{field_name}.prefix", f"{key} is team {', '.join(foreign)}'s data"
                                                     + ("" if job_team is None else f", not team {job_team}'s")))
            continue
        if job_team is not None and mine is not None:
            allowed: Sequence[str] = mine.writes if writes else mine.owned
            if not any(key.startswith(owned) for owned in allowed):
                problems.append((f"{field_name}.prefix",
                                 f"team {job_team} may {'write' if writes else 'read'} only under its own prefixes "
                                 f"({', '.join(allowed) or 'none'}), not {key}"))
    return problems
