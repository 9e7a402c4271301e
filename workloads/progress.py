"""A run's progress from its pods' /metrics pages (what `submit status|watch` shows): pure functions, no cluster.

`snapshot` folds the pages of every rank and the stager into one Snapshot; `progress` turns one snapshot (lifetime
averages) or two (rates over the interval between them, what `watch` shows) into figures; `progress_line` prints
them. Ranks step in lockstep, so position and ETA come from the slowest rank and samples/s is their sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


class MetricsParseError(ValueError):
    """A page that is not Prometheus text exposition."""


def parse_metrics(text: str) -> dict[str, float]:
    """{sample name: value} of one page, label sets summed (every series here is per process; the GPU ones per
    device, which a progress line does not split); NaN and infinite samples are left out."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket") or not math.isfinite(sample.value):
                    continue  # a NaN or infinite sample is no progress figure (and no int to print)
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise MetricsParseError(f"not Prometheus text exposition: {exc}") from None
    return values


@dataclass(frozen=True)
class Snapshot:
    at: float  # seconds, the caller's clock (time.time())
    ranks: int = 0
    samples: float = 0.0
    steps: float = 0.0  # the slowest rank's
    wait_seconds: float = 0.0
    step_seconds: float = 0.0
    checkpoint_seconds: float = 0.0  # blocked in checkpoint saves, summed over ranks
    epoch: float = 0.0
    epochs: float = 0.0
    batches_done: float = 0.0
    batches_per_epoch: float = 0.0
    start_time: float | None = None
    done: bool = False
    stage_shards_ready: float | None = None
    stage_shards: float | None = None
    stage_bytes: float = 0.0
    stage_done: bool = False
    pack_images: float | None = None  # inputs the pack slices have been through (skipped ones too)
    pack_shards_done: float = 0.0
    pack_shards: float = 0.0
    slices: str | None = None  # "3/4 slices done": an Indexed pack Job's status, not a metric


