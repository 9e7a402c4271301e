"""A local S3 stand-in for trying the data path on a laptop: moto's S3 server on 127.0.0.1, started and stopped by
its process id.

    .venv/bin/python scripts/local_s3.py start [--port 9000] [--bucket datasets ...]   # prints the endpoint URL
    .venv/bin/python scripts/local_s3.py stop

`start` runs `python -m moto.server -H 127.0.0.1 -p PORT` in the background, waits (at most --timeout seconds)
until it answers, creates the buckets, and records the server's PID in .local-s3/pid (its log: .local-s3/server.log).
`stop` ends that process only (checked to be the moto server it started), waiting at most 10 s before SIGKILL.
Objects live in the server's memory: a stop forgets them. Credentials are moto's: any key works (the tools read the
usual AWS variables; `start` prints the ones to export). Errors: `error: <where>: <why>`, exit 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

STATE = Path(".local-s3")
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class LocalS3Error(Exception):
    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer, even an error, is a server that listens
    except OSError:
        return False


def _running_pid(state: Path) -> int | None:
    """The PID in state/pid if that process is still the moto server started from here, else None."""
    try:
        pid = int((state / "pid").read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if b"moto.server" in command else None


def start(port: int, buckets: list[str], state: Path, timeout_s: float) -> str:
    url = f"http://127.0.0.1:{port}"
    if _running_pid(state) is not None:
        raise LocalS3Error(str(state / "pid"), "a local S3 server started from here is still running: stop it first")
    if _answers(url):
        raise LocalS3Error(f"--port {port}", "something already listens there: pick another port")
    state.mkdir(exist_ok=True)
    with open(state / "server.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    pid_file = state / "pid"
    temp = pid_file.with_suffix(".tmp")
    with open(temp, "w") as handle:
        handle.write(f"{process.pid}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, pid_file)
    deadline = time.monotonic() + timeout_s
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(state)
            raise LocalS3Error(str(state / "server.log"), f"the server did not answer on {url} within "
                                                           f"{timeout_s:g}s")
        time.sleep(0.2)
    import boto3

    client = boto3.client("s3", endpoint_url=url, region_name=ENV["AWS_DEFAULT_REGION"],
                          aws_access_key_id=ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"])
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
    return url


def stop(state: Path) -> bool:
    """End the server started from `state`; False if none was running."""
    pid = _running_pid(state)
    (state / "pid").unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _running_pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running_pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def _running_pid_alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[-1].split()[0] != "Z"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/local_s3.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--port", type=int, default=9000, help="port on 127.0.0.1 (default 9000)")
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    parser.add_argument("--state", type=Path, default=STATE, help="where the PID and log go (default .local-s3)")
    parser.add_argument("--timeout", type=float, default=30.0, help="longest wait for the server (seconds)")
    args = parser.parse_args(argv)
    try:
        if args.action == "stop":
            print("stopped" if stop(args.state) else "no local S3 server was running")
            return 0
        if not 0 < args.port < 65536:
            raise LocalS3Error("--port", f"{args.port} is not a TCP port")
        url = start(args.port, args.bucket, args.state, args.timeout)
    except LocalS3Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"local S3 on {url} (pid {_running_pid(args.state)}); stop it with: .venv/bin/python scripts/local_s3.py "
          "stop")
    print("export " + " ".join(f"{key}={value}" for key, value in ENV.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
