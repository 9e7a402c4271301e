"""A tiny CLIP-style contrastive loop on image + caption records (python -m workloads.data pack-captions ...).

    python -m workloads.data pack-captions ~/pairs/pairs.jsonl /data/pairs
    python examples/train_clip.py --data /data/pairs --epochs 3
    # through the staging cache, as every PackedData: --remote s3://bucket/pairs --budget 2GiB

The data API hands each batch over as {"image": uint8 (N, S, S, 3), "caption": [str]}: the images are decoded in
the DataLoader workers (and kept by the decode cache with --decode-cache), the captions are tokenized here, in the
step: this is the "your own collate" of docs/data-tools.md. The models are CPU-sized stand-ins for yours (a small
CNN, a byte-level bag of embeddings); the loss is CLIP's symmetric InfoNCE with a learned temperature. One JSON line
per epoch on stdout: samples, mean loss, and image-to-caption top-1 accuracy within the batches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
from torch import nn

from workloads.cli import parse_size
from workloads.data.api import LoaderSettings, PackedData, StepReport, StopSignal, random_resized_crop_flip_normalize

CAPTION_BYTES = 64  # a caption is read as its first 64 UTF-8 bytes (byte-level: no tokenizer to install)


def tokenize(captions: list[str], length: int = CAPTION_BYTES) -> torch.Tensor:
    """Captions -> int64 (N, length) of byte values + 1, 0-padded (0 is padding, ignored by the text model)."""
    out = torch.zeros(len(captions), length, dtype=torch.int64)
    for row, caption in enumerate(captions):
        encoded = caption.encode("utf-8")[:length]
        out[row, : len(encoded)] = torch.tensor(list(encoded), dtype=torch.int64) + 1
    return out


class ImageEncoder(nn.Module):
    def __init__(self, dim: int, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


class TextEncoder(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(257, dim, mode="mean", padding_idx=0)
        self.proj = nn.Linear(dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(tokens))


class Clip(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.image = ImageEncoder(dim)
        self.text = TextEncoder(dim)
        self.log_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))  # CLIP's initial temperature

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (N, N): image i against caption j."""
        image = nn.functional.normalize(self.image(images), dim=-1)
        text = nn.functional.normalize(self.text(tokens), dim=-1)
        return self.log_scale.exp().clamp(max=100) * image @ text.T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("DATA_DIR"), help="records dataset with image and caption "
                        "fields (default $DATA_DIR)")
    parser.add_argument("--remote", help="s3://bucket/prefix to stage from while training (default: none)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--budget", type=lambda text: parse_size(text, 1 << 20, 1 << 50, ""),
                        help="with --remote: staging cache budget, e.g. 2GiB (default: a whole copy)")
    parser.add_argument("--decode-cache", help="directory to keep decoded images in (default: none)")
    parser.add_argument("--epochs", type=int, default=1, help="(default 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default 32)")
    parser.add_argument("--image-size", type=int, default=64, help="decode size (default 64)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--lr", type=float, default=3e-3, help="(default 3e-3)")
    parser.add_argument("--seed", type=int, default=0, help="(default 0)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR"),
                        help="(default $CHECKPOINT_DIR; none: no checkpoints)")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data: required (or set DATA_DIR)")
    stop = StopSignal()  # SIGTERM/SIGINT: stop after the step in flight, checkpoint, exit 43 (not counted)

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = PackedData.open(args.data, batch_size=args.batch_size, remote=args.remote, endpoint_url=args.endpoint_url,
                           budget_bytes=args.budget, image_size=args.image_size, fields=["image", "caption"],
                           seed=args.seed, min_rank_batch=2, decode_cache=args.decode_cache,
                           decode_cache_bytes=4 << 30 if args.decode_cache else None)
    model = Clip().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator(device=device)
    checkpoint = Path(args.checkpoint_dir) / "checkpoint.pt" if args.checkpoint_dir else None
    step = 0
    if checkpoint is not None and checkpoint.exists():  # resume: weights, optimizer, data position
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data.load_state_dict(saved["data"])
        step = saved["step"]

    def save() -> None:
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            temp = checkpoint.with_name(f".{checkpoint.name}.tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "data": data.state_dict(), "step": step}, temp)
            os.replace(temp, checkpoint)  # atomically: a stop mid-write leaves the last checkpoint whole

    data.loader(LoaderSettings(workers=args.workers))
    report = StepReport()  # each step's time, data wait and checkpoint stall: measured goodput (docs/monitoring.md)
    with stop, data:
        for epoch in range(data.start_epoch, args.epochs):
            started, samples, loss_sum, correct, batches = time.perf_counter(), 0, 0.0, 0, 0
            for batch in report.timed(data.batches(epoch, last_epoch=epoch == args.epochs - 1), epoch):
                images = batch["image"].to(device, non_blocking=True)
                tokens = tokenize(batch["caption"]).to(device)
                generator.manual_seed(args.seed * 1_000_003 + step)
                inputs = random_resized_crop_flip_normalize(images, args.image_size, scale=(0.6, 1.0),
                                                            generator=generator)
                logits = model(inputs, tokens)
                targets = torch.arange(len(logits), device=device)
                loss = (nn.functional.cross_entropy(logits, targets)
                        + nn.functional.cross_entropy(logits.T, targets)) / 2
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                batches += 1
                samples += len(targets)
                value = loss.item()  # float() of a tensor that needs grad warns on stderr
                loss_sum += value
                correct += int((logits.argmax(dim=1) == targets).sum())
                report.step(step, samples=len(targets), loss=value)  # the step's figures, for goodput
                stop.check(save)
            print(json.dumps({"epoch": epoch, "samples": samples, "loss": round(loss_sum / max(1, batches), 4),
                              "top1": round(correct / max(1, samples), 4),
                              "seconds": round(time.perf_counter() - started, 2)}), flush=True)
            with report.saving(step):
                save()
    if data.stager_summary:
        print(json.dumps({"stager": data.stager_summary}), flush=True)


if __name__ == "__main__":
    main()
