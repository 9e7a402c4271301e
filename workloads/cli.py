"""What every command-line entry point of the project shares."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments are one `error: arguments: <why>` line and exit 2, not argparse's usage block (subcommands
    too, when created with `parser_class=ArgumentParser`)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: arguments: {message}", file=sys.stderr)
        raise SystemExit(2)
