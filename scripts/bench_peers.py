"""Our data path against the streaming libraries users would pick instead, on the same object-storage path.

The same generated ImageNet-like JPEGs, one moto S3 server on 127.0.0.1 behind the latency proxy (+20 ms round
trip, 20 MB/s per connection), 2 DataLoader workers, uint8 batches (128, 160, 160, 3), in two layouts (decoded
uint8 arrays, encoded JPEG bytes). Contenders (benchmarks/peers.py): ours (pack, upload, copy staging,
HDF5Dataset; encoded: decoded samples kept for later epochs), ours-redecode (the same without keeping them),
ours-cache (the stager CLI as a staging cache beside the reader: training starts with the first
shards), MosaicML Streaming, LitData, WebDataset over HTTP, s3torchconnector (raw JPEG objects), and the bounded-disk
rows ours-cache40, streaming-cache40 and litdata-cache40 (local cache limited to 40% of the converted dataset, with
shards of 1/16 of it). Each contender runs in its own process, interleaved over rounds; the parent samples the
process tree's RSS and the contender's local disk.

Multi-field layouts (--layouts captions,tokens; benchmarks/peers_records.py): "captions" pairs each JPEG with a
caption (batches of uint8 images and str captions), "tokens" cuts a generated corpus of --tokens uint16 ids into
sequences of 513 (int32 batches); contenders ours, ours-cache, ours-redecode (captions), Streaming, LitData and
their bounded rows.

Mixture layout (--layouts mixture; benchmarks/peers_mixture.py): the JPEGs as two sources read at 0.7 / 0.3: ours
(MixedData: one stager, one sampler), Streaming (Stream proportions) and LitData (CombinedStreamingDataset weights).

Reported per contender and layout (best round by 20-epoch total): conversion (+ upload), time to first batch
(from creating the dataset, downloads included), cold epoch samples/s, warm epoch samples/s, the 20-epoch total
(conversion + cold epoch + 19 x median warm epoch), peak local disk and peak RSS (all processes). A contender whose
package is missing or that fails says so, with the reason, instead of a number.

Run it in the benchmark venv (peers are never installed in the project's venv):

    make bench-peers
    .venv-bench/bin/python scripts/bench_peers.py [--images 2048] [--rounds 2] [--epochs 3] [--layouts decoded,encoded]
                                                  [--tokens 4000000] (with --layouts captions,tokens)
                                                  [--contenders ours,ours-cache,streaming,litdata,...]
                                                  [--checkouts base=/work/wt/base,...] [--json]

--checkouts runs the ours* contenders of other checkouts too (their own harness and code, e.g. a worktree of the
previous commit), interleaved with this one's in the same rounds (this checkout first in even rounds, last in odd
ones), as rows NAME@LABEL: a data-path change is compared with the code before it on the same machine at the same
load. Each row also lists every round's 20-epoch total (`round_totals_s`, null for a round that failed); --jpegs DIR
reuses (or fills, when empty) one folder of generated JPEGs across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from benchmarks.netem import local_s3_behind_latency  # noqa: E402
from benchmarks.peers import (  # noqa: E402
    BOUNDED,
    BOUNDED_FRACTION,
    BOUNDED_SHARDS,
    CONTENDERS,
    MIXTURE,
    PACKAGES,
    RECORD_LAYOUTS,
    Context,
    NotApplicable,
    clear,
)
from benchmarks.peers_common import tree_bytes  # noqa: E402
from benchmarks.peers_records import TOKENS_DIR, write_token_corpus  # noqa: E402

BUCKET = "bench-peers"
STUDY_EPOCHS = 20


def _child(args: argparse.Namespace) -> int:
    """Run one contender in this process and print one JSON line."""
    import torch

    torch.set_num_threads(1)
    ctx = Context(**json.loads(args.child))
    ctx = dataclasses.replace(ctx, jpegs=Path(ctx.jpegs), local=Path(ctx.local), scratch=Path(ctx.scratch))
    try:
        measured = CONTENDERS[args.contender](ctx)
    except NotApplicable as exc:
        print(json.dumps({"status": "n/a", "reason": str(exc)}))
        return 0
    except Exception as exc:  # a peer that fails is a row that says why, not a traceback
        print(json.dumps({"status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                          if str(exc) else type(exc).__name__}))
        return 0
    print(json.dumps({"status": "ok", **dataclasses.asdict(measured)}))
    return 0


def _watch(pid: int, local: Path, stop: threading.Event, peaks: dict[str, int]) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.wait(0.1):
        rss = 0
        try:
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # a worker that just exited
                    rss += process.memory_info().rss
        except psutil.Error:
            break
        peaks["rss"] = max(peaks.get("rss", 0), rss)
        peaks["disk"] = max(peaks.get("disk", 0), tree_bytes(local))


def _run_contender(name: str, ctx: Context, timeout_s: float, repo: Path = REPO) -> dict[str, Any]:
    """One contender in a child process: this checkout's, or with `repo`, another checkout's harness and code."""
    package = PACKAGES.get(name)
    if package and importlib.util.find_spec(package.replace("mosaicml-", "").replace("-", "_")) is None:
        return {"status": "not installed", "reason": f"{package} is not installed in {sys.prefix}"}
    clear(ctx.local)
    clear(ctx.scratch)
    ctx.local.mkdir(parents=True)
    ctx.scratch.mkdir(parents=True)
    payload = json.dumps({key: str(value) if isinstance(value, Path) else value
                          for key, value in dataclasses.asdict(ctx).items()})
    command = [sys.executable, str(repo / "scripts" / "bench_peers.py"), "--contender", name, "--child", payload]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(repo)})
    stop, peaks = threading.Event(), {}
    watcher = threading.Thread(target=_watch, args=(process.pid, ctx.local, stop, peaks), daemon=True)
    watcher.start()
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"status": "failed", "reason": f"timed out after {timeout_s:g}s"}
    finally:
        stop.set()
        watcher.join()
        clear(ctx.local)
        clear(ctx.scratch)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return {"status": "failed", "reason": f"exit {process.returncode}: {tail}"}
    result = json.loads(lines[-1])
    if result["status"] == "ok":
        warm = statistics.median(result["epoch_s"][1:])
        result["total_20_s"] = result["convert_s"] + result["epoch_s"][0] + (STUDY_EPOCHS - 1) * warm
        result["cold_samples_s"] = result["samples"] / result["epoch_s"][0]
        result["warm_samples_s"] = result["samples"] / warm
        result["peak_disk_bytes"] = peaks.get("disk", 0)
        result["peak_rss_bytes"] = peaks.get("rss", 0)
    return result


def _table(report: dict[str, Any]) -> str:
    header = (f"{'layout':<9}{'contender':<18}{'convert s':>10}{'1st batch s':>12}{'cold/s':>9}{'warm/s':>9}"
              f"{'20 ep s':>9}{'disk MB':>9}{'RSS MB':>8}")
    rows = [header]
    for layout, entries in report["layouts"].items():
        for name, entry in entries.items():
            if entry["status"] != "ok":
                rows.append(f"{layout:<9}{name:<18}{entry['status']}: {entry['reason']}")
                continue
            rows.append(f"{layout:<9}{name:<18}{entry['convert_s']:>10.2f}{entry['first_batch_s']:>12.2f}"
                        f"{entry['cold_samples_s']:>9.0f}{entry['warm_samples_s']:>9.0f}{entry['total_20_s']:>9.1f}"
                        f"{entry['peak_disk_bytes'] / 1e6:>9.0f}{entry['peak_rss_bytes'] / 1e6:>8.0f}")
        for kind, ratio in (report["ratios"].get(layout) or {}).items():
            rows.append(f"{'':<9}{kind}: 20 epochs {ratio['ours']} / {ratio['peer']} = {ratio['total']:.2f} "
                        f"(goal <= 0.8); first batch {ratio['first_ours']} / {ratio['first_peer']} = "
                        f"{ratio['first_batch']:.2f} (goal <= 1)")
    rows.append(f"{report['images']} images, {report['size']} px, +{report['latency_ms']:g} ms RTT, "
                f"{report['per_connection_mb_s']:g} MB/s per connection, {report['epochs']} epochs measured, "
                f"best of {report['rounds']} rounds; load average start {report['load_start']} "
                f"end {report['load_end']}")
    return "\n".join(rows)


def _ratios(entries: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Our best row against the best peer that completed, separately with unbounded and with bounded local disk
    (rows of other checkouts, NAME@LABEL, are for comparing checkouts, not peers)."""
    ok = {name: entry for name, entry in entries.items() if entry["status"] == "ok" and "@" not in name}
    out = {}
    kinds = {"unbounded": [n for n in ok if n not in BOUNDED], "bounded": [n for n in ok if n in BOUNDED]}
    for kind, names in kinds.items():
        ours = [n for n in names if n.startswith("ours")]
        peers = [n for n in names if not n.startswith("ours")]
        if not ours or not peers:
            continue
        best_ours = min(ours, key=lambda n: ok[n]["total_20_s"])
        first_ours = min(ours, key=lambda n: ok[n]["first_batch_s"])
        best = min(peers, key=lambda n: ok[n]["total_20_s"])
        first = min(peers, key=lambda n: ok[n]["first_batch_s"])
        out[kind] = {"ours": best_ours, "peer": best, "total": ok[best_ours]["total_20_s"] / ok[best]["total_20_s"],
                     "first_ours": first_ours, "first_peer": first,
                     "first_batch": ok[first_ours]["first_batch_s"] / ok[first]["first_batch_s"]}
    return out or None


