"""A small Llama-style decoder under FSDP2 with async sharded checkpoints, on packed token sequences.

    python -m workloads.data pack-tokens ~/corpus-npy /data/corpus --seq-len 257 --dtype uint16 --eos 0
    torchrun --nproc-per-node 8 examples/train_fsdp.py --data /data/corpus --vocab-size 50304 \\
        --checkpoint-dir /nvme/ckpt --checkpoint-uri s3://bucket/runs/7/ckpt --checkpoint-every 500
    # the same command on 2 nodes, or on 6 ranks after a node was lost: it resumes resharded, sample-exact

The model (RMSNorm, rotary position embeddings, SwiGLU, causal attention; CPU-sized by default) is sharded with
FSDP2 (`fully_shard` per block, then the whole model). Every --checkpoint-every steps the ranks save their shards
through workloads.train.sharded (skipped while the previous save is still being written: the loop never waits for
it): the step stalls only while the state is copied to host memory; the write to
--checkpoint-dir (the node's NVMe) and the copy to --checkpoint-uri (S3, or an EFS/FSx directory) run in the
background, each file with its sha256 in a manifest written last. On start the newest complete checkpoint is loaded
(local, else remote) into however many ranks run now, and the data continues at the next unseen sequence (the
position is in the checkpoint). A fixed --global-batch-size keeps the steps the same on any world size.

SIGTERM (a Spot notice, a drain): the data API's StopSignal has the ranks agree on the step; they save it, wait for
the save (local and remote), and exit with $DISRUPTION_EXIT_CODE (43), which the Job retries without counting. Every
wait has a deadline: --collective-timeout (default $COLLECTIVE_TIMEOUT_SECONDS, else 600) bounds the process group's
collectives and the checkpointer's waits. One JSON line per epoch (rank 0), and rank 0's step events (StepReport:
each step's time, its wait for data, each save's stall and, once it is written, its background write time, as the
bundled trainer reports them; with $METRICS_PORT the same as Prometheus metrics), which measured goodput reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from workloads.data.api import LoaderSettings, PackedData, Placement, StepReport, StopSignal
from workloads.train.sharded import ShardedCheckpointer, TrainingState


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of (N, heads, T, head_dim), computed on the fly (no buffer to shard)."""
    half = x.shape[-1] // 2
    frequencies = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * frequencies[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        hidden = 4 * dim * 2 // 3
        self.gate, self.up, self.down = (nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False),
                                         nn.Linear(hidden, dim, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(n, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = rotary(q.transpose(1, 2)), rotary(k.transpose(1, 2)), v.transpose(1, 2)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(n, t, d))
        h = self.ffn_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.output(self.norm(x))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("DATA_DIR"), help="records dataset with a fixed-length "
                        "tokens field (default $DATA_DIR)")
    parser.add_argument("--vocab-size", type=int, required=True, help="larger than every token id")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="decoder blocks (default 2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--epochs", type=int, default=1, help="(default 1)")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="sequences per step over all ranks; each rank takes its share (default 24, unless "
                             "--batch-size is given)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sequences per step per rank instead (the global batch then grows with the world size)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights (the same on every rank; default 0)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    parser.add_argument("--lr", type=float, default=3e-3, help="(default 3e-3)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR") or "checkpoints",
                        help="the local tier: a directory on the node's NVMe (default $CHECKPOINT_DIR)")
    parser.add_argument("--checkpoint-uri", default=os.environ.get("CHECKPOINT_URI") or None,
                        help="the remote tier: s3://bucket/prefix or a shared directory (default $CHECKPOINT_URI)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default 50)")
    parser.add_argument("--keep", type=int, default=3, help="complete checkpoints kept per tier (default 3)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop (with a checkpoint) after this step")
    parser.add_argument("--collective-timeout", type=float,
                        default=float(os.environ.get("COLLECTIVE_TIMEOUT_SECONDS") or 600), metavar="SECONDS",
                        help="deadline of every collective and checkpoint wait (default $COLLECTIVE_TIMEOUT_SECONDS, "
                             "else 600)")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data: required (or set DATA_DIR)")
    if args.global_batch_size is not None and args.batch_size is not None:
        parser.error("--batch-size: give it or --global-batch-size, not both")
    if not args.collective_timeout > 0:
        parser.error(f"--collective-timeout: must be above 0, got {args.collective_timeout}")
    if args.global_batch_size is None and args.batch_size is None:
        args.global_batch_size = 24
    return args


