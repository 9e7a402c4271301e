"""A tiny causal language model on token sequences (python -m workloads.data pack-tokens ...).

    python -m workloads.data pack-tokens ~/corpus-npy /data/corpus --seq-len 257 --dtype uint16 --eos 0
    python examples/train_tiny_lm.py --data /data/corpus --vocab-size 50304 --epochs 1
    # through the staging cache, as every PackedData: --remote s3://bucket/corpus --budget 20GiB

pack-tokens stores fixed-length sequences, so each batch is {"tokens": (N, seq_len)} with nothing to collate or pad:
the model reads tokens[:, :-1] and predicts tokens[:, 1:] (pack with seq_len = context + 1). uint16 ids arrive
widened to int32 (same values), ready for the embedding. The model is a CPU-sized stand-in for yours: a 2-layer
pre-norm Transformer with a causal mask and tied input/output embeddings. One JSON line per epoch on stdout:
sequences, tokens and mean next-token loss; resume works as in examples/train_plain.py (data.state_dict()).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from workloads.cli import parse_size
from workloads.data.api import LoaderSettings, PackedData, StepReport, StopSignal


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, context: int, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (N, T, vocab) of the next token at every position, each seeing only the ones before it."""
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        hidden = self.embed(tokens) + self.position(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.blocks(hidden, mask=mask, is_causal=True)
        return self.norm(hidden) @ self.embed.weight.T * self.embed.embedding_dim ** -0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("DATA_DIR"), help="records dataset with a fixed-length "
                        "tokens field (default $DATA_DIR)")
    parser.add_argument("--remote", help="s3://bucket/prefix to stage from while training (default: none)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--budget", type=lambda text: parse_size(text, 1 << 20, 1 << 50, ""),
                        help="with --remote: staging cache budget, e.g. 20GiB (default: a whole copy)")
    parser.add_argument("--vocab-size", type=int, required=True, help="larger than every token id")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="Transformer layers (default 2)")
    parser.add_argument("--epochs", type=int, default=1, help="(default 1)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
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
                           budget_bytes=args.budget, fields=["tokens"], seed=args.seed)
    (spec,) = data.dataset.fields  # type: ignore[attr-defined]
    if spec.type != "tokens" or spec.length is None:
        parser.error(f"--data: field tokens is {spec.type} without a fixed length; pack with pack-tokens --seq-len")
    model = TinyLM(args.vocab_size, spec.length - 1, dim=args.dim, layers=args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
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
            started, sequences, loss_sum, batches = time.perf_counter(), 0, 0.0, 0
            for batch in report.timed(data.batches(epoch, last_epoch=epoch == args.epochs - 1), epoch):
                tokens = batch["tokens"].to(device, dtype=torch.int64, non_blocking=True)
                if int(tokens.max()) >= args.vocab_size:
                    raise SystemExit(f"error: --vocab-size: {args.vocab_size}, but the data holds id "
                                     f"{int(tokens.max())}")
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                batches += 1
                sequences += len(tokens)
                value = loss.item()  # float() of a tensor that needs grad warns on stderr
                loss_sum += value
                report.step(step, samples=len(tokens), loss=value)  # the step's figures, for goodput
                stop.check(save)
            print(json.dumps({"epoch": epoch, "sequences": sequences, "tokens": sequences * spec.length,
                              "loss": round(loss_sum / max(1, batches), 4),
                              "seconds": round(time.perf_counter() - started, 2)}), flush=True)
            with report.saving(step):
                save()
    if data.stager_summary:
        print(json.dumps({"stager": data.stager_summary}), flush=True)


if __name__ == "__main__":
    main()
