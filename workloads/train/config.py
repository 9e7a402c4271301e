"""The trainer's settings, each declared once: `TrainConfig`'s fields carry their flag, parser, help and
environment default (`option(...)`), and `build_parser` / `config_from_args` derive the command line from them.

A field is a flag named after it (`batch_size` -> `--batch-size`) unless its option names another (`flag=`); a
bool field is a switch (store_true); a field whose option says `env=NAME` takes its default from $NAME, checked by
the same parser as the flag (a bad value there is the same one-line config error); `cli=False` fields are
settings the command line does not offer (library callers and tests set them).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from workloads.cli import parse_size
from workloads.metrics_http import DEFAULT_METRICS_ADDR, METRICS_ADDR_ENV, port_number
from workloads.train.metrics import METRICS_PORT_ENV
from workloads.train.models import MODELS


class ConfigError(ValueError):
    """A bad argument or setting: the CLI exits with the config-error code (the Job fails at once, no retry)."""


def rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """Each rank's share of a fixed global batch; a world size that does not divide it is a config error."""
    if global_batch_size % world_size:
        raise ConfigError(f"--global-batch-size: {global_batch_size} is not divisible by the world size "
                          f"{world_size} (nodes x processes per node)")
    return global_batch_size // world_size


# -- argument parsers (argparse names a ValueError's function in its message: "invalid _positive value") ---------
def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
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


def _non_negative_float(text: str) -> float:
    return _finite_float(text, strictly=False)


def _size(text: str) -> int:
    """A size flag, by the rule every size flag follows (workloads.cli.parse_size: a bare number is GiB)."""
    return parse_size(text, minimum=1)


def _text(text: str) -> str:
    return text


@dataclass(frozen=True)
class Option:
    """How one TrainConfig field appears on the command line."""

    help: str | None = None
    parse: Callable[[str], Any] | None = None  # None: the field's text as given (or a switch for a bool)
    flag: str | None = None  # default: --<field name with dashes>
    aliases: tuple[str, ...] = ()  # further names the flag answers to (older Jobs)
    choices: Sequence[str] | None = None
    metavar: str | None = None
    env: str | None = None  # default from this environment variable (empty: the field's default)
    cli: bool = True


def option(default: Any = MISSING, **how: Any) -> Any:
    """A TrainConfig field with its command-line form (see Option); no default makes the flag required."""
    return field(default=default, metadata={"option": Option(**how)})


