"""The docs must stay true: the names, links, make targets and modules they mention exist in the code.

Platform engineers configure the system from README.md and docs/*.md, so a renamed setting or a moved page
must fail a test rather than cost someone an afternoon. Every check reads the code itself (the settings
classes, the sidecar's parser, the Makefile), never a copy of it.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pytest

from nodeagent.config import Settings as NodeAgentSettings
from sidecar.config import Config
from timekeeper.app import create_app as create_timekeeper_app
from timekeeper.settings import Settings
from webhook.serving.app import create_app as create_webhook_app
from webhook.settings import WebhookSettings

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
# Where a platform engineer meets our variable names: the pages, the manifests, compose; and the demo,
# which configures the real processes (a misspelt name there would be ignored, not refused).
CONFIG_SOURCES = [
    *PAGES,
    ROOT / "docker-compose.yml",
    *sorted(path for path in (ROOT / "deployment").rglob("*") if path.is_file()),
    *sorted((ROOT / "demo").glob("*.py")),
    ROOT / "webhook" / "decisions" / "injection.py",  # the sidecar's environment, as the webhook writes it
]

PREFIXES = ("TIMEKEEPER_", "WEBHOOK_", "SIDECAR_", "NODEAGENT_")
# A name with one of our prefixes, not inside a longer name (GPU_TIMEKEEPER_COMPOSE_DIR); a trailing `*`
# (`TIMEKEEPER_CLOCK_*`) makes it a family of names.
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_])((?:TIMEKEEPER|WEBHOOK|SIDECAR|NODEAGENT)_[A-Z0-9_]*)(\*?)")

# Names with our prefixes that are not a deployable's setting, each with the reason it may be mentioned.
NOT_SETTINGS = {
    "TIMEKEEPER_TEST_DATABASE_URL": "the tests' PostgreSQL (tests/support/postgres.py), not the service's",
    "TIMEKEEPER_TEST_KUBE_CONTROL_PLANE": "the cluster layer's control-plane script (tests/cluster)",
    "TIMEKEEPER_TEST_KUBE_BIN_DIR": "the cluster layer's prebuilt kube binaries (tests/cluster)",
    "TIMEKEEPER_TEST_REQUIRE_CLUSTER": "CI: the cluster layer fails instead of skipping (.ci/run)",
    "TIMEKEEPER_TEST_CLUSTER_INSTALL": "the cluster layer's install: kustomize or helm (tests/cluster)",
}

# Which pages hold each deployable's configuration reference.
REFERENCE_PAGES = {
    "timekeeper": ("timekeeper.md", "kubernetes.md", "scheduler.md", "gitops.md"),
    "webhook": ("webhook.md",),
    "sidecar": ("sidecar.md",),
    "nodeagent": ("nodeagent.md",),
}


# The sidecar's required variables: with these it starts, reading every other one for its default.
SIDECAR_REQUIRED = {
    "POD_NAMESPACE": "team-a",
    "POD_NAME": "train-0",
    "POD_UID": "uid-0",
    "SIDECAR_GPU_SHARE": "0.5",
    "SIDECAR_TIMEKEEPER_URL": "http://timekeeper:8080",
}


class _RecordingEnv(Mapping[str, str]):
    """An environment that remembers every name looked up, so the sidecar's parser tells what it reads."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _pydantic_names(
    settings: type[Settings] | type[WebhookSettings] | type[NodeAgentSettings], prefix: str
) -> set[str]:
    assert settings.model_config.get("env_prefix") == prefix
    fields = settings.model_fields
    assert not [name for name, field in fields.items() if field.alias or field.validation_alias], (
        "an aliased field is read under another name; teach this test the alias"
    )
    return {prefix + name.upper() for name in fields}


def _sidecar_names() -> set[str]:
    """Every variable `Config.from_env` reads (it reads them all on a valid start, defaults or not)."""
    env = _RecordingEnv(dict(SIDECAR_REQUIRED))
    Config.from_env(env)
    return env.read


# The sidecar's set also holds names without our prefix: POD_* (downward API), NVIDIA_VISIBLE_DEVICES.
SETTINGS = {
    "timekeeper": _pydantic_names(Settings, "TIMEKEEPER_"),
    "webhook": _pydantic_names(WebhookSettings, "WEBHOOK_"),
    "sidecar": _sidecar_names(),
    "nodeagent": _pydantic_names(NodeAgentSettings, "NODEAGENT_"),
}
KNOWN = set().union(*SETTINGS.values())


def _mentions(paths: list[Path]) -> Iterator[tuple[str, str, bool]]:
    """(where, name, is a family) for each name; in Python only string literals, not our own constants."""
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in ENV_NAME.finditer(line):
                if path.suffix == ".py" and line[match.start() - 1 : match.start()] not in ("'", '"'):
                    continue
                yield f"{path.relative_to(ROOT)}:{number}", match.group(1), bool(match.group(2))


