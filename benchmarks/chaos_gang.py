"""Chaos trials for a training gang: 2 "nodes" as process groups on 127.0.0.1, each a real torchrun agent (through
workloads.train.launch, as the rendered Jobs run it) with the c10d rendezvous and the gloo backend, a tiny ResNet on
a folder of tiny JPEGs, checkpoints to a local directory shared by the nodes (the EFS claim of a real gang).

The harness plays the kubelet and the Job controller with the restart rules of a rendered 2-node Job: a node that
exits is judged by the Job's podFailurePolicy (benchmarks.gang.pod_failure_action; a node this harness SIGKILLed
carries DisruptionTarget, as a pod on a lost node does) and started again with the same arguments (a replacement
pod), unless the policy fails the Job or the counted failures pass backoffLimit. torchrun's own --max-restarts and
rendezvous join timeout come from the same rendered Job.

One trial: pick a step and a node at random (seeded), and at that step either SIGKILL the node's whole process group
(a lost node, a kernel panic) or SIGTERM its agent (the kubelet stopping the pod: a drain, a Spot notice). With an
elastic Job (minNodes 1, --global-batch-size) a trial may also DROP a node: SIGKILL it and leave its replacement pod
Pending (capacity that does not come back), so the survivor re-forms alone after the rendered elasticWaitSeconds; in
some trials the capacity comes back a few steps later and the gang grows back to 2 (torchrun's agent sees the node
waiting at the rendezvous and restarts its workers: SIGTERM, last checkpoint, re-formed at 2). The dropped node is
never index 0: on a cluster index 0 hosts the c10d rendezvous, so its loss cannot continue on fewer (the harness's
nodes share 127.0.0.1, where any node could host the store; it keeps to what a cluster can do). Checked:
every sample trained exactly once per epoch (each rank records the sample ids of its batches; the ones after the
checkpoint the next run resumed from are dropped), the final weights equal an uninterrupted run's, steps lost 0 for
SIGTERM and at most (2 + skipped) x --checkpoint-every - 1 for SIGKILL (the newest save may still be in flight, and
each periodic save the killed formation skipped because one was in flight, its "checkpoint_skipped" events, adds an
interval), the failure budget untouched. Measured: the time from the kill to the first step after the resume, and
the steps lost.

With a script (`--script examples/train_plain.py`), the gang runs your own training script instead: rendered
through the same Job spec with `command: [python, SCRIPT]` (so under the same launcher and podFailurePolicy), on
the same images packed for the data API, each rank under benchmarks/chaos_script_worker.py, which records the
samples and steps from the data API the script reads through. The script takes --data, --checkpoint-dir,
--checkpoint-every, --epochs, --batch-size (per rank) and --workers, as the examples do; with --seed and a
checkpoint.pt holding "model" and "step" (the examples' format) or a Lightning last.ckpt, the final weights
are compared too.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos_goodput import KINDS, trials_goodput
from benchmarks.processes import kill_tree

REPO = Path(__file__).resolve().parents[1]
NODES = 2
CLASSES, PER_CLASS = 3, 32  # 96 JPEGs: 12 steps of 2 x 4 per epoch
RANK_BATCH = 4
TRAIN_ARGS = ["--model", "resnet18", "--width", "8", "--crop-size", "32", "--image-size",
              "32", "--lr", "0.01", "--log-every", "1", "--epochs", "2", "--workers", "0", "--deterministic",
              "--resume", "--collective-timeout", "30"]
# An elastic gang keeps its global batch whatever its size (the spec asks for it): 8 = 2 nodes x 4, or 1 x 8.
ELASTIC_BATCH_ARGS = ["--global-batch-size", str(NODES * RANK_BATCH)]
ELASTIC_WAIT_S = 30  # the rendered elasticWaitSeconds (its floor): how long a re-forming gang waits for a lost node
# A script's run: the same epochs, per-rank batch and loader setting as the bundled trainer's, a fixed seed.
SCRIPT_ARGS = ["--epochs", "2", "--batch-size", str(RANK_BATCH), "--workers", "0", "--seed", "0"]


def make_dataset(root: Path) -> Path:
    """A folder of class sub-folders with tiny JPEGs (the trainer reads folders as they are)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    for label in range(CLASSES):
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(PER_CLASS):
            pixels = rng.integers(0, 256, (36, 36, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img{k:03d}.jpg", quality=90)
    return root


def rendered_gang_job(rank_restarts: int | None = None, elastic: bool = False,
                      script: list[str] | None = None) -> dict[str, Any]:
    """The Job a 2-node spec renders to: its podFailurePolicy, backoffLimit, successPolicy and torchrun settings
    drive the trials. Elastic: minNodes 1, elasticWaitSeconds ELASTIC_WAIT_S. script: SCRIPT [ARGS], the spec's
    `command: [python, SCRIPT]` and its args (the harness's run settings first, ARGS after them)."""
    from workloads.cluster_facts import ClusterFacts, PoolFacts
    from workloads.jobspec import parse_spec, render_job

    facts = ClusterFacts(stack="chaos", label_prefix="ml-cluster.io",
                         pools=(PoolFacts("cpu", None, 0, 0),))
    extra: dict[str, Any] = {} if rank_restarts is None else {"rankRestarts": rank_restarts}
    if elastic:
        extra.update({"minNodes": 1, "elasticWaitSeconds": ELASTIC_WAIT_S, "args": ELASTIC_BATCH_ARGS})
    if script is not None:
        extra.update({"command": ["python", str(Path(script[0]).resolve())], "args": SCRIPT_ARGS + script[1:]})
    spec = parse_spec({"name": "chaos", "image": "registry.local/train:1", "gpus": 0, "cpu": "1", "memory": "8Gi",
                       "nodes": NODES, **extra})
    job, *_ = render_job(spec, facts)
    return job


def train_args(job: dict[str, Any]) -> list[str]:
    """The trainer's arguments: the harness's, with the rendered Job's batch rule (a global batch when elastic)."""
    args = list(job["spec"]["template"]["spec"]["containers"][0].get("args", []))
    return TRAIN_ARGS + (args if "--global-batch-size" in args else ["--batch-size", str(RANK_BATCH)])


def is_script(job: dict[str, Any]) -> bool:
    return "--no-python" in job["spec"]["template"]["spec"]["containers"][0].get("command", [])


def node_command(job: dict[str, Any], torchrun: list[str], data: Path, checkpoints: Path,
                 checkpoint_every: int) -> list[str]:
    """What one node (pod) runs: the launcher with this harness's torchrun options (127.0.0.1 rendezvous), then the
    bundled trainer, or the rendered Job's own command (a script under the launcher, `--no-python python SCRIPT`)
    with its `python` replaced by this interpreter running benchmarks.chaos_script_worker."""
    launch = [sys.executable, "-m", "workloads.train.launch", *torchrun]
    paths = ["--data", str(data), "--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(checkpoint_every)]
    if not is_script(job):
        return [*launch, "-m", "benchmarks.chaos_worker", *train_args(job), *paths]
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = list(container["command"])
    if command[:4] != ["python", "-m", "workloads.train.launch", "--no-python"] or command[4] != "python":
        raise ValueError(f"the rendered Job does not run the script under the launcher: {command}")
    return [*launch, "--no-python", sys.executable, "-m", "benchmarks.chaos_script_worker", *command[5:],
            *container.get("args", []), *paths]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Node:
    index: int
    command: list[str]
    env: dict[str, str]
    events: queue.Queue[tuple[float, dict[str, Any]]]
    log: Path
    process: subprocess.Popen[str] | None = None
    killed: bool = False  # SIGKILLed by the harness: the pod carries DisruptionTarget
    pending: bool = False  # its replacement pod waits for capacity (a DROP trial)
    stopping_since: float | None = None  # SIGTERM sent (the kubelet SIGKILLs after the grace period)
    done: bool = False
    starts: int = 0

    def start(self) -> None:
        self.killed = False
        self.stopping_since = None
        self.starts += 1
        handle = self.log.open("a")
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=handle, text=True,
                                        env=self.env, cwd=REPO, start_new_session=True)
        handle.close()
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    self.events.put((time.monotonic(), json.loads(line)))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process)


@dataclass
class Outcome:
    ok: bool
    problems: list[str] = field(default_factory=list)
    kill: str | None = None
    kill_step: int | None = None
    node: int | None = None
    time_to_resume_s: float | None = None
    steps_lost: int | None = None
    resumed_step: int | None = None
    counted_failures: int = 0
    actions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    world_after: int | None = None  # the world size the gang resumed at after the kill
    saves_skipped: int = 0  # periodic saves the killed formation skipped (a save in flight): each widens the bound
    restored: bool = False  # DROP: the capacity came back during the run
    grow_time_s: float | None = None  # from the node's return to the first step of the gang grown back
    grow_steps_lost: int | None = None
    world_final: int | None = None  # the world size of the last formation
    # rank 0's events as (seconds since the start, event) and the kill's time, for the goodput figures
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    killed_at_s: float | None = None


def trained_ids(log_dir: Path) -> dict[int, Counter[int]]:
    """epoch -> how often each sample id was trained, over every rank's runs (see benchmarks/chaos_worker.py).

    A run's batches count up to the step the next formation of the gang resumed from (its checkpoint): batches
    trained after that checkpoint were lost with the formation and trained again. Every rank of one formation logs
    the same formation time (rank 0's, broadcast), so formations are ordered whatever their sizes."""
    runs: list[tuple[float, int, list[dict[str, Any]]]] = []
    for path in log_dir.glob("rank*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not lines or "start" not in lines[0]:
            continue
        runs.append((lines[0]["time"], lines[0]["start"], lines[1:]))
    starts = sorted({(formed, start) for formed, start, _ in runs})
    counts: dict[int, Counter[int]] = {}
    for formed, start, batches in runs:
        later = [resumed for when, resumed in starts if when > formed]
        until = later[0] if later else None  # the step (a script: the position) the next formation resumed from
        for k, batch in enumerate(batches, start=1):
            if until is not None and batch.get("pos", start + k) > until:
                break
            counts.setdefault(batch["epoch"], Counter()).update(batch["ids"])
    return counts


def _control_pods(nodes: list[Node], job: dict[str, Any], outcome: Outcome, grace_s: float) -> bool:
    """One pass of the Job controller and the kubelet over the gang's pods: a SIGTERMed pod past its grace period
    is SIGKILLed, a failed pod is judged by the podFailurePolicy and replaced; False when the Job fails."""
    from benchmarks.gang import COUNT, FAIL_JOB, pod_failure_action

    for node in nodes:
        if (node.stopping_since is not None and node.process is not None and node.process.poll() is None
                and time.monotonic() - node.stopping_since > grace_s):
            node.killed = True  # the grace period is over: the kubelet SIGKILLs the pod (DisruptionTarget)
            kill_tree(node.process)
        if node.done or node.pending or node.process is None or node.process.poll() is None:
            continue
        code = node.process.returncode
        if code == 0:
            node.done = True
            continue
        conditions = ("DisruptionTarget",) if node.killed else ()
        action = pod_failure_action(job, "train", code if code > 0 else None, conditions)
        outcome.actions.append(f"node{node.index}:{code}:{action}")
        if action == FAIL_JOB:
            outcome.problems.append(f"node {node.index} exited {code}: the Job fails")
            return False
        if action == COUNT:
            outcome.counted_failures += 1
            if outcome.counted_failures > job["spec"]["backoffLimit"]:
                outcome.problems.append("backoffLimit spent: the Job fails")
                return False
        node.start()  # the replacement pod
    return True


@dataclass
class _Reformation:
    """The gang forming again after a disruption at `since` (a kill, or the capacity coming back): the highest step
    trained until then, the step the new formation resumed from, and whether it has loaded its model (its next
    batch is the first after the resume)."""

    since: float
    trained_before: int = 0
    resumed_step: int = 0
    formed: bool = False

    def see(self, name: str | None, at: float, event: dict[str, Any]) -> None:
        if name == "batch":
            self.trained_before = max(self.trained_before, event["step"])
        elif name == "resumed" and at > self.since:
            self.resumed_step = event["step"]
        elif name == "model_loading" and at > self.since:
            self.formed = True

    @property
    def steps_lost(self) -> int:
        return max(0, self.trained_before - self.resumed_step)


def run_gang(work: Path, data: Path, job: dict[str, Any], checkpoint_every: int,
             kill: tuple[str, int, int] | None = None, timeout_s: float = 240.0, grace_s: float = 30.0,
             step_delay_s: float = 0.15, restore_after_steps: int | None = None) -> Outcome:
    """One gang run to completion under the harness's Job controller; `kill` = (SIGKILL|SIGTERM|DROP, step, node).

    DROP: the node is SIGKILLed and its replacement stays Pending; `restore_after_steps` steps after the gang
    resumed without it, the capacity comes back and the replacement starts (None: never)."""
    env_of = {item["name"]: item.get("value", "") for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    # successPolicy (elastic gangs): the Job succeeds when index 0 does; the controller removes the lingering pods
    leader_decides = "successPolicy" in job["spec"]
    checkpoints, logs = work / "checkpoints", work / "samples"
    logs.mkdir(parents=True)
    port = _free_port()
    torchrun = ["--nnodes", env_of["PET_NNODES"], "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", work.name,
                "--max-restarts", env_of["PET_MAX_RESTARTS"], "--rdzv-conf", env_of["PET_RDZV_CONF"],
                "--monitor-interval", "0.5"]
    launch = node_command(job, torchrun, data, checkpoints, checkpoint_every)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CHAOS_LOG_DIR": str(logs),
           "CHAOS_STEP_SAMPLES": str(NODES * RANK_BATCH),
           "CONFIG_ERROR_EXIT_CODE": env_of["CONFIG_ERROR_EXIT_CODE"],
           "DISRUPTION_EXIT_CODE": env_of["DISRUPTION_EXIT_CODE"],
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30", "LOGLEVEL": "WARNING", "CHAOS_STEP_DELAY": str(step_delay_s)}
    events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    nodes = [Node(i, launch, env, events, work / f"node{i}.log") for i in range(NODES)]
    outcome = Outcome(ok=False)
    if kill is not None:
        outcome.kill, outcome.kill_step, outcome.node = kill
    started = time.monotonic()
    after_kill: _Reformation | None = None
    world = NODES  # the world size of the formation now training (the trainer's "config" event)
    after_restore: _Reformation | None = None  # DROP: the gang growing back once the capacity returned
    for node in nodes:
        node.start()
    try:
        while True:
            if time.monotonic() - started > timeout_s:
                outcome.problems.append(f"not finished within {timeout_s:.0f}s")
                return outcome
            try:
                at, event = events.get(timeout=0.05)
            except queue.Empty:
                at, event = 0.0, {}
            name = event.get("event")
            if event:
                outcome.events.append((at - started, event))
            if name == "config":
                world = int(event["world_size"])
            if after_kill is None or not after_kill.formed:
                if name == "model_loading" and after_kill is None:
                    outcome.saves_skipped = 0  # a formation before the killed one (the trials start one each)
                elif name == "checkpoint_skipped":
                    outcome.saves_skipped += 1
            if name == "batch" and kill is not None and after_kill is None and event["step"] >= kill[1]:
                target = nodes[kill[2]]
                assert target.process is not None
                if kill[0] in ("SIGKILL", "DROP"):
                    target.killed = True
                    target.pending = kill[0] == "DROP"
                    kill_tree(target.process)  # the node is gone, with everything on it
                else:
                    target.process.send_signal(signal.SIGTERM)  # the kubelet stops the pod: SIGTERM to PID 1
                    target.stopping_since = time.monotonic()
                after_kill = _Reformation(time.monotonic())
                outcome.killed_at_s = after_kill.since - started
            if after_kill is not None and not after_kill.formed:
                after_kill.see(name, at, event)
            elif after_kill is not None and outcome.time_to_resume_s is None and name == "batch":
                outcome.time_to_resume_s = at - after_kill.since
                outcome.resumed_step = after_kill.resumed_step
                outcome.steps_lost = after_kill.steps_lost
                outcome.world_after = world
            elif (after_kill is not None and restore_after_steps is not None and after_restore is None
                  and name == "batch" and event["step"] >= after_kill.resumed_step + restore_after_steps):
                for node in nodes:
                    if node.pending:  # the capacity is back: the Pending replacement pod starts
                        node.pending = False
                        node.start()
                        after_restore = _Reformation(time.monotonic())
                        outcome.restored = True
            elif after_restore is not None and not after_restore.formed:
                after_restore.see(name, at, event)
            elif after_restore is not None and outcome.grow_time_s is None and name == "batch":
                outcome.grow_time_s = at - after_restore.since
                outcome.grow_steps_lost = after_restore.steps_lost
            if name == "batch":
                outcome.world_final = world
            if not _control_pods(nodes, job, outcome, grace_s):
                return outcome
            if leader_decides and nodes[0].done:
                break  # index 0 succeeded: the Job is complete, the other pods are removed
            if all(node.done for node in nodes):
                break
    finally:
        for node in nodes:
            node.stop()
        outcome.seconds = time.monotonic() - started
    outcome.ok = True
    return outcome


def final_checkpoint(directory: Path, script: bool = False) -> dict[str, Any] | None:
    """The last checkpoint of a run as {"step", "model"}: the newest complete sharded checkpoint (the bundled
    trainer's and examples/train_fsdp.py's, loaded whole on this one process), else a script's checkpoint.pt (the
    plain examples' format), or a Lightning script's last.ckpt (its state_dict and global_step)."""
    import torch

    from workloads.train.sharded import load_whole
    from workloads.train.tiers import MANIFEST, local_steps, step_dir_name

    for step in local_steps(directory):
        folder = directory / step_dir_name(step)
        if (folder / MANIFEST).exists():
            whole = load_whole(folder)
            return {"step": step, "model": whole["model"]}
    if not script:
        return None
    path, lightning = directory / "checkpoint.pt", directory / "last.ckpt"
    if lightning.exists() and not path.exists():
        saved = torch.load(lightning, map_location="cpu", weights_only=True)
        return {"model": saved["state_dict"], "step": saved["global_step"]}
    return torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None


def lost_bound(checkpoint_every: int, skipped: int = 0) -> int:
    """The most steps a SIGKILL may lose. Saves are asynchronous: the one started last may still be in flight at
    the kill, and the one before it is complete (a save starts only once the previous one is), so 2 x every - 1
    steps; every periodic save skipped since (the previous one still in flight) adds `every`."""
    return (2 + skipped) * checkpoint_every - 1


def check(outcome: Outcome, work: Path, reference: dict[str, Any] | None, checkpoint_every: int,
          script: bool = False) -> None:
    """The trial's assertions, as problems on the outcome."""
    import torch

    counts = trained_ids(work / "samples")
    total = CLASSES * PER_CLASS
    for epoch in range(2):
        seen = counts.get(epoch, Counter())
        if sorted(seen) != list(range(total)) or set(seen.values()) != {1}:
            twice = sorted(i for i, n in seen.items() if n > 1)[:5]
            missing = sorted(set(range(total)) - set(seen))[:5]
            outcome.problems.append(f"epoch {epoch}: not every sample exactly once (twice: {twice}, "
                                    f"missing: {missing})")
    if outcome.counted_failures:
        outcome.problems.append(f"{outcome.counted_failures} failure(s) counted against backoffLimit")
    dropped = outcome.kill == "DROP"
    if dropped:
        if outcome.world_after is not None and outcome.world_after >= NODES:
            outcome.problems.append(f"the gang resumed at {outcome.world_after} nodes after losing one for good")
        if outcome.restored:
            if outcome.grow_time_s is None:
                outcome.problems.append("the capacity came back but the gang never grew back")
            elif outcome.grow_steps_lost != 0:
                outcome.problems.append(f"growing back lost {outcome.grow_steps_lost} steps")
            if outcome.world_final != NODES:
                outcome.problems.append(f"the gang ended at {outcome.world_final} nodes after the capacity came back")
    if outcome.kill is not None:
        if outcome.steps_lost is None:
            outcome.problems.append("no step after the kill")
        elif outcome.kill == "SIGTERM" and outcome.steps_lost != 0:
            outcome.problems.append(f"SIGTERM lost {outcome.steps_lost} steps")
        elif outcome.steps_lost > lost_bound(checkpoint_every, outcome.saves_skipped):
            bound = lost_bound(checkpoint_every, outcome.saves_skipped)
            outcome.problems.append(f"SIGKILL lost {outcome.steps_lost} steps (> {bound}, "
                                    f"{outcome.saves_skipped} periodic save(s) skipped)")
    final = final_checkpoint(work / "checkpoints", script)
    if final is None:
        outcome.problems.append("no final checkpoint")
    elif reference is not None and "model" in reference:
        # a script's batch is per rank: on fewer nodes it takes more steps for the same samples
        if final["step"] != reference["step"] and not (script and dropped):
            outcome.problems.append(f"final step {final['step']}, uninterrupted {reference['step']}")
        differ = [name for name, tensor in reference["model"].items() if not torch.equal(tensor, final["model"][name])]
        # A gang that ran some steps on fewer nodes trained the same global batches, but BatchNorm normalised over
        # other per-rank batches: its weights differ from the uninterrupted run's (its samples and steps do not).
        if differ and not dropped:
            outcome.problems.append(f"final weights differ from the uninterrupted run ({differ[0]}, ...)")
    outcome.ok = outcome.ok and not outcome.problems


def env_value(job: dict[str, Any], name: str) -> str:
    return next(str(item.get("value", "")) for item in job["spec"]["template"]["spec"]["containers"][0]["env"]
                if item["name"] == name)


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p95": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {"median": at(0.5), "p95": at(0.95), "max": ordered[-1]}


SEQ_LEN = 17  # a language model's samples (--tokens): sequences of 17 ids (16 predicted), vocabulary 64
VOCAB = 64


def packed_tokens(root: Path) -> Path:
    """The harness's samples as token sequences for a language-model script (examples/train_fsdp.py): as many
    sequences as the image set has images, packed with `pack-tokens` (field "tokens")."""
    import numpy as np

    from workloads.data.writing.records_pack import RecordPackOptions
    from workloads.data.writing.tokens import pack_tokens

    source = root / "documents"
    source.mkdir(parents=True)
    rng = np.random.default_rng(7)
    documents = 8
    for doc in range(documents):
        length = CLASSES * PER_CLASS * SEQ_LEN // documents
        np.save(source / f"doc{doc}.npy", rng.integers(1, VOCAB, length).astype(np.int32))
    out = root / "tokens"
    pack_tokens(source, out, RecordPackOptions(shard_bytes=SEQ_LEN * 2 * 24, progress=False), seq_len=SEQ_LEN)
    return out


def packed_dataset(root: Path) -> Path:
    """The harness's images packed for the data API (a script reads through PackedData), decoded 32 px."""
    from workloads.data.writing.pack import PackOptions, pack

    out = root / "packed"
    pack(make_dataset(root / "images"), out, PackOptions(layout="decoded", image_size=32, shard_bytes=32 * 32 * 3 * 24,
                                                         workers=1, progress=False))
    return out


def keep_outcome(outcome: Outcome, work: Path) -> None:
    """The outcome as work/outcome.json (its events included), so the trials that finished can be summed up again
    (benchmarks.chaos_goodput.trials_goodput) when a long run is stopped before its summary."""
    (work / "outcome.json").write_text(json.dumps(asdict(outcome)))


def run_trials(root: Path, trials: int, seed: int, checkpoint_every: int,
               progress: Any = None, rank_restarts: int | None = None, elastic: bool = False,
               script: list[str] | None = None, tokens: bool = False) -> dict[str, Any]:
    """An uninterrupted reference run, then `trials` seeded chaos trials; the summary (JSON-ready). Elastic: the
    Job has minNodes 1, and a third of the trials DROP a node (about half of those get the capacity back one step
    after the resume). script: SCRIPT [ARGS] trained instead of the bundled trainer; tokens: on token sequences
    (packed_tokens) rather than the packed images."""
    if script is None:
        data = make_dataset(root / "data")
    else:
        data = packed_tokens(root / "data") if tokens else packed_dataset(root / "data")
    job = rendered_gang_job(rank_restarts, elastic=elastic, script=script)
    scripted = script is not None
    straight = run_gang(root / "straight", data, job, checkpoint_every)
    check(straight, root / "straight", None, checkpoint_every, scripted)
    keep_outcome(straight, root / "straight")
    reference = final_checkpoint(root / "straight" / "checkpoints", scripted)
    if not straight.ok or reference is None:
        return {"ok": False, "reference": straight.problems, "trials": []}
    total_steps = int(reference["step"])
    rng = random.Random(seed)
    results = []
    for number in range(trials):
        kind = rng.choice(list(KINDS) if elastic else ["SIGKILL", "SIGTERM"])
        restore, delay = None, 0.15
        if kind == "DROP":
            # never index 0 (it hosts the rendezvous on a cluster)
            restore = rng.choice([None, 1])
            if restore is None:
                kill = (kind, rng.randint(1, total_steps - 4), rng.randrange(1, NODES))
            else:
                # the returning node needs seconds to start and join: early, and slower steps, so that it finds the
                # gang still training rather than its rendezvous closed
                kill, delay = (kind, rng.randint(1, total_steps // 3), rng.randrange(1, NODES)), 0.6
        else:
            # not the last few steps: the run may end before the signal lands
            kill = (kind, rng.randint(1, total_steps - 4), rng.randrange(NODES))
        work = root / f"trial{number:03d}"
        outcome = run_gang(work, data, job, checkpoint_every, kill, restore_after_steps=restore, step_delay_s=delay,
                           timeout_s=400.0 if restore is not None else 240.0)
        check(outcome, work, reference, checkpoint_every, scripted)
        keep_outcome(outcome, work)
        results.append(outcome)
        if progress is not None:
            progress(number, outcome)
    summary: dict[str, Any] = {"ok": all(o.ok for o in results), "trials": len(results), "seed": seed,
                               "script": script,
                               "command": job["spec"]["template"]["spec"]["containers"][0].get("command"),
                               "rank_restarts": int(env_value(job, "PET_MAX_RESTARTS")),
                               "nnodes": env_value(job, "PET_NNODES"),
                               "rdzv_conf": env_value(job, "PET_RDZV_CONF"),
                               "checkpoint_every": checkpoint_every, "steps_per_run": total_steps,
                               "uninterrupted_seconds": straight.seconds}
    for kind in KINDS:
        of_kind = [o for o in results if o.kill == kind]
        if not of_kind:
            continue
        summary[kind] = {
            "trials": len(of_kind),
            "time_to_resume_s": _quantiles([o.time_to_resume_s for o in of_kind if o.time_to_resume_s is not None]),
            "steps_lost": _quantiles([float(o.steps_lost) for o in of_kind if o.steps_lost is not None]),
            "counted_failures": sum(o.counted_failures for o in of_kind),
        }
        if kind == "DROP":
            grown = [o for o in of_kind if o.restored]
            summary[kind]["resumed_at_nodes"] = sorted({o.world_after for o in of_kind if o.world_after is not None})
            summary[kind]["grow_back"] = {
                "trials": len(grown),
                "time_to_grow_s": _quantiles([o.grow_time_s for o in grown if o.grow_time_s is not None]),
                "steps_lost": _quantiles([float(o.grow_steps_lost) for o in grown if o.grow_steps_lost is not None]),
            }
    summary["goodput"] = trials_goodput(straight, results, checkpoint_every)  # benchmarks/chaos_goodput.py
    summary["failed"] = [{"kill": o.kill, "step": o.kill_step, "node": o.node, "problems": o.problems,
                          "actions": o.actions} for o in results if not o.ok]
    return summary