def snapshot(pages: Iterable[dict[str, float]], at: float) -> Snapshot:
    """Fold parsed pages (trainer ranks and stagers, in any order) into one Snapshot."""
    trainers = [page for page in pages if "ml_train_steps_total" in page or "ml_stage_shards" in page]
    ranks = [p for p in trainers if "ml_train_steps_total" in p]
    stagers = [p for p in trainers if "ml_stage_shards" in p]
    fields: dict[str, object] = {"at": at, "ranks": len(ranks)}
    if ranks:
        # The slowest rank's position: the run is as far as its last rank.
        slowest = min(ranks, key=lambda p: (p.get("ml_train_epoch", 0.0), p.get("ml_train_epoch_batches_done", 0.0)))
        fields.update(
            samples=sum(p.get("ml_train_samples_total", 0.0) for p in ranks),
            steps=min(p.get("ml_train_steps_total", 0.0) for p in ranks),
            wait_seconds=sum(p.get("ml_train_data_wait_seconds_sum", 0.0) for p in ranks),
            step_seconds=sum(p.get("ml_train_step_seconds_sum", 0.0) for p in ranks),
            checkpoint_seconds=sum(p.get("ml_train_checkpoint_stall_seconds_total", 0.0) for p in ranks),
            epoch=slowest.get("ml_train_epoch", 0.0),
            epochs=max(p.get("ml_train_epochs", 0.0) for p in ranks),
            batches_done=slowest.get("ml_train_epoch_batches_done", 0.0),
            batches_per_epoch=max(p.get("ml_train_epoch_batches", 0.0) for p in ranks),
            start_time=min((p["ml_train_start_time_seconds"] for p in ranks if p.get("ml_train_start_time_seconds")),
                           default=None),
            done=all(p.get("ml_train_done", 0.0) == 1 for p in ranks),
        )
    if stagers:
        fields.update(
            stage_shards_ready=sum(p.get("ml_stage_shards_ready", 0.0) for p in stagers),
            stage_shards=sum(p.get("ml_stage_shards", 0.0) for p in stagers),
            stage_bytes=sum(p.get("ml_stage_bytes_total", 0.0) for p in stagers),
            stage_done=all(p.get("ml_stage_done", 0.0) == 1 for p in stagers),
        )
    packers = [page for page in pages if "ml_pack_images_total" in page]
    if packers:
        fields.update(
            pack_images=sum(p["ml_pack_images_total"] for p in packers),
            pack_shards_done=sum(p.get("ml_pack_shards_done", 0.0) for p in packers),
            pack_shards=sum(p.get("ml_pack_shards", 0.0) for p in packers),
        )
    return Snapshot(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Progress:
    fraction: float | None  # of all epochs, 0..1
    epoch: int  # 1-based, for people
    epochs: int
    batch: int
    batches: int
    samples_per_s: float | None
    data_wait_share: float | None
    eta_s: float | None
    staged: str | None  # "12/40 shards"
    images_per_s: float | None = None  # a pack's inputs per second, all slices together
    packed: str | None = None  # "12/40 shards" the running slices own
    slices: str | None = None


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def progress(now: Snapshot, before: Snapshot | None = None) -> Progress:
    """Figures of `now`; with `before`, rates over the interval between the two (a counter reset, i.e. a restarted
    pod, falls back to lifetime figures), else lifetime averages since the run started."""
    interval = before is not None and now.at > before.at and now.samples >= before.samples and now.ranks > 0 \
        and before.ranks == now.ranks
    if interval and before is not None:
        elapsed = now.at - before.at
        samples, steps = now.samples - before.samples, now.steps - before.steps
        wait, step = now.wait_seconds - before.wait_seconds, now.step_seconds - before.step_seconds
    else:
        elapsed = now.at - now.start_time if now.start_time else 0.0
        samples, steps, wait, step = now.samples, now.steps, now.wait_seconds, now.step_seconds
    total = now.epochs * now.batches_per_epoch
    position = now.epoch * now.batches_per_epoch + now.batches_done
    fraction = min(1.0, position / total) if total > 0 else None
    step_rate = _ratio(steps, elapsed)
    eta = None
    if now.done:
        eta = 0.0
    elif step_rate and total > 0:
        eta = max(0.0, total - position) / step_rate
    images_per_s, packed = None, None
    if now.pack_images is not None:
        if before is not None and before.pack_images is not None and now.at > before.at \
                and now.pack_images >= before.pack_images:
            images_per_s = (now.pack_images - before.pack_images) / (now.at - before.at)
        packed = f"{int(now.pack_shards_done)}/{int(now.pack_shards)} shards"
    staged = None
    if now.stage_shards is not None:
        staged = f"{int(now.stage_shards_ready or 0)}/{int(now.stage_shards)} shards"
    return Progress(
        fraction=fraction,
        epoch=min(int(now.epoch) + 1, int(now.epochs)) if now.epochs else 0,
        epochs=int(now.epochs),
        batch=int(now.batches_done),
        batches=int(now.batches_per_epoch),
        samples_per_s=_ratio(samples, elapsed),
        data_wait_share=_ratio(wait, step),
        eta_s=eta,
        staged=staged,
        images_per_s=images_per_s,
        packed=packed,
        slices=now.slices,
    )


def _duration(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_line(name: str, phase: str, figures: Progress | None) -> str:
    """`NAME  PHASE  epoch 2/10 batch 120/500 (27%)  1234 samples/s  data-wait 12%  ETA 1h02m  staged 40/40 shards`"""
    parts = [name, phase]
    if figures is not None:
        if figures.epochs:
            share = f" ({figures.fraction:.0%})" if figures.fraction is not None else ""
            parts.append(f"epoch {figures.epoch}/{figures.epochs} batch {figures.batch}/{figures.batches}{share}")
        if figures.samples_per_s is not None:
            parts.append(f"{figures.samples_per_s:.0f} samples/s")
        if figures.data_wait_share is not None:
            parts.append(f"data-wait {figures.data_wait_share:.0%}")
        if figures.eta_s is not None:
            parts.append(f"ETA {_duration(figures.eta_s)}")
        if figures.staged is not None:
            parts.append(f"staged {figures.staged}")
        if figures.slices is not None:
            parts.append(figures.slices)
        if figures.images_per_s is not None:
            parts.append(f"{figures.images_per_s:.0f} images/s")
        if figures.packed is not None:
            parts.append(f"packed {figures.packed} of the running slices")
    return "  ".join(parts)
