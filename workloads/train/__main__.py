"""python -m workloads.train --data DIR_OR_MANIFEST --model resnet18|resnet50 ... (JSON lines on stdout).

Under torchrun every rank runs this; rank 0 prints and writes checkpoints. Bad arguments or data exit with
$CONFIG_ERROR_EXIT_CODE (the rendered Jobs set it, and their podFailurePolicy fails the Job at once instead of
retrying), or 2 when it is not set. A disruption (SIGTERM/SIGINT: a last checkpoint is written first; a lost peer
rank) exits with $DISRUPTION_EXIT_CODE (43), which the Jobs retry without counting it. Every other failure exits 1
(RUNTIME_EXIT_CODE), which a Job retries and counts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from pathlib import Path

from torch.distributed import DistError

from workloads.cli import HelpWithDefaults, parse_size
from workloads.data.moving.cache import CacheStagerError, CacheTooSmall
from workloads.data.moving.s3 import DataToolError
from workloads.data.reading.dataset import DatasetError, DataUnavailableError
from workloads.metrics_http import metrics_addr, port_number
from workloads.safeio import StateFileError
from workloads.train.checkpoint import CheckpointError, CheckpointStoreError
from workloads.train.loop import ConfigError, Disrupted, Distributed, TrainConfig, TrainingDiverged, train
from workloads.train.metrics import METRICS_PORT_ENV, MetricsPortError, TrainMetrics, metrics_port_for
from workloads.train.models import MODELS

EPILOG = """\
environment:
  AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL
                        endpoint of an S3-compatible store (COS, MinIO) for --checkpoint-uri; the S3-specific
                        one wins. Credentials come from the usual AWS chain (AWS_ACCESS_KEY_ID, ...).
  CHECKPOINT_URI        default for --checkpoint-uri
  METRICS_PORT          default for --metrics-port (0: metrics off)
  METRICS_ADDR          address the metrics endpoint listens on (default 127.0.0.1; the rendered Jobs: 0.0.0.0)
  CONFIG_ERROR_EXIT_CODE
                        exit status for configuration errors (default 2; the rendered Jobs set 42)
  DISRUPTION_EXIT_CODE  exit status for disruptions (default 43, which the rendered Jobs also set)
  COLLECTIVE_TIMEOUT_SECONDS
                        default for --collective-timeout (the rendered multi-node Jobs set it)

output:
  JSON lines on stdout (one event per line, always valid JSON: NaN/inf become null); on a terminal, a progress
  bar on stderr; errors as one line `error: <where>: <why>` on stderr.

exit status:
  0  done
  $CONFIG_ERROR_EXIT_CODE (2)  bad argument, dataset, or checkpoint (damaged, foreign, newer format, another
     dataset), or a loss that became NaN/inf: retrying cannot help
  $DISRUPTION_EXIT_CODE (43)  stopped from outside: SIGTERM or SIGINT (the step in flight is finished and a last
     checkpoint with the loader position written, then every rank exits), or a collective that failed or timed
     out because a peer rank was lost (--collective-timeout); run again with --resume to continue exactly
  1  anything else, which a retry may fix: the checkpoint destination failed (disk full, object store
     unreachable), the staging cache's stager failed or stopped, a shard or the manifest did not arrive in time,
     an error inside PyTorch
"""


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _finite_float(text: str, *, strictly: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (strictly and value == 0):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strictly else '>='} 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    return _finite_float(text, strictly=True)


def _size(text: str) -> int:
    """A size flag, by the rule every size flag follows (workloads.cli.parse_size: a bare number is GiB)."""
    return parse_size(text, minimum=1)


def _non_negative_float(text: str) -> float:
    return _finite_float(text, strictly=False)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _port_from_env(parser: argparse.ArgumentParser) -> int:
    """$METRICS_PORT, checked like the flag: a bad value in a Job's env is a config error, not a traceback."""
    text = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not text:
        return 0
    try:
        return port_number(text)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{METRICS_PORT_ENV}: {exc}")
        raise  # unreachable: error() exits


RUNTIME_EXIT_CODE = 1  # a failure a retry may fix; never the config-error code
DISRUPTION_EXIT_CODE = 43  # the default; workloads/jobspec/spec.py renders the same number into every Job
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # NCCL's own default in PyTorch 2.x, gloo's is 30 minutes


def config_error_exit_code() -> int:
    """$CONFIG_ERROR_EXIT_CODE when it is a usable failure code (2-125); else 2: a config error never exits 0
    (success), nor 1 (the runtime failures' code, which the Job retries), nor a code the shell wraps (300 -> 44)
    or uses for signals (128 + n)."""
    try:
        code = int(os.environ.get("CONFIG_ERROR_EXIT_CODE", "2"))
    except ValueError:
        return 2
    return code if 2 <= code <= 125 else 2


