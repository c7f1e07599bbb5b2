"""Samples, percentiles and the one table the benchmark prints.

Every number in the table is lower-is-better, so "ratio to the best
competitor" is zkbeat's median divided by the smallest competitor median.
A trial that hit its time cap is kept as a censored sample (shown as ``>cap``)
rather than dropped: dropping it would make the slow scheduler look fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FLAVOUR_KEYS = ("zkbeat", "plain", "redbeat", "redbeat_tuned", "dcb")
COLUMNS = {
    "zkbeat": "zkbeat",
    "plain": "celery beat",
    "redbeat": "redbeat (defaults)",
    "redbeat_tuned": "redbeat (tuned)",
    "dcb": "django-celery-beat alone",
}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); inf stays inf."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    if low == high or ordered[high] == math.inf:
        return ordered[high] if position > low else ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Sample:
    """Measurements of one metric for one flavour; ``cap`` marks censored trials (inf)."""

    values: list[float] = field(default_factory=list)
    cap: float | None = None
    note: str = ""

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return percentile(self.values, 50)

    @property
    def p99(self) -> float:
        return percentile(self.values, 99)

    def as_dict(self) -> dict:
        finite = [v for v in self.values if v != math.inf]
        return {
            "n": self.n,
            "median": _json_number(self.median),
            "p99": _json_number(self.p99),
            "min": min(finite) if finite else None,
            "max": _json_number(max(self.values)) if self.values else None,
            "censored_at": self.cap if any(v == math.inf for v in self.values) else None,
            "values": [_json_number(v) for v in self.values],
            "note": self.note,
        }


def _json_number(value: float) -> float | str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if value == math.inf:
        return "censored"
    return round(value, 4)


@dataclass
class Row:
    """One line of the table: a metric of a scenario, per flavour, with zkbeat's target."""

    scenario: str
    metric: str
    unit: str
    values: dict[str, Sample]
    target: str = ""
    #: Decides "met" from the row itself (None: nothing to decide).
    check: Callable[[Row], bool] | None = None
    #: Show median and p99 (trials) or a single figure.
    spread: bool = True
    digits: int = 1

    @property
    def met(self) -> bool | None:
        if self.check is None or "zkbeat" not in self.values or not self.values["zkbeat"].values:
            return None
        try:
            return bool(self.check(self))
        except (KeyError, ValueError, ZeroDivisionError):
            return None

    def best_competitor(self) -> tuple[str, Sample] | None:
        competitors = [(key, sample) for key, sample in self.values.items() if key != "zkbeat" and sample.values]
        finite = [(key, s) for key, s in competitors if not math.isnan(s.median)]
        if not finite:
            return None
        return min(finite, key=lambda item: item[1].median)

    @property
    def ratio(self) -> float | None:
        best = self.best_competitor()
        ours = self.values.get("zkbeat")
        if best is None or ours is None or not ours.values:
            return None
        theirs = best[1].median
        if theirs in (0, math.inf) or math.isnan(ours.median):
            return None
        return ours.median / theirs

    def cell(self, key: str) -> str:
        sample = self.values.get(key)
        if sample is None or not sample.values:
            return sample.note if sample is not None and sample.note else "n/a"
        text = _fmt(sample.median, sample.cap, self.digits)
        if self.spread and sample.n > 1:
            text += f" / {_fmt(sample.p99, sample.cap, self.digits)}"
        return text

    def as_dict(self) -> dict:
        best = self.best_competitor()
        return {
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "target": self.target,
            "met": self.met,
            "ratio_to_best_competitor": None if self.ratio is None else round(self.ratio, 3),
            "best_competitor": best[0] if best else None,
            "values": {key: sample.as_dict() for key, sample in self.values.items()},
        }


def _fmt(value: float, cap: float | None, digits: int) -> str:
    if value == math.inf:
        return f">{cap:g}" if cap is not None else "never"
    if math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    """The rows as one Markdown table (it reads fine in a terminal too)."""
    header = ["scenario", "metric", *COLUMNS.values(), "zkbeat ÷ best other", "zkbeat target", "met"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        ratio = row.ratio
        met = {True: "yes", False: "**no**", None: ""}[row.met]
        cells = [
            row.scenario,
            f"{row.metric} ({row.unit})",
            *(row.cell(key) for key in FLAVOUR_KEYS),
            "" if ratio is None else f"{ratio:.2f}×",
            row.target,
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
