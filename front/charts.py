"""Small bar charts drawn on the server as inline SVG: no script, nothing fetched from elsewhere.

`daily_bars` draws a pair of bars per day (what came in and what went out, say), scaled to the
largest, each bar with a tooltip of its day and value.
"""

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT = 720, 170
LEFT, RIGHT, BOTTOM, TOP = 56, 24, 22, 8  # room for the scale's labels and the days'
LABEL_EVERY = 7  # days


@dataclass(frozen=True)
class Series:
    label: str
    css: str  # the bars' class in site.css
    values: dict[date, int | float | Decimal]


def _number(value: int | float | Decimal) -> str:
    value = float(value)
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:,.2f}"


def daily_bars(*, title: str, days: list[date], series: list[Series]) -> SafeString:
    """An SVG of `series` side by side for each of `days`, oldest on the left."""
    peak = max((float(s.values.get(day, 0)) for s in series for day in days), default=0.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - BOTTOM - TOP
    step = plot_w / max(len(days), 1)
    bar_w = step * 0.8 / max(len(series), 1)
    bars, labels = [], []
    for i, day in enumerate(days):
        for j, one in enumerate(series):
            value = one.values.get(day, 0)
            height = plot_h * float(value) / peak if peak else 0.0
            x = LEFT + i * step + step * 0.1 + j * bar_w
            bars.append(
                (one.css, round(x, 2), round(TOP + plot_h - height, 2), round(bar_w, 2), round(height, 2))
                + (f"{day.isoformat()}: {one.label} {_number(value)}",)
            )
        if (len(days) - 1 - i) % LABEL_EVERY == 0:
            labels.append((round(LEFT + (i + 0.5) * step, 2), HEIGHT - 6, day.strftime("%b %d")))
    return format_html(
        '<svg class="chart" viewBox="0 0 {w} {h}" role="img" aria-label="{title}, peak {peak}">'
        "<title>{title}</title>"
        '<line class="axis" x1="{left}" y1="{base}" x2="{right}" y2="{base}"></line>'
        "{scale}"
        '<text class="scale" x="{lx}" y="{base}" text-anchor="end">0</text>'
        "{bars}{labels}</svg>",
        w=WIDTH,
        h=HEIGHT,
        title=title,
        peak=_number(peak),
        left=LEFT,
        right=LEFT + plot_w,
        base=TOP + plot_h,
        lx=LEFT - 6,
        scale=format_html(
            '<text class="scale" x="{}" y="{}" text-anchor="end">{}</text>', LEFT - 6, TOP + 10, _number(peak)
        )
        if peak
        else "",
        bars=format_html_join(
            "",
            '<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
            bars,
        ),
        labels=format_html_join("", '<text class="day" x="{}" y="{}" text-anchor="middle">{}</text>', labels),
    )
