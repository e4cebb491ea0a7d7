"""docs/glossary.md stays true: every name it lists exists, and the meanings it retired stay retired.

A word with two meanings costs each newcomer the time to find out which one a file means. The glossary
gives each word one meaning and names what carries it; this test checks those names against the code (so
a rename must update the glossary), and refuses a module, class or function named with a word in the
meaning the glossary retired (so the second meaning does not creep back).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pytest

from tests.test_docs import (
    KNOWN,
    OUR_FAMILY,
    PRODUCT,
    ROOT,
    _runnable,
    _string_literals,
    _unresolved_module,
)

GLOSSARY = ROOT / "docs" / "glossary.md"
# The words issue 39 found with two meanings: each must have an entry. (Its fifth, a package named for GPUs
# that serves HTTP, is `httpguard` now, with an entry whose Names fail when the package is renamed.)
ISSUE_WORDS = ("figures", "state", "scheduler", "periodic")


def _entries() -> dict[str, str]:
    """Each `### word` heading and the text under it."""
    parts = re.split(r"^### (.+)$", GLOSSARY.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {
        word.strip(): re.split(r"^## ", text, flags=re.MULTILINE)[0]
        for word, text in zip(parts[1::2], parts[2::2], strict=True)
    }


def _names(entry: str, item: str = "Names") -> list[str]:
    """The backticked names of an entry's `- Names:` (or `- Not:`) item, wrapping onto indented lines."""
    match = re.search(rf"^- {item}:(.*(?:\n  .*)*)", entry, flags=re.MULTILINE)
    return re.findall(r"`([^`]+)`", match.group(1)) if match else []


def _missing(name: str, literals: set[str], routes: set[str]) -> str | None:
    """Why `name` names nothing in the code; None when it does. Each kind is checked where it lives."""
    if name.startswith("python -m "):
        return None if _runnable(name.removeprefix("python -m ")) else "no runnable module"
    if re.fullmatch(r"(?:TIMEKEEPER|WEBHOOK|SIDECAR|NODEAGENT)_[A-Z0-9_]+", name):
        return None if name in KNOWN else "no deployable reads this setting"
    if name.startswith("/api/v1/"):
        return None if name in routes else "no such route"
    parts = tuple(name.split("."))
    if parts[0] in PRODUCT or OUR_FAMILY.fullmatch(parts[0]):
        return _unresolved_module(parts, ())
    if re.fullmatch(r"[a-z][a-z0-9_]*", name):  # a table, metric or other string the code spells out
        return (
            None if name in literals or name.removesuffix("_total") in literals else "no such string in code"
        )
    return UNCHECKABLE


UNCHECKABLE = "not a kind of name this test can check: a module, setting, route, `python -m` or string"


def test_the_glossary_has_the_issues_words_each_with_names() -> None:
    entries = _entries()
    assert set(ISSUE_WORDS) <= set(entries)
    assert not [word for word, entry in entries.items() if not _names(entry)], "an entry without names"


def test_every_name_the_glossary_lists_exists() -> None:
    from timekeeper.app import create_app
    from timekeeper.settings import Settings

    app = create_app(Settings(database_url="postgresql+psycopg://docs@127.0.0.1/docs"))
    routes = set(app.openapi()["paths"])
    literals = _string_literals()
    missing = [
        f"{word}: `{name}`: {reason}"
        for word, entry in _entries().items()
        for name in _names(entry)
        if (reason := _missing(name, literals, routes))
    ]
    # The public names a `- Not:` item keeps (settings, metrics, commands) must exist too; its prose
    # examples (`app.state`, `models.py`) are not names of ours.
    missing += [
        f"{word} (Not): `{name}`: {reason}"
        for word, entry in _entries().items()
        for name in _names(entry, "Not")
        if (reason := _missing(name, literals, routes)) and reason != UNCHECKABLE
    ]
    assert not missing, "docs/glossary.md names what the code does not have:\n" + "\n".join(missing)


