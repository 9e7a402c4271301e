"""Chaos trials for a training gang: 2 "nodes" as process groups on 127.0.0.1, each a real torchrun agent (through
workloads.train.launch, as the rendered Jobs run it) with the c10d rendezvous and the gloo backend, a tiny ResNet on
a folder of tiny JPEGs, checkpoints to a local directory shared by the nodes (the EFS claim of a real gang).

The harness plays the kubelet and the Job controller with the restart rules of a rendered 2-node Job: a node that
exits is judged by the Job's podFailurePolicy (benchmarks.gang.pod_failure_action; a node this harness SIGKILLed
carries DisruptionTarget, as a pod on a lost node does) and started again with the same arguments (a replacement
pod), unless the policy fails the Job or the counted failures pass backoffLimit. torchrun's own --max-restarts and
rendezvous join timeout come from the same rendered Job.

One trial: pick a step and a node at random (seeded), and at that step either SIGKILL the node's whole process group
(a lost node, a kernel panic) or SIGTERM its agent (the kubelet stopping the pod: a drain, a Spot notice). Checked:
every sample trained exactly once per epoch (each rank records the sample ids of its batches; the ones after the
checkpoint the next run resumed from are dropped), the final weights equal an uninterrupted run's, steps lost 0 for
SIGTERM and at most --checkpoint-every for SIGKILL, the failure budget untouched. Measured: the time from the kill to
the first step after the resume, and the steps lost.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NODES = 2
CLASSES, PER_CLASS = 3, 32  # 96 JPEGs: 12 steps of 2 x 4 per epoch
TRAIN_ARGS = ["--model", "resnet18", "--width", "8", "--batch-size", "4", "--crop-size", "32", "--image-size",
              "32", "--lr", "0.01", "--log-every", "1", "--epochs", "2", "--workers", "0", "--deterministic",
              "--resume", "--collective-timeout", "30"]


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


def rendered_gang_job(rank_restarts: int | None = None) -> dict[str, Any]:
    """The Job a 2-node spec renders to: its podFailurePolicy, backoffLimit and torchrun settings drive the trials."""
    from workloads.cluster_facts import ClusterFacts, PoolFacts
    from workloads.jobspec import parse_spec, render_job

    facts = ClusterFacts(stack="chaos", label_prefix="ml-cluster.io",
                         pools=(PoolFacts("cpu", None, 0, 0),))
    spec = parse_spec({"name": "chaos", "image": "registry.local/train:1", "gpus": 0, "cpu": "1", "memory": "8Gi",
                       "nodes": NODES, **({} if rank_restarts is None else {"rankRestarts": rank_restarts})})
    job, *_ = render_job(spec, facts)
    return job


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in sessions of their own, so the launcher's process
    group does not hold them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process: subprocess.Popen[str]) -> None:
    """SIGKILL a node: its launcher's process group and every process below it (a lost node loses them all)."""
    below = _descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


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