def test_the_sidecar_reads_its_contract_variables() -> None:
    """Guards the recording above: the brief's sidecar variables must be among what it finds."""
    contract = {
        "POD_NAMESPACE",
        "POD_NAME",
        "POD_UID",
        "SIDECAR_GPU_SHARE",
        "SIDECAR_TIMEKEEPER_URL",
        "SIDECAR_TOKEN_FILE",
        "SIDECAR_REPORT_INTERVAL_SECONDS",
        "SIDECAR_BUFFER_DIR",
        "SIDECAR_NVML_BACKEND",
    }
    assert contract <= SETTINGS["sidecar"]


def test_every_variable_mentioned_is_a_setting() -> None:
    unknown = []
    for where, name, family in _mentions(CONFIG_SOURCES):
        if name in PREFIXES:  # the prefix itself ("every `TIMEKEEPER_` variable")
            continue
        if family:
            if not any(known.startswith(name) for known in KNOWN):
                unknown.append(f"{where}: {name}* matches no setting")
        elif name not in KNOWN and name not in NOT_SETTINGS:
            unknown.append(f"{where}: {name}")
    assert not unknown, "variables no deployable reads:\n" + "\n".join(unknown)


def test_the_exceptions_are_still_needed() -> None:
    mentioned = {name for _, name, _ in _mentions(CONFIG_SOURCES)}
    assert set(NOT_SETTINGS) <= mentioned
    assert not set(NOT_SETTINGS) & KNOWN


@pytest.mark.parametrize("deployable", sorted(REFERENCE_PAGES))
def test_every_setting_is_in_its_configuration_reference(deployable: str) -> None:
    """Each setting appears, by its full name, in a table row of its deployable's pages."""
    rows = "\n".join(
        line
        for page in REFERENCE_PAGES[deployable]
        for line in (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines()
        if line.startswith("|")
    )
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", rows))
    missing = sorted(SETTINGS[deployable] - documented)
    assert not missing, f"not in the configuration tables of {REFERENCE_PAGES[deployable]}: {missing}"


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = "".join(char for char in text if char.isalnum() or char in " -_")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.name}: " + "; ".join(broken)


MAKE = re.compile(r"(?<![\w-])make ([a-z][a-z0-9_-]*)")


def _make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", makefile, flags=re.MULTILINE))


def _code(page: Path) -> str:
    """The page's code: fenced blocks and inline spans, where a command is a command and not English."""
    text = page.read_text(encoding="utf-8")
    fenced = re.findall(r"```.*?```", text, flags=re.DOTALL)
    inline = re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return "\n".join(fenced + inline)


def test_every_make_target_mentioned_exists() -> None:
    targets = _make_targets()
    mentioned = {(page.name, target) for page in PAGES for target in re.findall(MAKE, _code(page))}
    assert ("README.md", "demo") in mentioned, "the pattern missed the README's quick start"
    missing = [f"{page}: make {target}" for page, target in sorted(mentioned) if target not in targets]
    assert not missing, missing


