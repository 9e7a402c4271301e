"""Check the chart packages the render check uses (tests/charts/upstream) against what upstream published.

    python scripts/vendored_charts.py                 # each vendored package against its recorded source
    python scripts/vendored_charts.py --pulled DIR    # ... and the packages `helm pull` wrote to DIR (CI)

tests/charts/upstream/SOURCES.json records each package one of two ways:
- "sha256": the vendored file is the published package itself (the digest in the chart repository's index.yaml);
  a pulled package must be the same bytes.
- "tree": the vendored file was packaged from the chart's source at its release tag; "tree" is the git tree id of
  the chart's files (subchart packages unpacked in place, Chart.lock left out), which equals the tag's tree for a
  chart with no dependencies; a pulled package must hold the same files.
Exit 0 when everything matches; 2 with one `error: <package>: <why>` line per mismatch.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.cli import ArgumentParser  # noqa: E402

UPSTREAM = Path(__file__).resolve().parent.parent / "tests" / "charts" / "upstream"
SOURCES = UPSTREAM / "SOURCES.json"
MAX_PACKAGE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 4  # subcharts of subcharts


def chart_files(data: bytes, depth: int = 0) -> Iterator[tuple[str, bytes]]:
    """(path below the chart's own directory, content) of every regular file of a chart package; a subchart
    package (charts/<name>-<version>.tgz) is unpacked in place as charts/<its directory>/..."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            top, _, rest = member.name.partition("/")
            if not rest or rest == "Chart.lock":
                continue
            handle = archive.extractfile(member)
            content = handle.read() if handle is not None else b""
            if rest.startswith("charts/") and rest.endswith(".tgz") and rest.count("/") == 1 and depth < MAX_DEPTH:
                for sub_path, sub_content in _subchart(content, depth + 1):
                    yield f"charts/{sub_path}", sub_content
            else:
                yield rest, content


def _subchart(data: bytes, depth: int) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        names = {m.name.partition("/")[0] for m in archive.getmembers() if m.name}
    [name] = names
    for path, content in chart_files(data, depth):
        yield f"{name}/{path}", content


def git_tree_id(files: dict[str, bytes]) -> str:
    """The id git gives the directory holding `files` (every file mode 100644), as `git rev-parse <tag>:<dir>`."""
    entries: dict[str, tuple[str, bytes]] = {}
    children: dict[str, dict[str, bytes]] = {}
    for path, content in files.items():
        head, _, rest = path.partition("/")
        if rest:
            children.setdefault(head, {})[rest] = content
        else:
            blob = hashlib.sha1(b"blob %d\0" % len(content) + content).digest()
            entries[head] = ("100644", blob)
    for name, sub in children.items():
        entries[name] = ("40000", bytes.fromhex(git_tree_id(sub)))
    # git orders entries by name, a tree's name compared as if it ended in "/"
    body = b"".join(f"{mode} {name}".encode() + b"\0" + sha for name, (mode, sha) in
                    sorted(entries.items(), key=lambda item: item[0] + ("/" if item[1][0] == "40000" else "")))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def package_tree(data: bytes) -> str:
    return git_tree_id(dict(chart_files(data)))


def _read(path: Path) -> bytes:
    if not path.is_file() or path.is_symlink():
        raise ValueError("not a regular file")
    if path.stat().st_size > MAX_PACKAGE_BYTES:
        raise ValueError(f"larger than {MAX_PACKAGE_BYTES} bytes")
    return path.read_bytes()


def check(package: str, data: bytes, source: dict[str, str]) -> str | None:
    """Why `data` is not the package `source` records, or None."""
    try:
        if "sha256" in source:
            digest = hashlib.sha256(data).hexdigest()
            return None if digest == source["sha256"] else f"sha256 {digest}, upstream's is {source['sha256']}"
        tree = package_tree(data)
        return None if tree == source["tree"] else f"chart files {tree}, the recorded source tree is {source['tree']}"
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        return f"not a chart package ({exc})"


def problems(sources: dict[str, dict[str, str]], upstream: Path = UPSTREAM,
             pulled: Path | None = None) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    vendored = {path.name for path in upstream.glob("*.tgz")}
    found += [(name, "vendored but not in SOURCES.json") for name in sorted(vendored - sources.keys())]
    found += [(name, "in SOURCES.json but not vendored") for name in sorted(sources.keys() - vendored)]
    for name in sorted(vendored & sources.keys()):
        places = [("vendored", upstream / name)] + ([("pulled", pulled / name)] if pulled is not None else [])
        for label, path in places:
            if label == "pulled" and not path.exists():
                continue  # a chart no stack plan releases is not pulled
            try:
                why = check(name, _read(path), sources[name])
            except (OSError, ValueError) as exc:
                why = str(exc)
            if why:
                found.append((f"{label} {name}", why))
    return found


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Check vendored chart packages against what upstream published.")
    parser.add_argument("--pulled", type=Path, metavar="DIR", help="packages `helm pull` wrote (CI)")
    args = parser.parse_args(argv)
    try:
        sources = json.loads(_read(SOURCES))["packages"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {SOURCES}: {exc}", file=sys.stderr)
        return 2
    found = problems(sources, UPSTREAM, args.pulled)
    for where, why in found:
        print(f"error: {where}: {why}", file=sys.stderr)
    if not found:
        print(f"ok: {len(sources)} vendored chart packages match their recorded sources"
              + (f" and the pulled ones in {args.pulled}" if args.pulled else ""))
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
