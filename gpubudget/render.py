"""Output: aligned tables for people, the API's own JSON (or the same as YAML) for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import yaml

FORMATS = ("table", "json", "yaml")


def structured(data: Any, output: str) -> str:
    """`-o json` / `-o yaml`: exactly what the API answered (or the command's list of such answers)."""
    if output == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, numbers right-aligned, two spaces apart (kubectl's look)."""
    widths = [max([len(header), *(len(row[i]) for row in rows)]) for i, header in enumerate(headers)]
    numeric = [all(_looks_numeric(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """One object as `name:  value` lines."""
    width = max(len(name) for name, _ in pairs) + 1
    return "\n".join(f"{(name + ':').ljust(width)}  {value}" for name, value in pairs)


def namespace(answer: dict[str, Any]) -> str:
    """The namespace an answer names, as a person reads it: `<cluster>/<namespace>` for a fleet member
    cluster's (the answer's `cluster` beside its bare `namespace`), the bare name for the local cluster's
    (`cluster` null, or absent from a timekeeper that predates fleets). A hub's listing holds `team-x` of
    several clusters: the cluster tells them apart."""
    cluster = answer.get("cluster")
    return f"{cluster}/{answer['namespace']}" if cluster else str(answer["namespace"])


def _looks_numeric(cell: str) -> bool:
    return cell.replace(",", "").replace(".", "").replace("-", "").replace("%", "").isdigit() or cell in (
        "-",
        "",
    )


def minutes(value: float | None, none: str = "unlimited") -> str:
    """GPU-minutes to two decimals at most, thousands separated; None as `none`."""
    if value is None:
        return none
    text = f"{value:,.2f}"
    return text[:-3] if text.endswith(".00") else text


def moment(value: str | None, none: str = "-") -> str:
    """An RFC 3339 time as `YYYY-MM-DD HH:MM UTC`."""
    if not value:
        return none
    return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M UTC")


def duration(hours: float) -> str:
    """`3d 4h`, `5h 20m`, `12m`."""
    total = round(hours * 60)
    days, rest = divmod(total, 24 * 60)
    hours_part, mins = divmod(rest, 60)
    if days:
        return f"{days}d {hours_part}h"
    if hours_part:
        return f"{hours_part}h {mins}m"
    return f"{mins}m"


def exhausts(status: dict[str, Any]) -> str:
    """The forecast's exhaustion with how long from now at the burn rate (the timekeeper's clock may not
    be this machine's: the demo's runs fast), or why there is none."""
    forecast = status.get("forecast") or {}
    if status["state"] == "exhausted":
        return "exhausted"
    if forecast.get("exhausts_at") is None:
        return "-"
    rate = forecast["burn_rate_gpu_minutes_per_hour"]
    left = status["remaining_gpu_minutes"] / rate
    return f"{moment(forecast['exhausts_at'])} (in {duration(left)})"
