"""What every command-line entry point of the project shares."""

from __future__ import annotations

import argparse
import copy
import re
import sys
from datetime import date
from typing import NoReturn


class HelpWithDefaults(argparse.RawDescriptionHelpFormatter):
    """`--help` shows each option's default, unless its help already says it or there is none to show; the
    description and epilog keep the lines they were written with."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self._has_default(action):  # argparse prints no help line for help-less options
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if self._has_default(action) and "default" not in text.lower():
            return f"{text} (default: %(default)s)"
        return action.help

    @staticmethod
    def _has_default(action: argparse.Action) -> bool:
        return bool(action.option_strings) and action.nargs != 0 and \
            action.default not in (None, False, argparse.SUPPRESS)


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments are one `error: arguments: <why>` line and exit 2, not argparse's usage block (subcommands
    too, when created with `parser_class=ArgumentParser`); `--help` shows the defaults."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpWithDefaults)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        print(f"error: arguments: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_day(text: str) -> date:
    """An argparse type for a calendar day, YYYY-MM-DD."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)") from None


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_BINARY = {"B": 1, "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}
_DECIMAL = {"K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
KIB, MIB, GIB = 1024, 1024**2, 1024**3


def parse_size(text: str, minimum: int = 1, maximum: int = 1 << 50, why_minimum: str = "") -> int:
    """One rule for every size flag: '512MiB'/'512Mi' (binary), '512MB'/'512M' (decimal), '4096B' (bytes);
    a bare number is GiB (as --budget and --window always were, and as rendered Jobs pass it). Values outside
    [minimum, maximum] are refused with the reason."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB, 64KiB, 1GB, 4096B)")
    suffix = (match.group(2) or "").upper()
    if not suffix:
        factor = GIB
    elif suffix == "B":
        factor = 1
    else:
        unit = suffix.removesuffix("B")
        factor = _BINARY[unit] if unit.endswith("I") else _DECIMAL[unit]
    value = int(float(match.group(1)) * factor)
    if value < minimum:
        reason = f" ({why_minimum})" if why_minimum else ""
        raise argparse.ArgumentTypeError(f"{text!r} is {value} bytes, below the minimum of {minimum} bytes{reason}")
    if value > maximum:
        raise argparse.ArgumentTypeError(f"{text!r} is {value} bytes, above the maximum of {maximum} bytes")
    return value


def size_arg(num_bytes: int) -> str:
    """A byte count as a size flag's value that parse_size reads back exactly ("20Gi", "1536Ki", "4097B")."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return f"{num_bytes}B"
