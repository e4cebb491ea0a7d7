"""The commands: each asks the v1 API and prints a table, or the answer itself with `-o json|yaml`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpubudget.client import Api
from gpubudget.connection import (
    ENV_CA_FILE,
    ENV_CLUSTER,
    ENV_SERVICE,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    ENV_URL,
    Options,
    resolve,
)
from gpubudget.errors import CliError
from gpubudget.render import (
    FORMATS,
    duration,
    exhausts,
    fields,
    minutes,
    moment,
    namespace,
    structured,
    table,
)

PERIODS = ("daily", "weekly", "monthly", "none")
Command = Callable[[Api, argparse.Namespace], tuple[Any, str]]


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 on success, 1 when the timekeeper (or the way to it) refuses or fails, 2 for bad usage."""
    parser = build_parser()
    args = parser.parse_args(_values_attached(list(sys.argv[1:] if argv is None else argv)))
    output = _option(args, "output", "table")
    try:
        api = Api(resolve(_options(args)), timeout=_option(args, "timeout", 10.0))
        try:
            data, text = args.command(api, args)
        finally:
            api.close()
    except CliError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return error.exit_code
    print(text if output == "table" else structured(data, output))
    return 0


def _option(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def _options(args: argparse.Namespace) -> Options:
    token_file = _option(args, "token_file", None)
    return Options(
        url=_option(args, "url", None),
        token=_option(args, "token", None),
        token_file=None if token_file is None else Path(token_file),
        kubeconfig=_option(args, "kubeconfig", None),
        context=_option(args, "context", None),
        service=_option(args, "service", None),
        ca_file=_option(args, "ca_file", None),
        cluster=_option(args, "cluster", None),
    )


# The commands.


def status(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    if args.namespace is None:
        listed = api.get("/namespaces")
        return listed, _status_table(listed)
    one = api.get(f"/namespaces/{args.namespace}/budget")
    return one, _status_fields(one)


def usage(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    answer = api.get(
        f"/namespaces/{args.namespace}/usage",
        {"group_by": args.by, "since": args.since, "until": args.until},
    )
    rows = [
        [
            row["key"],
            minutes(row["gpu_minutes"]),
            str(row["reports"]),
            _percent(row["mean_sm_util_pct"]),
            _percent(row["peak_sm_util_pct"]),
        ]
        for row in answer["rows"]
    ]
    rows.append(
        [
            "TOTAL",
            minutes(answer["total_gpu_minutes"]),
            str(sum(row["reports"] for row in answer["rows"])),
            _percent(answer["total_mean_sm_util_pct"]),
            _percent(answer["total_peak_sm_util_pct"]),
        ]
    )
    heading = (
        f"{namespace(answer)}: GPU-minutes by {answer['group_by']}, "
        f"{moment(answer['since'])} to {moment(answer['until'])}"
    )
    text = table([args.by.upper(), "GPU-MINUTES", "REPORTS", "MEAN SM%", "PEAK SM%"], rows)
    return answer, f"{heading}\n{text}"


def top(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    """The namespaces burning fastest (or by what they used, or what they have left)."""
    listed = api.get("/namespaces")
    keys: dict[str, Callable[[dict[str, Any]], float]] = {
        "burn": lambda s: -s["forecast"]["burn_rate_gpu_minutes_per_hour"],
        "used": lambda s: -s["used_gpu_minutes"],
        "remaining": lambda s: (
            float("inf") if s["remaining_gpu_minutes"] is None else s["remaining_gpu_minutes"]
        ),
    }
    ranked = sorted(listed, key=lambda s: (keys[args.sort](s), namespace(s)))[: args.limit]
    rows = [
        [
            namespace(s),
            minutes(s["forecast"]["burn_rate_gpu_minutes_per_hour"]),
            minutes(s["used_gpu_minutes"]),
            minutes(_available(s)),
            _percent(None if not _available(s) else 100 * s["used_gpu_minutes"] / _available(s)),
            s["state"],
            exhausts(s),
        ]
        for s in ranked
    ]
    headers = ["NAMESPACE", "BURN/H", "USED", "BUDGET", "USED%", "STATE", "EXHAUSTS"]
    return ranked, table(headers, rows)


def forecast(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    statuses = (
        [api.get(f"/namespaces/{args.namespace}/budget")]
        if args.namespace is not None
        else api.get("/namespaces")
    )
    answer = [
        {
            "namespace": s["namespace"],
            "cluster": s.get("cluster"),
            "state": s["state"],
            "remaining_gpu_minutes": s["remaining_gpu_minutes"],
            "period": s["period"],
            "forecast": s["forecast"],
        }
        for s in statuses
    ]
    rows = [
        [
            namespace(s),
            minutes(s["forecast"]["burn_rate_gpu_minutes_per_hour"]),
            minutes(s["remaining_gpu_minutes"]),
            moment(s["period"]["end"], "never"),
            exhausts(s),
        ]
        for s in statuses
    ]
    window = statuses[0]["forecast"]["window_minutes"] if statuses else None
    note = "" if window is None else f"burn rate over the last {duration(window / 60)}\n"
    text = table(["NAMESPACE", "BURN/H", "REMAINING", "PERIOD ENDS", "EXHAUSTS"], rows)
    return answer if args.namespace is None else answer[0], note + text


def set_budget(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    """A PUT replaces every v1 field: what the command line leaves out keeps its current value."""
    current = api.get(f"/namespaces/{args.namespace}/budget")
    answer = api.put(f"/namespaces/{args.namespace}/budget", _budget_body(current, args))
    return answer, _status_fields(answer)


def reset(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    answer = api.delete(f"/namespaces/{args.namespace}/budget")
    return answer, _status_fields(answer)


def grant(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    answer = api.post(
        f"/namespaces/{args.namespace}/grants", {"gpu_minutes": str(args.minutes), "reason": args.reason}
    )
    budget = answer["budget"]
    text = fields(
        [
            ("granted", f"{minutes(answer['gpu_minutes'])} GPU-minutes to {namespace(answer)}"),
            ("reason", answer["reason"]),
            ("by", answer["granted_by"]),
            ("for period", _period(answer["period"])),
            ("remaining", minutes(budget["remaining_gpu_minutes"])),
            ("state", budget["state"]),
            ("exhausts", exhausts(budget)),
        ]
    )
    return answer, text


def defaults(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    """Shows the cluster-wide default; with any budget option, changes it (the rest kept)."""
    current = api.get("/defaults")
    if any(getattr(args, name) is not None for name in _BUDGET_OPTIONS):
        current = api.put("/defaults", _budget_body(current, args))
    text = fields(
        [
            ("budget", minutes(current["budget_gpu_minutes"])),
            ("period", current["period"]),
            ("warn at", _percent(100 * current["warn_at_fraction"])),
            ("max GPU share per pod", minutes(current["max_gpu_share_per_pod"], "none")),
            ("concurrent GPU limit", minutes(current["concurrent_gpu_limit"], "none")),
            ("running pod action", current["running_pod_action"]),
        ]
    )
    return current, text


def audit(api: Api, args: argparse.Namespace) -> tuple[Any, str]:
    entries = api.get("/audit", {"namespace": args.namespace, "since": args.since, "limit": args.limit})
    rows = [
        [
            moment(entry["at"]),
            _actor(entry),
            entry["action"],
            entry["namespace"] or "(default)",
            _change(entry["old_value"], entry["new_value"]),
        ]
        for entry in entries
    ]
    return entries, table(["AT", "ACTOR", "ACTION", "NAMESPACE", "CHANGE"], rows)


def _actor(entry: dict[str, Any]) -> str:
    """The actor, with the member cluster that authenticated it: `alice (b)` is not the hub's `alice`
    (a hub that predates the field names none)."""
    cluster = entry.get("actor_cluster")
    return entry["actor"] if cluster is None else f"{entry['actor']} ({cluster})"


# Shapes.


def _status_table(listed: list[dict[str, Any]]) -> str:
    rows = [
        _model_row(row)
        if "model" in row
        else [
            namespace(row),
            row["state"],
            minutes(row["budget_gpu_minutes"]),
            minutes(row["used_gpu_minutes"]),
            minutes(row["remaining_gpu_minutes"]),
            row["period"]["kind"],
            minutes(row["forecast"]["burn_rate_gpu_minutes_per_hour"]),
            exhausts(row),
        ]
        for s in listed
        for row in _with_model_rows(s)
    ]
    headers = ["NAMESPACE", "STATE", "BUDGET", "USED", "REMAINING", "PERIOD", "BURN/H", "EXHAUSTS"]
    return table(headers, rows)


def _with_model_rows(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The namespace's row, then one indented row per model budget (a timekeeper that predates them,
    or a budget without any, answers no `models`: the namespace's row alone)."""
    return [s, *({"model": name, **figures} for name, figures in sorted((s.get("models") or {}).items()))]


def _status_fields(s: dict[str, Any]) -> str:
    forecast = s["forecast"]
    pairs = [
        ("namespace", namespace(s)),
        ("state", s["state"]),
        ("priority class", s["priority_class"]),
        (
            "budget",
            f"{minutes(s['budget_gpu_minutes'])} ({'own' if s['source'] == 'namespace' else 'default'})",
        ),
        ("granted", minutes(s["granted_gpu_minutes"])),
        ("used", minutes(s["used_gpu_minutes"])),
        ("remaining", minutes(s["remaining_gpu_minutes"])),
        ("period", _period(s["period"])),
        (
            "burn rate",
            f"{minutes(forecast['burn_rate_gpu_minutes_per_hour'])} GPU-minutes/hour over the last "
            f"{duration(forecast['window_minutes'] / 60)}",
        ),
        ("exhausts", exhausts(s)),
    ]
    models = s.get("models") or {}
    if not models:
        return fields(pairs)
    # Under the total: the policy for a pod that could land on an exhausted model, what ran on a model
    # that could not be known (counted against the total only), then each model's own figures.
    pairs += [
        ("model policy", s.get("model_policy") or "reduce"),
        ("unknown model", f"{minutes(s.get('unknown_model_used_gpu_minutes') or 0)} used"),
    ]
    rows = [_model_row({"model": name, **figures}) for name, figures in sorted(models.items())]
    listed = table(
        ["MODEL", "STATE", "BUDGET", "USED", "REMAINING", "EXHAUSTS"],
        [[row[0].strip(), *row[1:5], row[7]] for row in rows],
    )
    return f"{fields(pairs)}\n\n{listed}"


def _model_row(model: dict[str, Any]) -> list[str]:
    """A model budget's row under its namespace's: the model in place of the namespace, no period or burn
    of its own (the namespace's period is the model's)."""
    return [
        f"  {model['model']}",
        model["state"],
        minutes(model["budget_gpu_minutes"]),
        minutes(model["used_gpu_minutes"]),
        minutes(model["remaining_gpu_minutes"]),
        "",
        "",
        _model_exhausts(model),
    ]


def _model_exhausts(model: dict[str, Any]) -> str:
    if model["state"] == "exhausted":
        return "exhausted"
    return moment((model.get("forecast") or {}).get("exhausts_at"))


def _period(period: dict[str, Any]) -> str:
    if period["kind"] == "none":
        return "none (open-ended)"
    return f"{period['kind']}, {moment(period['start'])} to {moment(period['end'])}"


def _available(s: dict[str, Any]) -> float | None:
    budget = s["budget_gpu_minutes"]
    return None if budget is None else budget + s["granted_gpu_minutes"]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _change(old: Any, new: Any) -> str:
    """The fields an audit entry changed, `name: old -> new`; a grant's amount and reason."""
    if isinstance(new, dict) and isinstance(old, dict):
        changed = [f"{k}: {_short(old.get(k))} -> {_short(v)}" for k, v in new.items() if old.get(k) != v]
        return ", ".join(changed) or "(no change)"
    if isinstance(new, dict):
        return ", ".join(f"{k}: {_short(v)}" for k, v in new.items() if v is not None)
    if isinstance(old, dict):
        return "removed"
    return _short(new)


def _short(value: Any) -> str:
    return "null" if value is None else str(value)


_BUDGET_OPTIONS = ("budget", "period", "warn_at", "max_gpu_share_per_pod", "concurrent_gpu_limit")


def _budget_body(current: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The v1 fields from the command line where given, else as they are now."""

    def pick(option: str, field: str) -> Any:
        given = getattr(args, option)
        if given is None:
            return current[field]
        return None if given in ("unlimited", "none") and option != "period" else given

    period = pick("period", "period")

    return {
        "budget_gpu_minutes": pick("budget", "budget_gpu_minutes"),
        # A namespace's status answers its period as {kind, start, end}; the default, as its kind.
        "period": period["kind"] if isinstance(period, dict) else period,
        "warn_at_fraction": pick("warn_at", "warn_at_fraction"),
        "max_gpu_share_per_pod": pick("max_gpu_share_per_pod", "max_gpu_share_per_pod"),
        "concurrent_gpu_limit": pick("concurrent_gpu_limit", "concurrent_gpu_limit"),
    }


# The command line.


def _amount(text: str) -> str:
    """A non-negative decimal, sent as the exact string the user typed (the API takes decimal strings)."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of at least 0, not {text!r}")
    return text


def _values_attached(argv: list[str]) -> list[str]:
    """`--token -abc` as `--token=-abc`: a URL-safe token may begin with a dash, which argparse would
    otherwise read as an option and refuse."""
    attached: list[str] = []
    arguments = iter(argv)
    for argument in arguments:
        if argument in ("--token", "--url") and (value := next(arguments, None)) is not None:
            attached.append(f"{argument}={value}")
        else:
            attached.append(argument)
    return attached


def _amount_or(*words: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        return text if text in words else _amount(text)

    parse.__name__ = "amount"
    return parse


def _common() -> argparse.ArgumentParser:
    """Connection and output options, accepted before or after the command (argparse.SUPPRESS keeps a
    command's parser from overwriting what was given before it)."""
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("-o", "--output", choices=FORMATS, help="table (default), json or yaml")
    common.add_argument("--url", help=f"the timekeeper's URL (env {ENV_URL}); unset: through the kubeconfig")
    common.add_argument("--token", help=f"bearer token for the timekeeper (env {ENV_TOKEN})")
    common.add_argument("--token-file", help=f"a file holding the token (env {ENV_TOKEN_FILE})")
    common.add_argument("--ca-file", help=f"CA bundle for an https --url (env {ENV_CA_FILE})")
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "--service",
        help=f"the timekeeper's Service, [https:]NAMESPACE/NAME[:PORT] (env {ENV_SERVICE}; "
        "default gpu-timekeeper/gpu-timekeeper:8080)",
    )
    common.add_argument(
        "--cluster",
        help=f"a fleet's member cluster your credential is of (env {ENV_CLUSTER}); unset: the hub's own",
    )
    common.add_argument("--timeout", type=float, help="seconds to wait for an answer (default 10)")
    return common


def _budget_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=_amount_or("unlimited"), help="GPU-minutes per period, or unlimited")
    parser.add_argument("--period", choices=PERIODS)
    parser.add_argument("--warn-at", type=_amount, help="warning from this fraction of budget + grants")
    parser.add_argument("--max-gpu-share-per-pod", type=_amount_or("none"), help="a GPU share, or none")
    parser.add_argument("--concurrent-gpu-limit", type=_amount_or("none"), help="GPUs at once, or none")


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="gpu-budget",
        description="GPU Timekeeper budgets, usage and forecasts (also `kubectl gpu-budget`).",
        parents=[common],
    )
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def command(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(command=handler)
        return sub

    sub = command("status", status, "budget status of one namespace, or of every namespace you may read")
    sub.add_argument("namespace", nargs="?")
    sub = command("usage", usage, "where a namespace's GPU-minutes went, by pod, workload, hour or day")
    sub.add_argument("namespace")
    sub.add_argument("--by", choices=("pod", "workload", "hour", "day"), default="pod")
    sub.add_argument("--since", help="RFC 3339 time (default: the start of the current period)")
    sub.add_argument("--until", help="RFC 3339 time (default: now)")
    sub = command("top", top, "the namespaces burning GPU time fastest")
    sub.add_argument("--sort", choices=("burn", "used", "remaining"), default="burn")
    sub.add_argument("--limit", type=int, default=20, help="show this many (default 20)")
    sub = command("forecast", forecast, "burn rate and when the budget runs out, at that rate")
    sub.add_argument("namespace", nargs="?")
    sub = command(
        "set", set_budget, "set a namespace's own budget (admin); options left out stay as they are"
    )
    sub.add_argument("namespace")
    _budget_options(sub)
    sub = command("reset", reset, "return a namespace to the default budget (admin)")
    sub.add_argument("namespace")
    sub = command("grant", grant, "grant GPU-minutes for the current period (admin)")
    sub.add_argument("namespace")
    sub.add_argument("minutes", type=_amount, help="GPU-minutes")
    sub.add_argument("--reason", required=True)
    sub = command(
        "defaults", defaults, "show the cluster-wide default budget; change it with options (admin)"
    )
    _budget_options(sub)
    sub = command("audit", audit, "who changed which budget, when (admin)")
    sub.add_argument("--namespace", "-n")
    sub.add_argument("--since", help="RFC 3339 time")
    sub.add_argument("--limit", type=int, default=50)
    return parser
