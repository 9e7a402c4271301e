"""Small synthetic inputs for trying the tools on a laptop (docs/data-tools.md, "Try it on a laptop").

    .venv/bin/python scripts/sample_data.py OUT [--images 200] [--size 96] [--tokens 200000]

writes OUT/images/class<N>/*.jpg (an image folder as torchvision's ImageFolder, 4 classes), OUT/pairs.jsonl (an
image + caption table whose keys are those images) and OUT/tokens/*.npy (uint16 token ids, 4 documents). Seeded:
the same arguments give the same files. An OUT that already holds files is refused (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

CLASSES = 4


def write_images(folder: Path, count: int, size: int, seed: int = 0) -> list[tuple[str, int]]:
    """`count` JPEGs of `size` px in class folders; returns (path relative to folder's parent, class) per image."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    written = []
    y, x = np.mgrid[0:size, 0:size]
    for index in range(count):
        label = index % CLASSES
        directory = folder / f"class{label}"
        directory.mkdir(parents=True, exist_ok=True)
        phase = rng.uniform(0, 6.3, 3)
        base = np.stack([127 + 100 * np.sin(x / (6 + 3 * label + c) + y / 9 + phase[c]) for c in range(3)], -1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        path = directory / f"img{index:05d}.jpg"
        Image.fromarray(pixels).save(path, format="JPEG", quality=90)
        written.append((f"{folder.name}/{directory.name}/{path.name}", label))
    return written


def write_tokens(folder: Path, tokens: int, seed: int = 0, vocab: int = 512) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for document in range(4):
        ids = rng.integers(1, vocab, size=tokens // 4, dtype=np.uint16)
        np.save(folder / f"doc{document}.npy", ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/sample_data.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", type=int, default=96, help="image side in px")
    parser.add_argument("--tokens", type=int, default=200_000)
    args = parser.parse_args(argv)
    if args.images < CLASSES or args.size < 8 or args.tokens < 4096:
        print(f"error: arguments: at least {CLASSES} images of 8 px and 4096 tokens", file=sys.stderr)
        return 2
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        print(f"error: {args.out}: exists and is not an empty folder", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    images = write_images(args.out / "images", args.images, args.size)
    names = ["stripes", "waves", "ripples", "bands"]
    with open(args.out / "pairs.jsonl", "w") as table:
        for key, label in images:
            table.write(json.dumps({"key": key, "caption": f"a picture of {names[label]} number {label}"}) + "\n")
    write_tokens(args.out / "tokens", args.tokens)
    print(f"{args.out}: {len(images)} images, pairs.jsonl, {args.tokens} tokens in tokens/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
