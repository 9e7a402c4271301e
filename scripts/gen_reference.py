"""Write docs/reference/ (every stack config key and Job spec field) and its JSON Schemas from the pydantic models.

    python scripts/gen_reference.py           # regenerate (after changing a model in infra/config or workloads/jobspec)
    python scripts/gen_reference.py --check   # exit 1 and name the stale files instead of writing
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.config.reference import ROOT, outputs  # noqa: E402


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(out.name, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed files (default: write)")
    args = parser.parse_args(argv)
    stale = []
    for relative, text in outputs().items():
        path = ROOT / relative
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(relative)
        if not args.check:
            _write(path, text)
            print(f"wrote {relative}")
    if args.check and stale:
        for relative in stale:
            print(f"error: {relative}: stale; run python scripts/gen_reference.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
