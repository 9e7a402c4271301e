"""The first evidence from a lent GPU: one run, every step under its own deadline, one summary JSON.

    bash scripts/gpu_evidence.sh                          # on the device machine (installs .whl/ first)
    GPU_EVIDENCE_DRY=1 .venv/bin/python scripts/gpu_evidence.py --out /tmp/ev   # here: tiny sizes, CPU, gloo

Steps, in order of value (each one's commands run under `timeout`-like deadlines, the process group killed):
  environment   nvidia-smi, driver, torch/CUDA/cuDNN/NCCL versions, CPUs, /dev/shm and the work disk
  trainer       scripts/sample_data.py's images packed by `python -m workloads.data pack` into /dev/shm, then the
                bundled trainer as the stack's Jobs run it (workloads.train.launch -> torchrun -> workloads.train,
                checkpoints to local disk, --resume), a first run and a resumed one; its events kept
  gpu_busy      scripts/bench_gpu.py on the packed data: ResNet-50 and ResNet-18, real loader vs synthetic batches
  checkpoint    scripts/bench_checkpoint_device.py: D2H staging, disk, sync vs async save, restore (plain, FSDP2)
  fsdp_example  examples/train_fsdp.py under torchrun --nproc-per-node 1, a few steps, then a resume
  allreduce     not measured: one GPU has no link to measure (no two NCCL ranks on one GPU)

Writes OUT/summary.json (rewritten after every step) and a log per step in OUT; prints one line per step. A step
that needs CUDA on a machine without it says `skipped: no CUDA` and runs its CPU path where it has one.
GPU_EVIDENCE_DRY=1 (or --dry) picks tiny sizes and the CPU; GPU_EVIDENCE_BUDGET_S bounds the whole run;
GPU_EVIDENCE_SKIP=step,step leaves steps out (a second run that repeats only what changed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

STEPS = ["environment", "trainer", "gpu_busy", "checkpoint", "fsdp_example", "allreduce"]
FULL = {"images": 16384, "size": 224, "tokens": 2_000_000, "train": ["--model", "resnet50", "--amp", "bf16",
        "--channels-last", "--batch-size", "128", "--crop-size", "224", "--checkpoint-every", "16",
        "--log-every", "8"], "epochs": (2, 3), "bench": ["--models", "resnet50,resnet18", "--batch-size", "256",
        "--steps", "40", "--warmup", "10"], "state_mib": 3072, "fsdp": ["--dim", "512", "--layers", "4", "--heads",
        "8", "--global-batch-size", "32", "--checkpoint-every", "20"], "fsdp_steps": (60, 100), "slack": 1}
DRY = {"images": 64, "size": 64, "tokens": 20_000, "train": ["--preset", "cpu", "--batch-size", "16",
       "--crop-size", "48", "--checkpoint-every", "2", "--log-every", "1"], "epochs": (1, 2),
       "bench": ["--allow-cpu", "--models", "resnet18", "--batch-size", "8", "--steps", "2", "--warmup", "1",
                 "--width", "8", "--crop", "32"], "state_mib": 8,
       "fsdp": ["--dim", "32", "--layers", "1", "--heads", "2", "--global-batch-size", "8", "--checkpoint-every",
                "3"], "fsdp_steps": (4, 8), "slack": 4}  # slack: this shared 2-CPU machine is slow
ALLREDUCE_NOTE = ("not measured: this machine has one GPU, so there is no GPU-to-GPU link (NVLink, EFA) to time; two "
                  "NCCL ranks on one GPU would time the GPU's own memory, not a link. The checkpoint step's 1-rank "
                  "NCCL all-reduce only shows that NCCL loads and answers here.")


class Evidence:
    """The summary (rewritten whole after each step: temp + rename) and the run's deadline."""

    def __init__(self, out: Path, budget_s: float, dry: bool, slack: float = 1.0) -> None:
        self.out = out
        self.slack = slack
        self.deadline = time.monotonic() + budget_s
        self.started = time.monotonic()
        self.summary: dict[str, Any] = {"dry": dry, "budget_s": budget_s, "steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, seconds: float) -> float:
        """A command's deadline: its own (times the slack) or what is left of the run's, the sooner."""
        return min(seconds * self.slack, self.left())

    def record(self, step: str, result: dict[str, Any]) -> None:
        self.summary["steps"][step] = result
        self.summary["elapsed_s"] = round(time.monotonic() - self.started, 1)
        temporary = self.out / ".summary.json.tmp"
        temporary.write_text(json.dumps(self.summary, indent=1, default=str))
        temporary.replace(self.out / "summary.json")
        short = {k: v for k, v in result.items() if isinstance(v, str | int | float | bool) or v is None}
        print(f"[gpu-evidence] {step}: {json.dumps(short, default=str)[:400]}", flush=True)


def run_logged(argv: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None,
               cwd: Path = REPO) -> tuple[int, float, str]:
    """Run argv in its own process group with stdout+stderr appended to log; after timeout_s the whole group is
    killed (DataLoader workers, torchrun's children) and the exit status is 124, as timeout(1) gives."""
    started = time.monotonic()
    with open(log, "a") as sink:
        sink.write(f"\n$ {' '.join(argv)}\n")
        sink.flush()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sink, cwd=cwd, text=True,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            stdout, _ = process.communicate(timeout=max(1.0, timeout_s))
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
            code = 124
        sink.write(stdout or "")
        sink.write(f"[exit {code} after {time.monotonic() - started:.1f} s]\n")
    return code, round(time.monotonic() - started, 1), stdout or ""


def _tail(log: Path, lines: int = 6) -> list[str]:
    return log.read_text(errors="replace").strip().splitlines()[-lines:] if log.exists() else []


def _json_lines(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


ENV_PROBE = r"""
import json, os, shutil, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
       "cpus": os.cpu_count()}
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception as exc:
    out["cudnn"] = repr(exc)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
               capability=f"{p.major}.{p.minor}", nccl=".".join(map(str, torch.cuda.nccl.version())))
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out["bf16_matmul_ok"] = bool(torch.isfinite((x @ x).float()).all())
from importlib import metadata
for name in ("pydantic", "boto3", "h5py", "numpy", "pillow", "prometheus-client", "nvidia-ml-py", "typing-extensions"):
    try:
        out[name] = metadata.version(name)
    except Exception as exc:
        out[name] = f"missing ({type(exc).__name__})"
print(json.dumps(out))
"""


def _disk(path: str) -> dict[str, Any]:
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    fstype = None
    with open("/proc/mounts") as mounts:  # the longest mount point that holds path
        best = ""
        for line in mounts:
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
    return {"path": path, "fstype": fstype, "total_gib": round(usage.total / 2**30, 1),
            "free_gib": round(usage.free / 2**30, 1)}


def step_environment(ev: Evidence, work: Path) -> dict[str, Any]:
    log = ev.out / "environment.log"
    result: dict[str, Any] = {"status": "ok"}
    for name, argv in (("gpus", ["nvidia-smi", "-L"]), ("smi", ["nvidia-smi", "--query-gpu=name,driver_version,"
                       "memory.total,clocks.max.sm,power.limit,pstate", "--format=csv,noheader"])):
        if shutil.which(argv[0]) is None:
            result[name] = "nvidia-smi not found"
            continue
        code, _, text = run_logged(argv, log, ev.limit(20))
        result[name] = text.strip() if code == 0 else f"exit {code}"
    code, seconds, text = run_logged([sys.executable, "-c", ENV_PROBE], log, ev.limit(60))
    result["python"] = _last_json(text) if code == 0 else {"exit": code, "tail": _tail(log)}
    result.update(shm=_disk("/dev/shm"), work=_disk(str(work)), cpus=os.cpu_count(), python_exe=sys.executable,
                  loadavg=os.getloadavg()[0])
    if code != 0:
        result["status"] = "failed"
    return result


def _write_part(task: tuple[str, int, int, int]) -> int:
    from sample_data import write_images

    folder, count, size, seed = task
    return len(write_images(Path(folder), count, size, seed=seed))


def make_sample_data(root: Path, images: int, size: int, tokens: int) -> Path:
    """scripts/sample_data.py's images (in parallel parts of distinct seeds, merged into one class-folder tree)
    and its token documents."""
    from sample_data import write_tokens

    parts = max(1, min(os.cpu_count() or 1, images // 32))
    tasks = [(str(root / f"part{j}" / "images"), images // parts, size, j) for j in range(parts)]
    with ProcessPoolExecutor(max_workers=parts) as pool:
        list(pool.map(_write_part, tasks))
    tree = root / "images"
    for j in range(parts):
        for path in sorted((root / f"part{j}" / "images").glob("class*/*.jpg")):
            (tree / path.parent.name).mkdir(parents=True, exist_ok=True)
            path.rename(tree / path.parent.name / f"p{j}-{path.name}")
    write_tokens(root / "tokens", tokens)
    return tree


def _trainer_events(text: str) -> dict[str, Any]:
    events = _json_lines(text)
    keep: dict[str, Any] = {"epochs": [], "checkpoints": [], "batches": []}
    for event in events:
        kind = event.get("event")
        if kind in ("first_step", "resumed", "done", "data_preparation", "model_loading"):
            keep[kind] = event
        elif kind == "config":
            keep["device"] = event.get("device")
        elif kind == "epoch":
            keep["epochs"].append({k: event.get(k) for k in ("epoch", "epoch_time", "throughput", "data_share",
                                                             "gpu_utilization", "checkpoint_time", "batches")})
        elif kind in ("checkpoint", "checkpoint_skipped"):
            keep["checkpoints"].append(event)
        elif kind == "batch":
            keep["batches"].append({k: event.get(k) for k in ("step", "loss", "data_time", "compute_time",
                                                              "gpu_utilization")})
    keep["batches"] = keep["batches"][-4:]
    return keep


def step_trainer(ev: Evidence, work: Path, sizes: dict[str, Any], cuda: bool) -> dict[str, Any]:
    log = ev.out / "trainer.log"
    result: dict[str, Any] = {"status": "ok", "device": "cuda" if cuda else "cpu (skipped: no CUDA; CPU path)"}
    started = time.monotonic()
    source = make_sample_data(work / "sample", sizes["images"], sizes["size"], sizes["tokens"])
    result["sample_data_s"] = round(time.monotonic() - started, 1)
    need = sizes["images"] * sizes["size"] ** 2 * 3 * 1.2
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and shutil.disk_usage(shm).free > 2 * need else work
    packed = Path(tempfile.mkdtemp(prefix="gpu-evidence-", dir=base)) / "packed"
    result["data_dir"] = str(packed)
    code, seconds, _ = run_logged([sys.executable, "-m", "workloads.data", "pack", str(source), str(packed),
                                   "--size", str(sizes["size"]), "--workers", str(max(1, (os.cpu_count() or 2) - 2)),
                                   "--no-progress"], log, ev.limit(90))
    result["pack"] = {"exit": code, "seconds": seconds}
    if code != 0:
        result.update(status="failed", where="pack", tail=_tail(log))
        return result
    ckpt = work / "trainer-ckpt"
    workers = str(max(1, min(12, (os.cpu_count() or 2) - 2))) if cuda else "1"
    for name, epochs, limit in (("first", sizes["epochs"][0], 90), ("resumed", sizes["epochs"][1], 75)):
        argv = [sys.executable, "-m", "workloads.train.launch", "--standalone", "--nproc-per-node", "1",
                "--module", "workloads.train", "--data", str(packed), "--checkpoint-dir", str(ckpt), "--resume",
                "--epochs", str(epochs), *sizes["train"], "--workers", workers]
        code, seconds, text = run_logged(argv, log, ev.limit(limit), env={"PYTHONUNBUFFERED": "1"})
        result[name] = {"exit": code, "seconds": seconds, **_trainer_events(text)}
        if code != 0:
            result.update(status="failed", where=name, tail=_tail(log, 12))
            return result
    resumed = result["resumed"].get("resumed") or {}
    result["resume_ok"] = bool(resumed) and result["resumed"].get("done") is not None
    return result


def step_gpu_busy(ev: Evidence, sizes: dict[str, Any], cuda: bool, packed: str | None) -> dict[str, Any]:
    log = ev.out / "bench_gpu.log"
    if packed is None:
        return {"status": "skipped: the trainer step packed no data"}
    workers = str(max(1, min(12, (os.cpu_count() or 2) - 2))) if cuda else "1"
    argv = [sys.executable, "scripts/bench_gpu.py", "--data", packed, "--workers", workers, "--json", *sizes["bench"]]
    code, seconds, text = run_logged(argv, log, ev.limit(150), env={"PYTHONUNBUFFERED": "1"})
    report = None
    try:
        report = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        report = None
    status = "ok" if code == 0 and report else "failed"
    return {"status": status if cuda or status != "ok" else "skipped: no CUDA (CPU path ran)", "exit": code,
            "seconds": seconds, "report": report, **({} if status == "ok" else {"tail": _tail(log)})}


def step_checkpoint(ev: Evidence, work: Path, sizes: dict[str, Any], cuda: bool) -> dict[str, Any]:
    log = ev.out / "checkpoint.log"
    argv = [sys.executable, "scripts/bench_checkpoint_device.py", "--device", "cuda" if cuda else "cpu",
            "--state-mib", str(sizes["state_mib"]), "--workdir", str(work), "--json"]
    code, seconds, text = run_logged(argv, log, ev.limit(120), env={"PYTHONUNBUFFERED": "1"})
    report = _last_json(text)
    ok = code == 0 and report is not None and "rows" in report and all(r.get("restored_equal") for r in
                                                                       report["rows"])
    status = ("ok" if cuda else "skipped: no CUDA (CPU path ran)") if ok else "failed"
    partial = {} if ok else {"partial": [e for e in _json_lines(text) if "phase" in e], "tail": _tail(log)}
    return {"status": status, "exit": code, "seconds": seconds, "report": report if ok else None, **partial}


def step_fsdp(ev: Evidence, work: Path, sizes: dict[str, Any], cuda: bool) -> dict[str, Any]:
    log = ev.out / "fsdp.log"
    tokens = work / "tokens-packed"
    code, seconds, _ = run_logged([sys.executable, "-m", "workloads.data", "pack-tokens", str(work / "sample" /
                                   "tokens"), str(tokens), "--seq-len", "257", "--dtype", "uint16", "--eos", "0",
                                   "--no-progress"], log, ev.limit(60))
    result: dict[str, Any] = {"status": "ok" if cuda else "skipped: no CUDA (CPU path ran)",
                              "pack_tokens": {"exit": code, "seconds": seconds},
                              "note": "one rank: the example makes no process group (NCCL is not used at 1 rank)"}
    if code != 0:
        return {**result, "status": "failed", "where": "pack-tokens", "tail": _tail(log)}
    for name, steps in (("first", sizes["fsdp_steps"][0]), ("resumed", sizes["fsdp_steps"][1])):
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                "examples/train_fsdp.py", "--data", str(tokens), "--vocab-size", "512", "--checkpoint-dir",
                str(work / "fsdp-ckpt"), "--max-steps", str(steps), *sizes["fsdp"]]
        code, seconds, text = run_logged(argv, log, ev.limit(75), env={"PYTHONUNBUFFERED": "1"})
        events = _json_lines(text)
        result[name] = {"exit": code, "seconds": seconds,
                        "events": [e for e in events if e.get("event") in ("stopped", "done", "epoch",
                                                                           "checkpoint", "checkpoint_skipped")][-6:]}
        if code != 0:
            return {**result, "status": "failed", "where": name, "tail": _tail(log)}
    stopped = [e for e in result["resumed"]["events"] if e.get("event") == "stopped"]
    result["resume_ok"] = bool(stopped) and stopped[-1].get("step") == sizes["fsdp_steps"][1]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-evidence-out"))
    parser.add_argument("--work", type=Path, default=None, help="local-disk scratch (default: a temporary folder "
                                                                "under /var/tmp)")
    parser.add_argument("--dry", action="store_true", default=os.environ.get("GPU_EVIDENCE_DRY") == "1")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("GPU_EVIDENCE_BUDGET_S") or 0) or None)
    args = parser.parse_args(argv)
    budget = args.budget_s or (1200.0 if args.dry else 330.0)
    sizes = DRY if args.dry else FULL
    base = args.work or (Path("/var/tmp") if Path("/var/tmp").is_dir() else None)
    work = Path(tempfile.mkdtemp(prefix="gpu-evidence-work-", dir=base))
    ev = Evidence(args.out, budget, args.dry, sizes["slack"])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    if args.dry:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the dry run takes the CPU paths even where a GPU is
    try:
        environment = _guarded(ev, "environment", lambda: step_environment(ev, work))
        cuda = bool((environment.get("python") or {}).get("cuda_available")) and not args.dry
        trainer = _guarded(ev, "trainer", lambda: step_trainer(ev, work, sizes, cuda))
        _guarded(ev, "gpu_busy", lambda: step_gpu_busy(ev, sizes, cuda, trainer.get("data_dir")))
        _guarded(ev, "checkpoint", lambda: step_checkpoint(ev, work, sizes, cuda))
        _guarded(ev, "fsdp_example", lambda: step_fsdp(ev, work, sizes, cuda))
        ev.record("allreduce", {"status": ALLREDUCE_NOTE})
    finally:
        for path in (work, Path(str(ev.summary["steps"].get("trainer", {}).get("data_dir", ""))).parent):
            if str(path) not in ("", ".") and "gpu-evidence" in str(path):
                shutil.rmtree(path, ignore_errors=True)
    failed = [name for name, step in ev.summary["steps"].items() if str(step.get("status")).startswith("failed")]
    print(f"[gpu-evidence] done in {ev.summary['elapsed_s']} s; failed steps: {', '.join(failed) or 'none'}; "
          f"summary: {args.out / 'summary.json'}", flush=True)
    return 1 if failed else 0


def _guarded(ev: Evidence, step: str, body: Any) -> dict[str, Any]:
    """Run one step; an exception in the harness itself is recorded as the step's failure, and the run goes on.
    A step with under 10 s of the budget left is not started."""
    if step in os.environ.get("GPU_EVIDENCE_SKIP", "").split(","):
        result: dict[str, Any] = {"status": "skipped: GPU_EVIDENCE_SKIP"}
    elif ev.left() < 10:
        result = {"status": "skipped: the run's time budget is spent"}
    else:
        try:
            result = body()
        except Exception as exc:  # the harness's own failure: recorded, the next step still runs
            result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    ev.record(step, result)
    return result


if __name__ == "__main__":
    sys.exit(main())
