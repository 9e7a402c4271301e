"""python -m workloads.train --data DIR_OR_MANIFEST --model resnet18|resnet50 ... (JSON lines on stdout).

Under torchrun every rank runs this; rank 0 prints, every rank writes its share of the (sharded) checkpoints.
Bad arguments or data exit with $CONFIG_ERROR_EXIT_CODE (the rendered Jobs set it, and their podFailurePolicy fails
the Job at once instead of retrying), or 2 when it is not set. A disruption (SIGTERM/SIGINT: a last checkpoint is
written first; a lost peer rank) exits with $DISRUPTION_EXIT_CODE (43), which the Jobs retry without counting it.
Every other failure exits 1 (RUNTIME_EXIT_CODE), which a Job retries and counts.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from torch.distributed import DistError

from workloads.cli import HelpWithDefaults
from workloads.data.format.errors import DataToolError
from workloads.data.moving.cache import CacheStagerError, CacheTooSmall
from workloads.data.reading.dataset import DatasetError, DataUnavailableError
from workloads.safeio import StateFileError
from workloads.train.checkpoint import CheckpointError, CheckpointStoreError
from workloads.train.config import ConfigError, TrainConfig, build_parser, config_from_args, parse_with_preset
from workloads.train.exitcodes import (  # noqa: F401 - the codes' names, re-exported for tests
    DISRUPTION_EXIT_CODE,
    RUNTIME_EXIT_CODE,
    config_error_exit_code,
    disruption_exit_code,
    leave,
    peer_lost,
)
from workloads.train.loop import Disrupted, Distributed, TrainingDiverged, train
from workloads.train.metrics import MetricsPortError, TrainMetrics, metrics_port_for
from workloads.train.tiers import CheckpointTimeout

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
     out because a peer rank was lost (--collective-timeout), or a checkpoint save still unfinished after it;
     run again with --resume to continue exactly
  1  anything else, which a retry may fix: the checkpoint destination failed (disk full, object store
     unreachable), the staging cache's stager failed or stopped, a shard or the manifest did not arrive in time,
     an error inside PyTorch
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(config_error_exit_code())


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The command line (and the environment defaults it names) as a TrainConfig: every option is declared once,
    on its TrainConfig field (workloads/train/config.py)."""
    parser = _Parser(
        prog="python -m workloads.train",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=HelpWithDefaults,  # the description as written, and every option's default
    )
    return config_from_args(parse_with_preset(build_parser(parser), argv))


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
    except CheckpointTimeout as exc:  # a save that never finished: the Job resumes from the previous checkpoint
        _print_error(exc)
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


exit_with = leave  # the name the chaos worker and the tests use


if __name__ == "__main__":
    exit_with(main())