@dataclass(frozen=True)
class TrainConfig:
    data: str = option(help="packed dataset directory or manifest.json, or a JPEG folder")
    model: str = option("resnet50", choices=sorted(MODELS))
    width: int = option(64, parse=_positive, help="ResNet stem channels (64 = standard; less for CPU smoke runs)")
    epochs: int = option(1, parse=_positive)
    batch_size: int = option(256, parse=_positive, help="samples per rank and step")
    # Each step's samples over all ranks; each rank then takes global_batch_size / world_size (batch_size is
    # ignored). Fixed across world sizes, so an elastic gang that shrinks or grows keeps its epoch order and its
    # optimisation (same learning rate, same steps).
    global_batch_size: int | None = option(
        None, parse=_positive, metavar="N",
        help="samples per step over all ranks, each taking N / world size (replaces --batch-size): an elastic gang "
             "keeps its epoch order, learning rate and step count on fewer or more nodes")
    workers: int = option(4, parse=_non_negative)
    prefetch_factor: int = option(2, parse=_positive)
    amp: str | None = option(None, choices=["bf16"])
    channels_last: bool = option(False)
    crop_size: int = option(224, parse=_positive)
    image_size: int | None = option(None, parse=_positive, help="decode size for JPEG sources")
    block_size: int = option(
        1, parse=_positive,
        help="samples shuffled as blocks of this many consecutive ones (their boundaries move every epoch); 1 "
             "shuffles sample by sample")
    wait_for_data_s: float = option(
        0.0, flag="--wait-for-data", parse=_non_negative_float, metavar="SECONDS",
        help="wait up to this long for DATA/manifest.json to appear (a staging-cache sidecar is starting); fails "
             "at once (exit 1) when the stager reports an error or no stager is running")
    shard_wait_s: float = option(
        3600.0, flag="--shard-timeout", parse=_positive_float, metavar="SECONDS",
        help="staging cache: the longest wait for one shard to be staged (default 3600); then exit 1")
    stager_timeout_s: float = option(
        60.0, flag="--stager-timeout", parse=_positive_float, metavar="SECONDS",
        help="staging cache: no stager heartbeat for this long while waiting means no stager is running (killed, "
             "out of memory): exit 1 instead of waiting for --shard-timeout (default 60)")
    decode_cache: str | None = option(
        None, metavar="DIR",
        help="encoded datasets: keep decoded samples in DIR (local disk or /dev/shm, shared by every rank on the "
             "node) so each JPEG is decoded once, not once per epoch; needs --decode-cache-size")
    decode_cache_bytes: int | None = option(
        None, flag="--decode-cache-size", parse=_size, metavar="SIZE",
        help="the decode cache's budget: GiB, or e.g. 20GiB, 20Gi, 512MiB, 500MB (the rule of every size flag); "
             "shards that do not fit are decoded every epoch")
    shuffle_shards: int = option(
        4, parse=_positive, aliases=("--window-shards",),  # the name older Jobs pass
        help="shards whose samples are shuffled together (per stream); a staging cache must hold at least this "
             "many per canonical node this node reads")
    canonical_nodes: int | None = option(
        None, parse=_positive,
        help="streams the epoch order is cut into (default: the number of nodes of the first run, kept on "
             "resume); the order is the same for any node count that divides it")
    lr: float = option(0.1, parse=_positive_float, help="learning rate (finite, > 0)")
    seed: int = option(0, parse=int)
    deterministic: bool = option(False, help="deterministic kernels (exact resume)")
    checkpoint_dir: str | None = option(None)
    checkpoint_uri: str | None = option(
        None, env="CHECKPOINT_URI",
        help="the remote tier every rank copies its checkpoint shards to after the local write: s3://bucket/prefix or "
             "a shared directory (EFS, FSx) (default: $CHECKPOINT_URI); searched on --resume")
    checkpoint_every: int = option(0, parse=_non_negative, help="steps between checkpoints")
    checkpoint_if_busy: str = option(
        "skip", choices=["skip", "wait"],
        help="a periodic checkpoint due while the previous one is still being written in the background: skip it "
             "(the loop never waits; a SIGKILL loses at most (2 + skipped) x --checkpoint-every - 1 steps) or wait "
             "for it (at most 2 x --checkpoint-every - 1); a stop, an epoch's end and the run's end always wait")
    resume: bool = option(False, help="continue from the newest complete checkpoint (local tier, else the remote one; "
                                      "an older trainer's last.pt while there is none), on any world size")
    allow_unverified_checkpoint: bool = option(
        False, help="resume from an older trainer's last.pt without a sha256 sidecar/metadata; warns")
    log_every: int = option(10, parse=_positive)
    metrics_port: int = option(
        0, parse=port_number, metavar="PORT", env=METRICS_PORT_ENV,
        help="serve Prometheus metrics on PORT + local rank (default: $METRICS_PORT; 0 = off)")
    mp_context: str | None = option(None, choices=["fork", "spawn", "forkserver"])
    # The longest a collective (all-reduce, barrier) may wait for the other ranks; a lost peer then ends the run
    # (the disruption exit code) instead of hanging it for NCCL's or gloo's own default.
    collective_timeout_s: float = option(
        600.0, flag="--collective-timeout", parse=_positive_float, metavar="SECONDS",
        env="COLLECTIVE_TIMEOUT_SECONDS",
        help="the longest an all-reduce or barrier waits for the other ranks (default: $COLLECTIVE_TIMEOUT_SECONDS, "
             "else 600); a lost peer then exits with the disruption code instead of hanging; keep it above the "
             "slowest checkpoint write (the other ranks wait for it at a barrier)")
    stop_after_steps: int | None = option(
        None, parse=_positive, metavar="N",
        help="SIGKILL this process after N steps (preemption drills and resume tests)")
    momentum: float = option(0.9, cli=False)
    weight_decay: float = option(1e-4, cli=False)
    metrics_addr: str = option(DEFAULT_METRICS_ADDR, cli=False, env=METRICS_ADDR_ENV)  # a pod: 0.0.0.0

    def validate(self) -> None:
        """Every numeric field finite and in range, before anything is read or built (ValueError per field)."""
        positive = ("epochs", "batch_size", "prefetch_factor", "width", "crop_size", "block_size", "shuffle_shards",
                    "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be a positive integer, got {value!r}")
        for name in ("workers", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be >= 0, got {value!r}")
        if not isinstance(self.metrics_port, int) or not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port: must be a TCP port (1-65535) or 0 for off, got {self.metrics_port!r}")
        for name, value in (("image_size", self.image_size), ("stop_after_steps", self.stop_after_steps),
                            ("canonical_nodes", self.canonical_nodes), ("global_batch_size", self.global_batch_size)):
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr: must be a finite number > 0, got {self.lr!r}")
        if not (math.isfinite(self.momentum) and self.momentum >= 0):
            raise ConfigError(f"momentum: must be a finite number >= 0, got {self.momentum!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay: must be a finite number >= 0, got {self.weight_decay!r}")
        if (self.decode_cache is None) != (self.decode_cache_bytes is None):
            raise ConfigError("--decode-cache and --decode-cache-size: give both or neither")
        if self.decode_cache_bytes is not None and self.decode_cache_bytes <= 0:
            raise ConfigError(f"--decode-cache-size: must be more than 0 bytes, got {self.decode_cache_bytes!r}")
        if not (math.isfinite(self.wait_for_data_s) and self.wait_for_data_s >= 0):
            raise ConfigError(f"--wait-for-data: must be a finite number of seconds >= 0, got {self.wait_for_data_s!r}")
        for name in ("shard_wait_s", "stager_timeout_s", "collective_timeout_s"):
            seconds = getattr(self, name)
            if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
                raise ConfigError(f"{flag_of(name)}: must be a finite number of seconds > 0, got {seconds!r}")


def _option(item: Field[Any]) -> Option:
    return item.metadata.get("option") or Option()


def flag_of(name: str) -> str:
    """The command-line flag of a TrainConfig field (`shard_wait_s` -> --shard-timeout)."""
    for item in fields(TrainConfig):
        if item.name == name:
            return _option(item).flag or f"--{name.replace('_', '-')}"
    raise KeyError(name)


class EnvDefaultError(ValueError):
    """An environment variable that gives a flag's default holds a value the flag would refuse."""


def _env_default(item: Field[Any], how: Option) -> Any:
    text = os.environ.get(how.env or "", "").strip() if how.env else ""
    if not text:
        return item.default
    try:
        return (how.parse or _text)(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise EnvDefaultError(f"{how.env}: {exc}") from None


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one argument per command-line field of TrainConfig, in field order. A bad environment default is
    reported through `parser.error` (the parser's own exit)."""
    for item in fields(TrainConfig):
        how = _option(item)
        if not how.cli:
            continue
        names = [how.flag or f"--{item.name.replace('_', '-')}", *how.aliases]
        kwargs: dict[str, Any] = {"dest": item.name, "help": how.help}
        if item.default is MISSING:
            kwargs["required"] = True
        elif item.type in ("bool", bool):
            kwargs["action"] = "store_true"
        else:
            try:
                kwargs["default"] = _env_default(item, how)
            except EnvDefaultError as exc:
                parser.error(str(exc))
        if "action" not in kwargs:
            if how.parse is not None:
                kwargs["type"] = how.parse
            if how.choices is not None:
                kwargs["choices"] = how.choices
            if how.metavar is not None:
                kwargs["metavar"] = how.metavar
        parser.add_argument(*names, **kwargs)
    return parser


# Settings that fit another machine, as defaults a flag given beside `--preset` still overrides. `cpu`: a laptop or
# a CI runner (ResNet-18 with a narrow stem at 64 px, small batches): one epoch of a few hundred images in seconds,
# where the GPU-sized defaults (ResNet-50, 224 px, batch 256) take minutes.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"model": "resnet18", "width": 16, "crop_size": 64, "batch_size": 32, "workers": 1,
            "log_every": 5},
}


def parse_with_preset(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv`; with `--preset NAME`, the preset's settings become the defaults (so explicit flags win)."""
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="defaults for another machine, below any flag given: cpu = " + ", ".join(
                            f"{flag_of(name)} {value}" for name, value in PRESETS["cpu"].items()))
    args = parser.parse_args(argv)
    if args.preset:
        parser.set_defaults(**PRESETS[args.preset])
        args = parser.parse_args(argv)
    return args


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed arguments; fields the command line does not offer take their environment
    default, else their declared one."""
    values: dict[str, Any] = {}
    for item in fields(TrainConfig):
        how = _option(item)
        if how.cli:
            values[item.name] = getattr(args, item.name)
        elif how.env:
            values[item.name] = os.environ.get(how.env) or item.default
    return TrainConfig(**values)
