"""Your own training loop on ml-cluster's data path: plain PyTorch, nothing of the bundled trainer.

    # a packed dataset on local disk (python -m workloads.data pack IMAGES OUT), or a staged copy
    python examples/train_plain.py --data /data/my-set --epochs 2
    # through the staging cache: fetch from S3 while training, at most --budget bytes of shards on disk at once
    python examples/train_plain.py --data /tmp/my-set --remote s3://my-bucket/my-set --budget 2GiB
    # in a Job (examples/plain-pytorch-job.yaml): --data defaults to $DATA_DIR, checkpoints to $CHECKPOINT_DIR;
    # with `staging: cache` the pod's stager sidecar fills $DATA_DIR and this script tells it what comes next.
    # Several GPUs or nodes: torchrun --nproc-per-node 8 examples/train_plain.py ...

One JSON line per epoch on stdout, and rank 0's step events (StepReport: each step's time, its wait for data, each
checkpoint's stall, as the bundled trainer reports them; with $METRICS_PORT the same as Prometheus metrics).
A checkpoint (model, optimizer, data position) is written atomically at each epoch's end and every --checkpoint-every
steps; a rerun with the same --checkpoint-dir resumes sample-exact.
SIGTERM (a drain, a Spot reclaim) stops every rank after the same step, writes a last checkpoint and exits 43, which
the Jobs retry without counting (StopSignal, docs/own-training-code.md "Surviving disruptions").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workloads.cli import parse_size
from workloads.data.api import (
    LoaderSettings,
    PackedData,
    StepReport,
    StopSignal,
    random_resized_crop_flip_normalize,
)


def small_cnn(num_classes: int, width: int = 32) -> nn.Module:
    """Stands in for your model."""
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))
    return nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, num_classes))


def save_atomically(state: dict, path: Path) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "wb") as out:
        torch.save(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("DATA_DIR"), help="packed dataset directory (default "
                        "$DATA_DIR)")
    parser.add_argument("--remote", help="s3://bucket/prefix to stage from while training (default: none)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--budget", type=lambda text: parse_size(text, 1 << 20, 1 << 50, ""),
                        help="with --remote: staging cache budget, e.g. 2GiB (default: a whole copy)")
    parser.add_argument("--epochs", type=int, default=1, help="(default 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--shuffle-shards", type=int, default=4,
                        help="shards shuffled together; their bytes must fit --budget at once (default 4)")
    parser.add_argument("--crop-size", type=int, default=None, help="(default: the stored image size)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="encoded (JPEG) packs: decode to this size (default: the pack's own size)")
    workers = min(4, os.cpu_count() or 1)  # more than the machine's CPUs: torch warns on stderr and gains nothing
    parser.add_argument("--workers", type=int, default=workers, help=f"DataLoader workers (default {workers})")
    parser.add_argument("--lr", type=float, default=0.05, help="(default 0.05)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR"),
                        help="(default $CHECKPOINT_DIR; none: no checkpoints)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps (default 0: epoch ends only)")
    parser.add_argument("--seed", type=int, default=0, help="weights and sample order (default 0)")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data: required (or set DATA_DIR)")
    stop = StopSignal()  # SIGTERM/SIGINT: stop after a step every rank agrees on, checkpoint, exit 43

    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else \
        torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank = dist.get_rank() if distributed else 0

    # min_rank_batch=2: BatchNorm cannot train on a tail batch of one sample.
    data = PackedData.open(args.data, batch_size=args.batch_size, remote=args.remote,
                           endpoint_url=args.endpoint_url, budget_bytes=args.budget, shuffle_shards=args.shuffle_shards,
                           min_rank_batch=2, seed=args.seed, image_size=args.image_size)
    crop = args.crop_size or data.image_size
    torch.manual_seed(args.seed)
    model: nn.Module = small_cnn(data.num_classes).to(device, memory_format=torch.channels_last)
    core = model
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    checkpoint = Path(args.checkpoint_dir) / "checkpoint.pt" if args.checkpoint_dir else None
    step = 0
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        core.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data.load_state_dict(saved["data"])  # the epoch and the batch to continue from, any world size
        step = saved["step"]

    def save(step: int) -> None:
        if checkpoint is not None and rank == 0:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            save_atomically({"model": core.state_dict(), "optimizer": optimizer.state_dict(),
                             "data": data.state_dict(), "step": step}, checkpoint)

    loader_settings = LoaderSettings(workers=args.workers)
    data.loader(loader_settings)
    generator = torch.Generator(device=device)
    report = StepReport()  # each step's time, data wait and checkpoint stall: measured goodput (docs/monitoring.md)
    with stop, data:  # leaving on a lost peer's error: exit 43, one line
        for epoch in range(data.start_epoch, args.epochs):
            started, samples, loss_sum = time.perf_counter(), 0, 0.0
            model.train()
            for images, labels in report.timed(data.batches(epoch, last_epoch=epoch == args.epochs - 1), epoch):
                images = images.to(device, non_blocking=True)  # uint8 NHWC: a quarter of float32's bytes
                labels = labels.to(device, non_blocking=True)
                generator.manual_seed(hash((epoch, step, rank)) & 0xFFFF_FFFF)
                inputs = random_resized_crop_flip_normalize(images, crop, generator=generator, channels_last=True)
                loss = nn.functional.cross_entropy(model(inputs), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                samples += len(labels)
                loss_sum += loss.item() * len(labels)
                report.step(step, samples=len(labels), loss=loss.item())  # the step's figures, for goodput
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    with report.saving(step):
                        save(step)
                stop.check(partial(save, step))  # every rank, every step: stop here if any rank got SIGTERM
            if not (args.checkpoint_every and step % args.checkpoint_every == 0):  # else saved at this step already
                with report.saving(step):
                    save(step)
            elapsed = time.perf_counter() - started
            if rank == 0:
                print(json.dumps({"epoch": epoch, "samples": samples, "loss": round(loss_sum / max(samples, 1), 4),
                                  "samples_per_s": round(samples / elapsed, 1), "steps": step}), flush=True)
    if rank == 0 and data.stager_summary:
        print(json.dumps({"stager": data.stager_summary}), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