@dataclass(frozen=True)
class Retired:
    """A word's retired meaning, as a rule on the names of modules, classes and functions.

    `packages`: where any name holding `word` is in the retired meaning; `unless`: a pattern that marks a
    name in the kept meaning there anyway; `public`: names kept because they are public (API, commands),
    dotted or as `package:name`.
    """

    word: str
    packages: tuple[str, ...]
    why: str
    unless: str = r"(?!)"
    public: frozenset[str] = frozenset()


RETIRED = (
    Retired(
        "scheduler",
        ("timekeeper",),
        "the timekeeper's periodic jobs are `periodic`, not `scheduler` (a Kubernetes scheduler)",
        public=frozenset({"timekeeper.scheduler"}),  # `python -m timekeeper.scheduler`, the module itself
    ),
    Retired(
        "figure",
        ("gpuaccounting", "gpunvml", "sidecar", "nodeagent"),
        "what a GPU measured is a measurement; figures are a budget's totals",
    ),
    Retired(
        "figure",
        ("timekeeper",),
        "what a GPU measured is a measurement; figures are a budget's totals",
        unless=r"^(?!.*gpu)",
        public=frozenset({"timekeeper:GpuFiguresIn"}),  # the report's OpenAPI schema
    ),
    Retired(
        "state",
        ("webhook", "sidecar", "nodeagent", "gpunvml", "httpguard", "gpubudget"),
        "a state is a namespace's budget state: the webhook's copy is the snapshot cache, the sidecar's file "
        "its progress",
        unless=r"budget",
    ),
)


def _defined_names(package: str) -> set[str]:
    """Dotted names of the package's modules and of every class and function (methods too) in them."""
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names.add(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(f"{module}.{node.name}")
    return names


def _words(name: str) -> set[str]:
    """The words of an identifier, snake_case or CamelCase, lower case: `GpuFiguresIn` -> gpu, figures, in."""
    return {word.lower() for word in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)}


def _key(name: str) -> str:
    """`timekeeper.periodic.runner.PeriodicRunner` -> `timekeeper:PeriodicRunner`."""
    return f"{name.split('.')[0]}:{name.rsplit('.', 1)[-1]}"


def _retired_names() -> dict[str, str]:
    """Each module, class or function named in a retired meaning (dotted), with why."""
    found = {}
    for rule in RETIRED:
        for package in rule.packages:
            for name in _defined_names(package):
                last = name.rsplit(".", 1)[-1]
                named = {rule.word, rule.word + "s"} & _words(last)
                public = name in rule.public or _key(name) in rule.public
                if named and not re.search(rule.unless, last.lower()) and not public:
                    found[name] = rule.why
    return found


def test_no_module_class_or_function_is_named_in_a_retired_meaning() -> None:
    found = _retired_names()
    assert not found, "named in a meaning docs/glossary.md retired:\n" + "\n".join(
        f"{name}: {why}" for name, why in sorted(found.items())
    )


@pytest.mark.parametrize("rule", RETIRED, ids=lambda rule: f"{rule.word}-{rule.packages[0]}")
def test_each_retired_meaning_has_its_glossary_entry(rule: Retired) -> None:
    entries = _entries()
    word = {"figure": "figures"}.get(rule.word, rule.word)
    assert "- Not:" in entries[word], f"docs/glossary.md's `{word}` says nothing of the meaning it retired"


def test_the_checks_can_fail() -> None:
    """Each kind of name, misspelt, is found missing; a retired word is found inside an identifier."""
    literals, routes = {"usage_ledger"}, {"/api/v1/reports"}
    assert _missing("usage_ledger", literals, routes) is None
    for name in (
        "timekeeper.no_such_module",
        "gpuretired.bodies",
        "TIMEKEEPER_NO_SUCH_SETTING",
        "/api/v1/no-such",
        "no_such_table",
    ):
        assert _missing(name, literals, routes), name
    assert _missing("python -m timekeeper.no_such_module", literals, routes)
    assert _words("SchedulerRunner") >= {"scheduler"} and _words("merge_figures") >= {"figures"}
    assert not {"figure", "figures"} & _words("configure_logging")
