"""One rank's batches, epoch by epoch: the loop PackedData (api.py) and MixedData (mixed.py) both run.

The sampler is set to the epoch (or kept at the position load_state_dict restored), the staging cache's feeder is
told the epoch starts and, before each batch, how many batches' steps are done (shards whose last use is over may
go), a dataset error raised in a DataLoader worker comes out as the one-line error the main process would raise, and
the batches handed out are counted for state_dict. The DataLoader is made once from LoaderSettings (shared memory
planned against /dev/shm when the transport is "auto").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Self

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workloads.data.moving.cache import CacheFeeder
from workloads.data.reading.batches import DatasetError, DataUnavailableError
from workloads.data.reading.dataset import make_loader
from workloads.data.stager_process import StagerProcess, stop_stager

_WORKER_TRACEBACK = "Original Traceback (most recent call last):"
_UNAVAILABLE = ("DataUnavailableError", "CacheStagerError", "TimeoutError")
_DATASET = ("DatasetError", "DataToolError", "ValueError", "CacheTooSmall", "StateFileError")


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings that make the packed path fast.

    workers: reading processes (HDF5 handles open lazily in each; decoding, for the encoded layout, happens there).
    prefetch_factor: batches each worker keeps ready. persistent_workers: keep workers (and their open shards)
    across epochs. pin_memory: None pins when CUDA is available. transport: "shm" (workers write batches straight
    into shared memory), "pipe" (numpy through the worker's pipe: no /dev/shm needed) or "auto" (shm when /dev/shm
    holds batch x (workers x prefetch + 1) x 1.5, else pipe with a warning: the container default of 64 MiB would
    otherwise fail with a bus error or "unable to allocate shared memory").
    """

    workers: int = 4
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool | None = None
    multiprocessing_context: str | None = None
    transport: Literal["auto", "shm", "pipe"] = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers: must be an integer >= 0, got {self.workers!r}")
        if not isinstance(self.prefetch_factor, int) or self.prefetch_factor <= 0:
            raise ValueError(f"prefetch_factor: must be a positive integer, got {self.prefetch_factor!r}")
        if self.transport not in ("auto", "shm", "pipe"):
            raise ValueError(f"transport: must be auto, shm or pipe, got {self.transport!r}")


def iter_batches(loader: Any) -> Iterator[Any]:
    """Iterate a loader; a dataset error raised in a DataLoader worker (whose message is the worker's traceback)
    comes out as the one-line error the main process would raise: DataUnavailableError for data not there now,
    DatasetError otherwise."""
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            text = str(exc)
            if _WORKER_TRACEBACK not in text:
                raise
            name, sep, message = [line for line in text.splitlines() if line.strip()][-1].partition(": ")
            name = name.rsplit(".", 1)[-1]
            if not sep or name not in _UNAVAILABLE + _DATASET:
                raise
            if name in _UNAVAILABLE:
                raise DataUnavailableError(message) from None
            raise DatasetError(message) from None
        yield batch


def settled_loader(dataset: Dataset[Any], sampler: Sampler[Any], settings: LoaderSettings, sample_bytes: int,
                   warn: bool) -> DataLoader[Any]:
    """The DataLoader over `sampler`'s batches of `dataset` (transport "auto": shared memory when /dev/shm holds
    the batches in flight, else the pipe, with a warning on stderr when `warn`)."""
    transport = settings.transport
    if transport == "auto":
        from workloads.data.reading.shm import plan_shared_memory, shm_available_bytes

        batch_bytes = getattr(sampler, "batch_size", 1) * sample_bytes
        plan = plan_shared_memory(batch_bytes, settings.workers, settings.prefetch_factor, shm_available_bytes())
        if plan.transport == "pipe" and warn:
            print(f"warning: {plan.message}", file=sys.stderr)
        transport = plan.transport
    pin = torch.cuda.is_available() if settings.pin_memory is None else settings.pin_memory
    return make_loader(dataset, sampler, workers=settings.workers, prefetch_factor=settings.prefetch_factor,
                       multiprocessing_context=settings.multiprocessing_context,
                       persistent_workers=settings.persistent_workers, pin_memory=pin, transport=transport)


class EpochBatches:
    """The batch loop and the end of PackedData and MixedData (dataclasses that declare the fields used here)."""

    sampler: Any
    feeder: CacheFeeder | None
    dataset: Any
    stager_summary: str | None
    _stager: StagerProcess | None
    _done: int
    _total: int
    _positioned: bool
    _closed: bool

    def loader(self) -> DataLoader[Any]:
        raise NotImplementedError

    def _epoch(self, epoch: int, last_epoch: bool, convert: Callable[[Any], Any]) -> Iterator[Any]:
        """This rank's batches of `epoch`, each through `convert` (from the saved position after
        load_state_dict)."""
        if self._closed:
            raise ValueError(f"batches: this {type(self).__name__} is closed")
        if not (self._positioned and epoch == self.sampler.epoch):
            self.sampler.set_epoch(epoch)
        self._positioned = False
        self._done = 0
        self._total = len(self.sampler)
        if self.feeder is not None:
            self.feeder.start_epoch(last_epoch=last_epoch)
        iterator = iter_batches(self.loader())
        while True:
            if self.feeder is not None:
                # Back here, the step of the batch handed out last is done: shards it was the last use of may go.
                self.feeder.advance(self._done)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._done += 1
            yield convert(batch)

    def close(self, timeout_s: float = 60.0) -> None:
        """Tell the stager nothing more will be read, and wait for the one this object started (it exits once the
        plan is done; after `timeout_s` it is stopped); then close the dataset."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.feeder is not None:
                self.feeder.finish()
        finally:
            if self._stager is not None:
                self.stager_summary = stop_stager(self._stager, timeout_s)
            self.dataset.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
