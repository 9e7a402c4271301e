"""The launcher every gang runs under: your command inside the in-process torchrun wrapper (workloads/train/launch.py).

torchrun alone exits 1 whatever its workers did, so a Job could not tell a config error (fail the Job) from a
disruption (retry, not counted) from a crash (retry, counted). Your own `command:` (and a gang of the bundled trainer:
several nodes or several GPUs per pod) therefore runs as

    python -m workloads.train.launch --no-python <your command>         (torchrun's options from PET_*: one
                                                                        process per GPU, c10d across nodes)
    python -m workloads.train.launch <torchrun's options> <script> ...  (a command that was `torchrun ...`)

and the pod exits 0 when every worker did, the config-error code when a worker did, the disruption code on a stop or
a lost peer, 1 otherwise. `--no-python` runs your command as it is for each rank (torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, ...), so any interpreter, script or binary works. `launcher: none` in the spec opts out:
the command then runs as written, and what it costs is `OPT_OUT_NOTE`.

This module is pure (no torch): the renderer runs in the Pulumi program too.
"""

from __future__ import annotations

import os
from typing import Any

LAUNCH = ["python", "-m", "workloads.train.launch"]
BUNDLED_TRAINER = [*LAUNCH, "--module", "workloads.train"]

OPT_OUT_NOTE = ("runs its command without the launcher (launcher: none): the pod exits as the command does, and "
                "torchrun alone exits 1 whatever its workers did, so a lost peer or a SIGTERM the command does not "
                "turn into exit 43 is counted against backoffLimit, and a config error is retried until it is "
                "spent (docs/own-training-code.md, 'Surviving disruptions')")

# An opted-out Job carries <label prefix>/launcher: none; the plan (scripts/plan.py) and `submit render` print
# OPT_OUT_NOTE for it.
LAUNCHER_ANNOTATION = "launcher"

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return name == "python" or (name.startswith("python") and name[6:].replace(".", "").isdigit())


def torchrun_options(command: list[str]) -> list[str] | None:
    """What follows `torchrun` (or `python -m torch.distributed.run`) in `command`; None when it is not one."""
    if command and os.path.basename(command[0]) == "torchrun":
        return command[1:]
    if len(command) >= 3 and _is_python(command[0]) and command[1] == "-m" and command[2] in _TORCHRUN_MODULES:
        return command[3:]
    return None


def launched_command(command: list[str]) -> list[str]:
    """A spec's `command:` inside the launcher: torchrun's own options kept, anything else run per rank as is."""
    if len(command) >= 3 and _is_python(command[0]) and command[1:3] == ["-m", "workloads.train.launch"]:
        return [*LAUNCH, *command[3:]]  # already the launcher
    options = torchrun_options(command)
    if options is not None:
        return [*LAUNCH, *options]
    return [*LAUNCH, "--no-python", *command]


def launcher_notes(manifests: list[dict[str, Any]], label_prefix: str) -> list[str]:
    """The note for each run (Job, JobSet, TrainJob) among `manifests` that runs its command without the launcher."""
    key = f"{label_prefix}/{LAUNCHER_ANNOTATION}"
    return [f"{str(m.get('kind', 'run')).lower()} {m['metadata'].get('namespace', '')}/{m['metadata']['name']} "
            f"{OPT_OUT_NOTE}" for m in manifests
            if isinstance(m.get("metadata"), dict) and (m["metadata"].get("annotations") or {}).get(key) == "none"]