def trained_ids(log_dir: Path) -> dict[int, Counter[int]]:
    """epoch -> how often each sample id was trained, over every rank's runs (see benchmarks/chaos_worker.py)."""
    by_rank: dict[str, list[tuple[float, int, list[dict[str, Any]]]]] = {}
    for path in log_dir.glob("rank*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not lines or "start" not in lines[0]:
            continue
        rank = path.name.split("-")[0]
        by_rank.setdefault(rank, []).append((lines[0]["time"], lines[0]["start"], lines[1:]))
    counts: dict[int, Counter[int]] = {}
    for runs in by_rank.values():
        runs.sort(key=lambda run: run[0])
        for number, (_, start, batches) in enumerate(runs):
            until = runs[number + 1][1] if number + 1 < len(runs) else None  # the step the next run resumed from
            for k, batch in enumerate(batches, start=1):
                if until is not None and start + k > until:
                    break
                counts.setdefault(batch["epoch"], Counter()).update(batch["ids"])
    return counts


def run_gang(work: Path, data: Path, job: dict[str, Any], checkpoint_every: int,
             kill: tuple[str, int, int] | None = None, timeout_s: float = 240.0, grace_s: float = 30.0,
             step_delay_s: float = 0.15) -> Outcome:
    """One gang run to completion under the harness's Job controller; `kill` = (SIGKILL|SIGTERM, step, node)."""
    from benchmarks.gang import COUNT, FAIL_JOB, pod_failure_action

    env_of = {item["name"]: item.get("value", "") for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    checkpoints, logs = work / "checkpoints", work / "samples"
    logs.mkdir(parents=True)
    port = _free_port()
    launch = [sys.executable, "-m", "workloads.train.launch", "--nnodes", str(NODES), "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", work.name,
              "--max-restarts", env_of["PET_MAX_RESTARTS"], "--rdzv-conf", env_of["PET_RDZV_CONF"],
              "--monitor-interval", "0.5",
              "-m", "benchmarks.chaos_worker", *TRAIN_ARGS, "--data", str(data),
              "--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(checkpoint_every)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CHAOS_LOG_DIR": str(logs),
           "CONFIG_ERROR_EXIT_CODE": env_of["CONFIG_ERROR_EXIT_CODE"],
           "DISRUPTION_EXIT_CODE": env_of["DISRUPTION_EXIT_CODE"],
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30", "LOGLEVEL": "WARNING", "CHAOS_STEP_DELAY": str(step_delay_s)}
    events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    nodes = [Node(i, launch, env, events, work / f"node{i}.log") for i in range(NODES)]
    outcome = Outcome(ok=False)
    if kill is not None:
        outcome.kill, outcome.kill_step, outcome.node = kill
    started = time.monotonic()
    killed_at: float | None = None
    trained_before = 0  # the highest step reported before the gang re-formed
    reformed = False
    resumed_step = 0
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
            if name == "batch" and kill is not None and killed_at is None and event["step"] >= kill[1]:
                target = nodes[kill[2]]
                assert target.process is not None
                if kill[0] == "SIGKILL":
                    target.killed = True
                    kill_tree(target.process)  # the node is gone, with everything on it
                else:
                    target.process.send_signal(signal.SIGTERM)  # the kubelet stops the pod: SIGTERM to PID 1
                    target.stopping_since = time.monotonic()
                killed_at = time.monotonic()
            if killed_at is not None and not reformed:
                if name == "batch":
                    trained_before = max(trained_before, event["step"])
                elif name == "resumed" and at > killed_at:
                    resumed_step = event["step"]
                elif name == "model_loading" and at > killed_at:
                    reformed = True  # a new formation of the gang loaded its model: the next step is the resume
            elif reformed and outcome.time_to_resume_s is None and name == "batch":
                outcome.time_to_resume_s = at - killed_at if killed_at is not None else None
                outcome.resumed_step = resumed_step
                outcome.steps_lost = max(0, trained_before - resumed_step)
            for node in nodes:
                if (node.stopping_since is not None and node.process is not None and node.process.poll() is None
                        and time.monotonic() - node.stopping_since > grace_s):
                    node.killed = True  # the grace period is over: the kubelet SIGKILLs the pod (DisruptionTarget)
                    kill_tree(node.process)
                if node.done or node.process is None or node.process.poll() is None:
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
                    return outcome
                if action == COUNT:
                    outcome.counted_failures += 1
                    if outcome.counted_failures > job["spec"]["backoffLimit"]:
                        outcome.problems.append("backoffLimit spent: the Job fails")
                        return outcome
                node.start()  # the replacement pod
            if all(node.done for node in nodes):
                break
    finally:
        for node in nodes:
            node.stop()
        outcome.seconds = time.monotonic() - started
    outcome.ok = True
    return outcome


def check(outcome: Outcome, work: Path, reference: dict[str, Any] | None, checkpoint_every: int) -> None:
    """The trial's assertions, as problems on the outcome."""
    import torch

    from workloads.train.checkpoint import load_checkpoint

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
    if outcome.kill is not None:
        if outcome.steps_lost is None:
            outcome.problems.append("no step after the kill")
        elif outcome.kill == "SIGTERM" and outcome.steps_lost != 0:
            outcome.problems.append(f"SIGTERM lost {outcome.steps_lost} steps")
        elif outcome.steps_lost > checkpoint_every:
            outcome.problems.append(f"SIGKILL lost {outcome.steps_lost} steps (> {checkpoint_every})")
    final = load_checkpoint(work / "checkpoints")
    if final is None:
        outcome.problems.append("no final checkpoint")
    elif reference is not None:
        if final["step"] != reference["step"]:
            outcome.problems.append(f"final step {final['step']}, uninterrupted {reference['step']}")
        differ = [name for name, tensor in reference["model"].items() if not torch.equal(tensor, final["model"][name])]
        if differ:
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


def run_trials(root: Path, trials: int, seed: int, checkpoint_every: int,
               progress: Any = None, rank_restarts: int | None = None) -> dict[str, Any]:
    """An uninterrupted reference run, then `trials` seeded chaos trials; the summary (JSON-ready)."""
    from workloads.train.checkpoint import load_checkpoint

    data = make_dataset(root / "data")
    job = rendered_gang_job(rank_restarts)
    straight = run_gang(root / "straight", data, job, checkpoint_every)
    check(straight, root / "straight", None, checkpoint_every)
    reference = load_checkpoint(root / "straight" / "checkpoints")
    if not straight.ok or reference is None:
        return {"ok": False, "reference": straight.problems, "trials": []}
    total_steps = int(reference["step"])
    rng = random.Random(seed)
    results = []
    for number in range(trials):
        kind = rng.choice(["SIGKILL", "SIGTERM"])
        # not the last few steps: the run may end before the signal lands
        kill = (kind, rng.randint(1, total_steps - 4), rng.randrange(NODES))
        work = root / f"trial{number:03d}"
        outcome = run_gang(work, data, job, checkpoint_every, kill)
        check(outcome, work, reference, checkpoint_every)
        results.append(outcome)
        if progress is not None:
            progress(number, outcome)
    summary: dict[str, Any] = {"ok": all(o.ok for o in results), "trials": len(results), "seed": seed,
                               "rank_restarts": int(env_value(job, "PET_MAX_RESTARTS")),
                               "checkpoint_every": checkpoint_every, "steps_per_run": total_steps,
                               "uninterrupted_seconds": straight.seconds}
    for kind in ("SIGKILL", "SIGTERM"):
        of_kind = [o for o in results if o.kill == kind]
        summary[kind] = {
            "trials": len(of_kind),
            "time_to_resume_s": _quantiles([o.time_to_resume_s for o in of_kind if o.time_to_resume_s is not None]),
            "steps_lost": _quantiles([float(o.steps_lost) for o in of_kind if o.steps_lost is not None]),
            "counted_failures": sum(o.counted_failures for o in of_kind),
        }
    summary["failed"] = [{"kill": o.kill, "step": o.kill_step, "node": o.node, "problems": o.problems,
                          "actions": o.actions} for o in results if not o.ok]
    return summary