def _runnable(module: str) -> bool:
    """What `python -m module` needs: the module, or for a package its `__main__`."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    is_package = spec.submodule_search_locations is not None
    return not is_package or importlib.util.find_spec(f"{module}.__main__") is not None


def test_every_python_module_mentioned_runs() -> None:
    modules = {
        module for page in PAGES for module in re.findall(r"\bpython3? -m ([A-Za-z_][\w.]*\w)", _code(page))
    }
    assert modules, "the pattern found no `python -m` at all"
    assert not [module for module in sorted(modules) if not _runnable(module)]


REPO_PATH = re.compile(
    r"`((?:timekeeper|webhook|sidecar|nodeagent|gpuaccounting|tests|deployment|bench|demo|migrations|docs)/[\w./-]*)"
    r"(?::(\w+))?`"
)
# Paths the pages name that a command writes rather than the repository holds.
GENERATED = {"bench/RESULTS.md": "written by `make bench`"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_code_paths_named_exist(page: Path) -> None:
    """`timekeeper/auth/static.py` exists, and `file.py:name` names a def, class or constant in it."""
    missing = []
    for path, name in REPO_PATH.findall(page.read_text(encoding="utf-8")):
        target = ROOT / path
        if path in GENERATED:
            continue
        if not target.exists():
            missing.append(path)
        elif name and not re.search(
            rf"^\s*(?:async def|def|class) {name}\b|^{name}\s*[:=]", target.read_text(encoding="utf-8"), re.M
        ):
            missing.append(f"{path}:{name}")
    assert not missing, f"{page.name} names what the repository does not hold: {missing}"


def _string_literals() -> set[str]:
    sources = (ROOT / part for part in ("timekeeper", "webhook", "sidecar", "nodeagent", "gpuaccounting"))
    text = "\n".join(path.read_text(encoding="utf-8") for source in sources for path in source.rglob("*.py"))
    return set(re.findall(r"""["']([a-z][a-z0-9_]*)["']""", text))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_metric_and_event_names_exist(page: Path) -> None:
    """`webhook_state_polls_total`, `timekeeper_unreachable`: each is a string in the code (less `_total`)."""
    literals = _string_literals()
    unknown = [
        name
        for name in re.findall(r"`((?:timekeeper|webhook)_[a-z0-9_]+)", page.read_text(encoding="utf-8"))
        if name not in literals and name.removesuffix("_total") not in literals
    ]
    assert not unknown, f"{page.name} names metrics or log events the code does not have: {unknown}"


def _defaults() -> dict[str, object]:
    """Each variable's effective default, read from the classes (the sidecar's from a minimal start)."""
    defaults: dict[str, object] = {}
    for settings, prefix in (
        (Settings, "TIMEKEEPER_"),
        (WebhookSettings, "WEBHOOK_"),
        (NodeAgentSettings, "NODEAGENT_"),
    ):
        defaults |= {prefix + name.upper(): field.default for name, field in settings.model_fields.items()}
    config = Config.from_env(SIDECAR_REQUIRED)
    for name in SETTINGS["sidecar"]:
        if name.startswith("SIDECAR_") and name not in SIDECAR_REQUIRED:
            defaults[name] = getattr(config, name.removeprefix("SIDECAR_").lower())
    return defaults


def _agrees(documented: str, default: object) -> bool | None:
    """Whether a table's default cell states the default; None when the cell is prose this cannot judge."""
    token = documented.strip().strip("`").strip()
    if re.fullmatch(r"[A-Z][A-Z0-9_]+", token):  # "the same as another variable"
        return None
    if default is None or default == () or default == frozenset():
        return token in ("unset", "none", "empty") or token.startswith(("unset", "required", "—"))
    if isinstance(default, bool):
        return token == str(default).lower()
    number = default.total_seconds() if isinstance(default, timedelta) else default
    if isinstance(number, int | float):
        match = re.match(r"`?(-?[\d.]+)`?", token)
        return float(match.group(1)) == float(number) if match else None
    if isinstance(default, str | Path):
        return token == str(default)
    return None


def test_documented_defaults_are_the_code_defaults() -> None:
    """A table row naming variables states their defaults in the same order; each one must be the code's."""
    defaults = _defaults()
    wrong = []
    judged = set()
    for page in DOCS:
        header: list[str] = []
        for line in page.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            if not line.startswith("|"):
                header = []
                continue
            if not header:
                header = cells
                continue
            if len(cells) < 3 or header[1] != "default":
                continue
            names = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0])
            if not names or not all(name in defaults for name in names):
                continue
            values = re.split(r",\s+|\s+/\s+", cells[1]) if len(names) > 1 else [cells[1]]
            if len(values) != len(names):
                continue
            for name, value in zip(names, values, strict=True):
                agrees = _agrees(value, defaults[name])
                if agrees is not None:
                    judged.add(name)
                if agrees is False:
                    wrong.append(f"{page.name}: {name} documented {value!r}, code {defaults[name]!r}")
    assert not wrong, "\n".join(wrong)
    assert len(judged) > len(defaults) * 3 // 4, "the tables' default cells were mostly not understood"


def _table_paths(page: Path, section: str) -> set[str]:
    """The paths in the first column of the table under `section`, parameters written `{}`."""
    text = page.read_text(encoding="utf-8").split(section, 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    paths = re.findall(r"(/[a-z][\w/{}-]*)", " ".join(first_cells))
    return {re.sub(r"\{[^}]*\}", "{}", path) for path in paths}


def test_the_timekeeper_api_table_is_the_app_routes() -> None:
    app = create_timekeeper_app(Settings(database_url="postgresql+psycopg://docs@127.0.0.1/docs"))
    routes = {re.sub(r"\{[^}]*\}", "{}", path.removeprefix("/api/v1")) for path in app.openapi()["paths"]}
    documented = _table_paths(ROOT / "docs" / "timekeeper.md", "## API (base `/api/v1`)")
    assert documented == routes


def test_the_webhook_path_table_is_the_app_routes() -> None:
    routes = {route.path for route in create_webhook_app(WebhookSettings()).routes}  # type: ignore[attr-defined]
    assert _table_paths(ROOT / "docs" / "webhook.md", "# The admission webhook") == routes
