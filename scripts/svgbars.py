"""A dependency-free horizontal bar chart as SVG text (no plotting library is installed here)."""

from __future__ import annotations

import math
from html import escape


def bar_chart_svg(title: str, bars: list[tuple[str, float]], unit: str, *, log: bool = False) -> str:
    label_width, bar_width, row, top = 230, 420, 24, 40
    height = top + row * len(bars) + 20
    peak = max(value for _, value in bars) or 1.0

    def length(value: float) -> float:
        if log:
            low = min(v for _, v in bars if v > 0) / 2
            return bar_width * math.log(max(value, low) / low) / math.log(peak / low)
        return bar_width * value / peak

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 120}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for index, (label, value) in enumerate(bars):
        y = top + index * row
        parts.append(f'<text x="{label_width - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>')
        parts.append(
            f'<rect x="{label_width}" y="{y + 2}" width="{length(value):.1f}" height="{row - 6}" fill="#4878a8"/>'
        )
        parts.append(f'<text x="{label_width + length(value) + 4:.1f}" y="{y + 14}">{value:,.1f} {escape(unit)}</text>')
    scale = "log scale" if log else "linear scale"
    parts.append(f'<text x="{label_width}" y="{height - 4}" fill="#666">{scale}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
