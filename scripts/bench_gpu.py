"""GPU-busy share: ResNet training steps/s fed by the real loader versus by synthetic batches already on the GPU.

Both runs do the same work per step (per-batch random-resized-crop/flip/normalise on the GPU, forward, backward,
SGD step; bf16 autocast, channels-last), so real / synthetic is the share of the GPU's possible step rate that the
data path sustains (goal >= 0.95). ResNet-50 is the headline; ResNet-18 is where loading is hardest.

    python scripts/bench_gpu.py [--data PACKED_DIR] [--models resnet50,resnet18] [--batch-size 256]
                                [--workers N] [--steps 60] [--warmup 15] [--json]

Without --data it generates ImageNet-like JPEGs and packs them (decoded layout) first. Needs an NVIDIA GPU; on a
machine without one it says so and exits 0 without figures (--allow-cpu runs the code path on the CPU, tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from workloads.data.reading.dataset import HDF5Dataset, make_loader, to_tensors  # noqa: E402
from workloads.data.reading.sampler import ElasticBatchSampler  # noqa: E402
from workloads.data.reading.transforms import random_resized_crop_flip_normalize  # noqa: E402
from workloads.train.models import MODELS  # noqa: E402


def _utilisation(device: torch.device) -> float | None:
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # NVML (nvidia-ml-py) missing
        return None


class Step:
    """One training step on a uint8 NHWC batch already on the device."""

    def __init__(self, model_name: str, num_classes: int, crop: int, device: torch.device, width: int) -> None:
        self.model = MODELS[model_name](num_classes, width).to(device).to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        self.criterion = nn.CrossEntropyLoss()
        self.crop = crop
        self.num_classes = num_classes
        self.device = device
        self.generator = torch.Generator().manual_seed(0)
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        inputs = random_resized_crop_flip_normalize(
            images, self.crop, generator=self.generator, dtype=self.dtype, channels_last=True
        )
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.criterion(self.model(inputs), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_rate(step: Step, batch: int, size: int, steps: int, warmup: int) -> float:
    device = step.device
    images = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=device)
    labels = torch.randint(0, step.num_classes, (batch,), device=device)  # the dataset's classes, as the loader's
    for _ in range(warmup):
        step(images, labels)
    _sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step(images, labels)
    _sync(device)
    return steps * batch / (time.perf_counter() - started)


def loader_rate(step: Step | None, dataset: HDF5Dataset, batch: int, workers: int, steps: int, warmup: int,
                device: torch.device) -> dict:
    """Samples/s the loader feeds `step` at; with step None, the loader alone (its batches copied to the device and
    dropped): the most it can feed. `epoch_starts` counts the epochs begun inside the timed window: each one
    restarts the workers' prefetch, a bubble a longer epoch does not have."""
    sampler = ElasticBatchSampler(getattr(dataset, "shard_sizes", [len(dataset)]), batch, seed=0)
    loader = make_loader(
        dataset, sampler, workers=workers, prefetch_factor=4, persistent_workers=True, pin_memory=device.type == "cuda"
    )
    done, samples, utilisation, started = 0, 0, [], 0.0
    epoch, epoch_starts = 0, 0
    while done < warmup + steps:
        sampler.set_epoch(epoch)
        epoch_starts += done > warmup
        for raw in loader:
            images, labels = to_tensors(raw)
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if step is not None:
                step(images, labels)
            done += 1
            if done == warmup:
                _sync(device)
                started = time.perf_counter()
            elif done > warmup:
                samples += len(labels)
                if device.type == "cuda" and done % 10 == 0:
                    utilisation.append(_utilisation(device))
            if done >= warmup + steps:
                break
        epoch += 1
    _sync(device)
    rate = samples / (time.perf_counter() - started)
    known = [value for value in utilisation if value is not None]
    return {"samples_per_s": rate, "gpu_utilization": sum(known) / len(known) if known else None,
            "epoch_starts": epoch_starts}


def prepare_data(workdir: Path, images: int, size: int) -> Path:
    from bench_loader import generate

    from workloads.data.writing.pack import PackOptions, pack

    generate(workdir / "jpegs", images)
    pack(
        workdir / "jpegs",
        workdir / "packed",
        PackOptions(layout="decoded", image_size=size, progress=False, shard_bytes=256 << 20),
    )
    return workdir / "packed"


def run(args: argparse.Namespace, device: torch.device, data: Path) -> dict[str, Any]:
    dataset = HDF5Dataset(data)
    results = []
    for model_name in args.models.split(","):
        step = Step(model_name, len(dataset.classes), args.crop, device, args.width)
        synthetic = synthetic_rate(step, args.batch_size, dataset.image_size, args.steps, args.warmup)
        real = loader_rate(step, dataset, args.batch_size, args.workers, args.steps, args.warmup, device)
        results.append(
            {
                "model": model_name,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "synthetic_samples_per_s": synthetic,
                "loader_samples_per_s": real["samples_per_s"],
                "gpu_busy_share": real["samples_per_s"] / synthetic,
                "gpu_utilization": real["gpu_utilization"],
                "epoch_starts_in_window": real["epoch_starts"],
            }
        )
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    alone = loader_rate(None, dataset, args.batch_size, args.workers, args.steps, args.warmup, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "results": results,
        "loader_alone_samples_per_s": alone["samples_per_s"],
        "device": name,
        "image_size": dataset.image_size,
        "crop": args.crop,
        "samples": len(dataset),
        "cpus": os.cpu_count(),
        "amp": "bf16",
        "channels_last": True,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="packed dataset (decoded layout is the fast one)")
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--images", type=int, default=4000, help="generated images when --data is not given")
    parser.add_argument("--size", type=int, default=256, help="decoded size of generated data")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [name for name in args.models.split(",") if name not in MODELS]
    if unknown:
        print(f"error: --models: unknown {', '.join(unknown)} (choose from {', '.join(MODELS)})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not args.allow_cpu:
        message = "no CUDA device on this machine: bench_gpu.py measures GPU-busy share and needs an NVIDIA GPU"
        print(json.dumps({"results": [], "skipped": message}) if args.json else f"skipped: {message}")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    if args.data is not None:
        report = run(args, device, args.data)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
            report = run(args, device, prepare_data(Path(tmp), args.images, args.size))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['device']}, {report['cpus']} CPUs, {report['samples']} samples at {report['image_size']}px, "
        f"crop {report['crop']}, bf16, channels-last"
    )
    print(f"{'model':<10}{'synthetic/s':>13}{'loader/s':>11}{'busy share':>12}{'GPU util %':>12}")
    for entry in report["results"]:
        util = "-" if entry["gpu_utilization"] is None else f"{entry['gpu_utilization']:.0f}"
        print(
            f"{entry['model']:<10}{entry['synthetic_samples_per_s']:>13.0f}{entry['loader_samples_per_s']:>11.0f}"
            f"{entry['gpu_busy_share']:>12.3f}{util:>12}"
        )
    print(f"the loader alone (batches copied to the device, no step): {report['loader_alone_samples_per_s']:.0f}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
