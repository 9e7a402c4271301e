"""Kubernetes resource quantities ("100Gi", "500m", "1.5") parsed to exact numbers.

Pure and dependency-free so that both `workloads` (Job specs) and `infra` (stack config) share one parser.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+]?[0-9]+(?:\.[0-9]+)?|[+]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the quantity's value in base units (bytes for memory, cores for cpu).

    Raises ValueError with the offending text for anything Kubernetes would reject.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"quantity must not be negative: {value!r}")
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {value!r} (expected e.g. 100Gi, 512Mi, 500m, 2)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex already guarantees a number
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from exc
    factor = _BINARY.get(suffix) or _DECIMAL[suffix]
    return amount * factor


def quantity_bytes(value: str | int | float) -> int:
    """A memory or storage quantity as whole bytes (rounded up, as the kubelet does)."""
    amount = parse_quantity(value)
    whole = int(amount)
    return whole if whole == amount else whole + 1


def quantity_millicores(value: str | int | float) -> int:
    """A CPU quantity as whole millicores (rounded up)."""
    amount = parse_quantity(value) * 1000
    whole = int(amount)
    return whole if whole == amount else whole + 1


def format_bytes(num_bytes: int) -> str:
    """The shortest exact binary quantity for a byte count: 68719476736 -> "64Gi"."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def format_millicores(millicores: int) -> str:
    return f"{millicores // 1000}" if millicores % 1000 == 0 else f"{millicores}m"