def main() -> int:
    args = _arguments()
    placement = Placement.from_env()
    if placement.world_size > 1:
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "cpu:gloo,cuda:nccl",
                                timeout=timedelta(seconds=args.collective_timeout))
    if args.global_batch_size is None:
        args.global_batch_size = args.batch_size * placement.world_size
    if args.global_batch_size % placement.world_size:
        print(f"error: --global-batch-size: {args.global_batch_size} is not divisible by the world size "
              f"{placement.world_size}", file=sys.stderr)
        return 2
    device = torch.device(f"cuda:{placement.local_rank}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = Decoder(args.vocab_size, args.dim, args.layers, args.heads).to(device)
    if placement.world_size > 1:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = TrainingState(model, optimizer)
    ckpt = ShardedCheckpointer(args.checkpoint_dir, args.checkpoint_uri, keep=args.keep,
                               timeout_s=args.collective_timeout)
    data = PackedData.open(args.data, batch_size=args.global_batch_size // placement.world_size,
                           placement=placement, fields=["tokens"])
    step = 0
    resumed = ckpt.load(state)
    if resumed is not None:
        step = resumed.step
        data.load_state_dict(resumed.meta["data"])
    saved_step = step if resumed is not None else None  # the newest step a save was started for
    report = _reporter(placement.rank)
    steps = StepReport()  # each step's time, data wait and save stall: measured goodput (docs/monitoring.md)

    written: set[int] = set()

    def save_written() -> None:  # the newest save is over (after wait(), or busy() said so): its background write
        done = ckpt.last
        if done is not None and done.complete and done.local_write_s is not None and done.step not in written:
            written.add(done.step)
            steps.written(done.step, done.local_write_s, done.remote_s)  # the goodput model's in-flight term

    def last_checkpoint() -> None:  # on every rank, after the step all ranks agreed to stop at
        with steps.saving(step):
            ckpt.wait()  # the save in flight, if any (save() would wait for it too)
            save_written()
            saved = ckpt.save(state, step, meta={"data": data.state_dict(), "epoch": epoch})
        ckpt.wait()
        save_written()
        report("stopped", step=step, complete=saved.complete)

    data.loader(LoaderSettings(workers=args.workers))
    epoch = data.start_epoch
    with data, StopSignal() as stop:
        for epoch in range(data.start_epoch, args.epochs):
            started, sequences, loss_sum, batches = time.perf_counter(), 0, 0.0, 0
            for batch in steps.timed(data.batches(epoch, last_epoch=epoch == args.epochs - 1), epoch):
                # a records dataset's batch is a dict of its fields (PackedData.batches is typed for images)
                tokens = cast("dict[str, torch.Tensor]", batch)["tokens"].to(device, dtype=torch.int64)
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step, batches, sequences = step + 1, batches + 1, sequences + len(tokens)
                value = loss.item()
                loss_sum += value
                steps.step(step, samples=len(tokens), loss=value)  # the step's figures, for goodput
                stop.check(last_checkpoint)  # a SIGTERM on any rank: save this step on every rank, exit 43
                if step == args.max_steps:
                    last_checkpoint()
                    return 0
                if step % args.checkpoint_every == 0:  # skipped while the previous save is still in flight
                    if ckpt.busy():  # what save_if_idle asks; asked apart so a skip is no "checkpoint" event
                        ckpt.skipped += 1
                        report("checkpoint_skipped", step=step, in_flight=ckpt.in_flight, skipped=ckpt.skipped)
                    else:
                        save_written()
                        with steps.saving(step):  # the "checkpoint" event: the loop's stall (staging)
                            ckpt.save(state, step, meta={"data": data.state_dict(), "epoch": epoch})
                        saved_step = step
            report("epoch", epoch=epoch, sequences=sequences * placement.world_size,
                   loss=round(loss_sum / max(1, batches), 4), seconds=round(time.perf_counter() - started, 2))
    # the last step had its periodic save (or was resumed from): wait for it, and save again only if it failed
    last = ckpt.wait() if saved_step == step else None
    if last is None or not last.complete:
        with steps.saving(step):
            ckpt.wait()
            save_written()
            ckpt.save(state, step, meta={"data": data.state_dict(), "epoch": args.epochs})
        last = ckpt.wait()
    save_written()
    report("done", step=step, complete=bool(last and last.complete))
    return 0


def _reporter(rank: int):  # noqa: ANN202
    def emit(event: str, **fields: Any) -> None:
        if rank == 0:
            print(json.dumps({"event": event, **fields}), flush=True)
    return emit


if __name__ == "__main__":
    code = main()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)