def disruption_exit_code() -> int:
    """$DISRUPTION_EXIT_CODE when it is a usable code (2-125) other than the config-error code; else 43 (44 when
    43 is the config-error code)."""
    config = config_error_exit_code()
    fallback = DISRUPTION_EXIT_CODE if config != DISRUPTION_EXIT_CODE else DISRUPTION_EXIT_CODE + 1
    try:
        code = int(os.environ.get("DISRUPTION_EXIT_CODE", str(fallback)))
    except ValueError:
        return fallback
    return code if 2 <= code <= 125 and code != config else fallback


def _collective_timeout_from_env(parser: argparse.ArgumentParser) -> float:
    text = os.environ.get("COLLECTIVE_TIMEOUT_SECONDS", "").strip()
    if not text:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"COLLECTIVE_TIMEOUT_SECONDS: {exc}")
        raise  # unreachable: error() exits


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(config_error_exit_code())


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = _Parser(
        prog="python -m workloads.train",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=HelpWithDefaults,  # the description as written, and every option's default
    )
    parser.add_argument("--data", required=True, help="packed dataset directory or manifest.json, or a JPEG folder")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument(
        "--width", type=_positive, default=64, help="ResNet stem channels (64 = standard; less for CPU smoke runs)"
    )
    parser.add_argument("--epochs", type=_positive, default=1)
    parser.add_argument("--batch-size", type=_positive, default=256, help="samples per rank and step")
    parser.add_argument("--global-batch-size", type=_positive, default=None, metavar="N",
                        help="samples per step over all ranks, each taking N / world size (replaces --batch-size): "
                             "an elastic gang keeps its epoch order, learning rate and step count on fewer or more "
                             "nodes")
    parser.add_argument("--workers", type=_non_negative, default=4)
    parser.add_argument("--prefetch-factor", type=_positive, default=2)
    parser.add_argument("--amp", choices=["bf16"], default=None)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--crop-size", type=_positive, default=224)
    parser.add_argument("--image-size", type=_positive, default=None, help="decode size for JPEG sources")
    parser.add_argument("--block-size", type=_positive, default=1,
                        help="samples shuffled as blocks of this many consecutive ones (their boundaries move every "
                             "epoch); 1 shuffles sample by sample")
    parser.add_argument(
        "--wait-for-data",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for DATA/manifest.json to appear (a staging-cache sidecar is starting); "
             "fails at once (exit 1) when the stager reports an error or no stager is running",
    )
    parser.add_argument(
        "--shard-timeout",
        type=_positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="staging cache: the longest wait for one shard to be staged (default 3600); then exit 1",
    )
    parser.add_argument(
        "--stager-timeout",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="staging cache: no stager heartbeat for this long while waiting means no stager is running (killed, "
             "out of memory): exit 1 instead of waiting for --shard-timeout (default 60)",
    )
    parser.add_argument(
        "--decode-cache",
        default=None,
        metavar="DIR",
        help="encoded datasets: keep decoded samples in DIR (local disk or /dev/shm, shared by every rank on the "
             "node) so each JPEG is decoded once, not once per epoch; needs --decode-cache-size",
    )
    parser.add_argument(
        "--decode-cache-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="the decode cache's budget: GiB, or e.g. 20GiB, 20Gi, 512MiB, 500MB (the rule of every size flag); "
             "shards that do not fit are decoded every epoch",
    )
    parser.add_argument(
        "--shuffle-shards",
        "--window-shards",  # the name older Jobs pass
        dest="shuffle_shards",
        type=_positive,
        default=4,
        help="shards whose samples are shuffled together (per stream); a staging cache must hold at least "
             "this many per canonical node this node reads",
    )
    parser.add_argument(
        "--canonical-nodes",
        type=_positive,
        default=None,
        help="streams the epoch order is cut into (default: the number of nodes of the first run, kept on resume); "
             "the order is the same for any node count that divides it",
    )
    parser.add_argument("--lr", type=_positive_float, default=0.1, help="learning rate (finite, > 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="deterministic kernels (exact resume)")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument(
        "--checkpoint-uri",
        default=os.environ.get("CHECKPOINT_URI") or None,
        help="s3://bucket/prefix to mirror checkpoints to (default: $CHECKPOINT_URI); pulled on --resume",
    )
    parser.add_argument("--checkpoint-every", type=_non_negative, default=0, help="steps between checkpoints")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the checkpoint (local, else pulled from the mirror)"
    )
    parser.add_argument(
        "--allow-unverified-checkpoint",
        action="store_true",
        help="resume from a checkpoint without a sha256 sidecar/metadata (written by an older trainer); warns",
    )
    parser.add_argument("--log-every", type=_positive, default=10)
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=_port_from_env(parser),
        metavar="PORT",
        help="serve Prometheus metrics on PORT + local rank (default: $METRICS_PORT; 0 = off)",
    )
    parser.add_argument("--mp-context", choices=["fork", "spawn", "forkserver"], default=None)
    parser.add_argument(
        "--collective-timeout",
        type=_positive_float,
        default=_collective_timeout_from_env(parser),
        metavar="SECONDS",
        help="the longest an all-reduce or barrier waits for the other ranks (default: "
             "$COLLECTIVE_TIMEOUT_SECONDS, else 600); a lost peer then exits with the disruption code instead of "
             "hanging; keep it above the slowest checkpoint write (the other ranks wait for it at a barrier)",
    )
    parser.add_argument(
        "--stop-after-steps",
        type=_positive,
        default=None,
        metavar="N",
        help="SIGKILL this process after N steps (preemption drills and resume tests)",
    )
    args = parser.parse_args(argv)
    return TrainConfig(
        data=args.data,
        model=args.model,
        width=args.width,
        epochs=args.epochs,
        batch_size=args.batch_size,
        global_batch_size=args.global_batch_size,
        workers=args.workers,
        prefetch_factor=args.prefetch_factor,
        amp=args.amp,
        channels_last=args.channels_last,
        crop_size=args.crop_size,
        image_size=args.image_size,
        block_size=args.block_size,
        shuffle_shards=args.shuffle_shards,
        canonical_nodes=args.canonical_nodes,
        wait_for_data_s=args.wait_for_data,
        shard_wait_s=args.shard_timeout,
        stager_timeout_s=args.stager_timeout,
        decode_cache=args.decode_cache,
        decode_cache_bytes=args.decode_cache_size,
        lr=args.lr,
        seed=args.seed,
        deterministic=args.deterministic,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_uri=args.checkpoint_uri,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        log_every=args.log_every,
        mp_context=args.mp_context,
        stop_after_steps=args.stop_after_steps,
        allow_unverified_checkpoint=args.allow_unverified_checkpoint,
        metrics_port=args.metrics_port,
        metrics_addr=metrics_addr(),
        collective_timeout_s=args.collective_timeout,
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    env = Distributed.from_env()
    metrics = TrainMetrics(gpu_index=env.local_rank if _has_cuda() else None, volumes=_volumes(config))
    try:
        port = metrics_port_for(config.metrics_port, env.local_rank)
        if port:
            metrics.serve(port, config.metrics_addr)
        train(config, metrics=metrics)
    except Disrupted as exc:
        _print_error(exc, prefix="stopped")
        return disruption_exit_code()
    except DistError as exc:  # a collective failed or timed out: a peer rank (its node, its pod) is gone
        _print_error(exc, prefix=f"peer lost ({type(exc).__name__})")
        return disruption_exit_code()
    except (CheckpointStoreError, DataUnavailableError, CacheStagerError, TimeoutError) as exc:
        _print_error(exc)
        return RUNTIME_EXIT_CODE
    except DataToolError as exc:
        _print_error(exc)
        return RUNTIME_EXIT_CODE if exc.runtime else config_error_exit_code()
    except (DatasetError, ConfigError, CheckpointError, TrainingDiverged, CacheTooSmall, StateFileError,
            MetricsPortError) as exc:
        _print_error(exc)
        return config_error_exit_code()
    except Exception as exc:  # a failure inside PyTorch, the OS, ...: not the input's fault, so a retry may help
        if peer_lost(exc):  # gloo's lost connection inside DDP: a RuntimeError
            _print_error(exc, prefix="peer lost")
            return disruption_exit_code()
        traceback.print_exc(file=sys.stderr)
        _print_error(exc, prefix=type(exc).__name__)
        return RUNTIME_EXIT_CODE
    finally:
        metrics.close()
    return 0


# What the transports say when the other end of a collective is gone. DDP's gradient all-reduce and its buffer
# broadcast surface gloo's as a plain RuntimeError (not a DistError), so they are recognised by these words; NCCL's,
# with async error handling, arrive as DistBackendError.
_PEER_LOST = ("gloo/transport/tcp", "Connection closed by peer", "Connection reset by peer",
              "NCCL communicator was aborted", "Watchdog caught collective operation timeout")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is a collective that failed because another rank is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DistError) or any(marker in str(current) for marker in _PEER_LOST):
            return True
        current = current.__cause__ or current.__context__
    return False


def _volumes(config: TrainConfig) -> dict[str, str]:
    """The file systems whose fill level the metrics report: /dev/shm and the data directory."""
    data = Path(config.data)
    return {"shm": "/dev/shm", "data": str(data if data.is_dir() else data.parent)}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _print_error(exc: BaseException, prefix: str | None = None) -> None:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if prefix is not None:
        print(f"error: {prefix}: {text}", file=sys.stderr)
        return
    where, _, why = text.partition(": ")
    print(f"error: {where}: {why}" if why else f"error: {text}", file=sys.stderr)


def exit_with(code: int) -> None:
    """Exit with `code`. A distributed rank leaves at once after flushing (os._exit): a C++ destructor of the
    collective layer that aborts at interpreter exit must not turn the code the Job acts on (0, 43, 42) into a
    SIGABRT, which it would count."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_with(main())