def _context(args: argparse.Namespace, work: Path, endpoint: str, layout: str, name: str) -> Context:
    ctx = Context(jpegs=work / "jpegs", local=work / "local", scratch=work / "scratch", endpoint=endpoint,
                  bucket=BUCKET, layout=layout, size=args.size, epochs=args.epochs)
    if name == "ours-redecode":
        ctx = dataclasses.replace(ctx, keep_decoded=False)
    if name in BOUNDED:
        estimate = (args.images * args.size * args.size * 3 if layout in ("decoded", MIXTURE)
                    else 2 * args.tokens if layout == "tokens" else tree_bytes(work / "jpegs"))
        ctx = dataclasses.replace(ctx, budget_fraction=BOUNDED_FRACTION,
                                  shard_bytes=max(1 << 20, estimate // BOUNDED_SHARDS))
    return ctx


def _round_order(runs: list[tuple[str, str, Path]], round_number: int) -> list[tuple[str, str, Path]]:
    """This checkout's row before the other checkouts' rows of the same contender in even rounds, after them in odd
    rounds (the order within a round does not favour one checkout)."""
    if round_number % 2 == 0:
        return runs
    out: list[tuple[str, str, Path]] = []
    for label, name, repo in runs:
        if "@" in label:
            out.insert(next(i for i, run in enumerate(out) if run[0] == name), (label, name, repo))
        else:
            out.append((label, name, repo))
    return out


def parse_checkouts(text: str) -> list[tuple[str, Path]]:
    """--checkouts "base=/path,prev=/path" -> [(label, repo root)]; ValueError names the bad entry."""
    out: list[tuple[str, Path]] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        label, _, path = item.partition("=")
        repo = Path(path).expanduser().resolve()
        if not label or not label.isidentifier() or not (repo / "scripts" / "bench_peers.py").is_file():
            raise ValueError(f"{item!r}: expected LABEL=PATH of a checkout holding scripts/bench_peers.py")
        out.append((label, repo))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each entry keeps its best")
    parser.add_argument("--epochs", type=int, default=3, help="epochs measured per contender (>= 2)")
    parser.add_argument("--layouts", default="decoded,encoded", help="decoded, encoded, captions, tokens, mixture")
    parser.add_argument("--tokens", type=int, default=4_000_000, help="token ids in the tokens layout's corpus")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--per-connection-mb-s", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="per contender run, seconds")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--checkouts", default="", help="LABEL=PATH,...: other checkouts (e.g. the previous commit's "
                        "worktree) whose ours* contenders run too, interleaved in the same rounds, as NAME@LABEL")
    parser.add_argument("--jpegs", type=Path, default=None, help="the generated JPEGs' folder, kept for the next "
                        "run (filled when missing)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    layouts = [item for item in args.layouts.split(",") if item]
    contenders = [item for item in args.contenders.split(",") if item]
    bad = [name for name in contenders if name not in CONTENDERS] + [
        layout for layout in layouts if layout not in ("decoded", "encoded", *RECORD_LAYOUTS, MIXTURE)]
    if bad or args.epochs < 2 or args.images < 128:
        print(f"error: --contenders/--layouts/--epochs/--images: unknown {bad} or too few epochs (>= 2) or images "
              f"(>= 128)", file=sys.stderr)
        return 2
    try:
        checkouts = parse_checkouts(args.checkouts)
    except ValueError as exc:
        print(f"error: --checkouts: {exc}", file=sys.stderr)
        return 2
    runs = [run for name in contenders for run in [(name, name, REPO)] + [
        (f"{name}@{label}", name, repo) for label, repo in checkouts if name.startswith("ours")]]
    if importlib.util.find_spec("psutil") is None:
        print(f"error: {sys.executable}: psutil missing (run `make bench-peers`, which builds .venv-bench)",
              file=sys.stderr)
        return 2
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_REGION="us-east-1")
    from bench_loader import generate

    load_start = round(os.getloadavg()[0], 2)
    results: dict[str, dict[str, Any]] = {layout: {} for layout in layouts}
    with tempfile.TemporaryDirectory(prefix="bench-peers-", dir=args.workdir) as tmp, \
            local_s3_behind_latency(args.latency_ms, args.per_connection_mb_s) as s3:
        work = Path(tmp)
        if args.jpegs is None:
            generate(work / "jpegs", args.images)
        else:
            if not any(args.jpegs.rglob("*.jpg")):
                generate(args.jpegs, args.images)
            (work / "jpegs").symlink_to(args.jpegs.resolve(), target_is_directory=True)
        if "tokens" in layouts:
            write_token_corpus(work / TOKENS_DIR, args.tokens)
        from workloads.data.moving.s3 import make_client

        make_client(s3.direct_url, 4, botocore_attempts=3).create_bucket(Bucket=BUCKET)
        for round_number in range(args.rounds):
            for layout in layouts:
                for label, name, repo in _round_order(runs, round_number):
                    ctx = _context(args, work, s3.endpoint_url, layout, name)
                    result = _run_contender(name, ctx, args.timeout, repo)
                    result["round"] = round_number
                    result["load_average"] = round(os.getloadavg()[0], 2)
                    figure = f" {result['total_20_s']:.1f} s" if result["status"] == "ok" else ""
                    print(f"round {round_number} {layout} {label}: {result['status']}{figure} "
                          f"{result.get('reason', '')}", file=sys.stderr, flush=True)
                    best = results[layout].get(label)
                    totals = [*(best or {}).get("round_totals_s", []), result.get("total_20_s")]
                    if best is None or (result["status"] == "ok" and (
                            best["status"] != "ok" or result["total_20_s"] < best["total_20_s"])):
                        results[layout][label] = result
                    results[layout][label]["round_totals_s"] = totals
    report = {"layouts": results, "ratios": {layout: _ratios(entries) for layout, entries in results.items()},
              "images": args.images, "size": args.size, "latency_ms": args.latency_ms,
              "per_connection_mb_s": args.per_connection_mb_s, "epochs": args.epochs, "rounds": args.rounds,
              "tokens": args.tokens if "tokens" in layouts else None,
              "load_start": load_start, "load_end": round(os.getloadavg()[0], 2)}
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
