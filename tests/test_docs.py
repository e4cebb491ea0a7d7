"""The docs must stay true: the names, links, make targets and modules they mention exist in the code.

Platform engineers configure the system from README.md and docs/*.md, so a renamed setting or a moved page
must fail a test rather than cost someone an afternoon. Every check reads the code itself (the settings
classes, the sidecar's parser, the Makefile), never a copy of it. The code's own docstrings and comments
are held to the same: a module, file, folder or numbered line (`:NN`) they name must exist.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import re
import tokenize
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
    names = set()
    for name, field in settings.model_fields.items():
        assert not field.alias, "an aliased field is read under another name; teach this test the alias"
        # AliasChoices: the field's own name, and the variables it is read from (a former name too).
        choices = getattr(field.validation_alias, "choices", [name])
        names |= {choice if choice.startswith(prefix) else prefix + choice.upper() for choice in choices}
    return names


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
    """`timekeeper/auth/static.py` exists, and `timekeeper/auth/static.py:StaticTokens` names a def, class or
    constant in it."""
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


# Names written in prose: dotted module names (`gpuaccounting.names`, `timekeeper.settings.Settings`, and in
# timekeeper/ `usage.service` for timekeeper.usage.service) and source paths (`gpuaccounting/wire.py`,
# `gpuaccounting/wire.py:10`), in the pages and in the code's own docstrings and comments. A module moved or
# renamed must fail here, naming the file and line to fix.

# Our top-level packages: those the repository holds now, and those named in its docs before (so a name
# in a renamed or removed package is reported, not skipped as a third party's).
KNOWN_PACKAGES = ("timekeeper", "webhook", "sidecar", "nodeagent", "gpuaccounting", "gpunvml", "httpguard")
PACKAGES = tuple(
    sorted({*KNOWN_PACKAGES, *(path.parent.name for path in ROOT.glob("*/__init__.py"))} - {"migrations"})
)
# Our packages' family of names (gpuaccounting, gpunvml...): a name in it is ours, even once renamed away.
OUR_FAMILY = re.compile(r"gpu[a-z]+")
# The packages a page may name relative to (`usage/service.py`, `usage.service` in docs/timekeeper.md).
PRODUCT = tuple(package for package in PACKAGES if package not in ("bench", "demo", "tests"))
PROSE_PAGES = [
    *PAGES,
    *(path for path in (ROOT / "CONTRIBUTING.md", ROOT / "bench" / "RESULTS.md") if path.exists()),
]
PROSE_CODE = sorted(
    path for package in PACKAGES if (ROOT / package).is_dir() for path in (ROOT / package).rglob("*.py")
)
# The repository's Python files, for a bare file name (`conftest.py`, `generate_tokens.py`).
PY_FILES = [
    path
    for path in ROOT.rglob("*.py")
    if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
]

# `a.b.c` not inside a longer token: not after a word, dot, slash or hyphen; not before a word, slash,
# hyphen or `.word` (so a host name `timekeeper.gpu-timekeeper.svc` is no module, and a full stop ends one).
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-]|\.\w)")
# `webhook/certificates/tls.py` or `tls.py`, with optional line numbers `:12`, `:75,80` or `:12-40`.
SOURCE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)(?::(\d+(?:[-,]\d+)*))?(?![\w/-])")
# `timekeeper/periodic/` or, in a package, `periodic/`: a folder, named by its trailing slash.
SOURCE_FOLDER = re.compile(r"(?<![\w./-])((?:[\w-]+/)+)(?![\w.-])")
# What ends a file or host name, never an attribute: `timekeeper.md`, `webhook.Dockerfile`, `a.b.internal`.
NOT_ATTRIBUTES = {"md", "py", "yaml", "yml", "json", "toml", "sh", "Dockerfile", "svc", "io", "internal"}


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a page's lines, or of a Python file's comments and docstrings only."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        yield from enumerate(source.splitlines(), 1)
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                lines = first.value.value.splitlines() if isinstance(first.value.value, str) else []
                yield from ((first.lineno + offset, line) for offset, line in enumerate(lines))


def _module_source(parts: tuple[str, ...]) -> Path | None:
    """The file of module `parts` (`gpuaccounting/wire.py`, or a package's `__init__.py`)."""
    base = ROOT.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _top_level_names(module: Path) -> frozenset[str]:
    """Best effort: the module's top-level defs, classes, assignments and imports."""
    defined: set[str] = set()
    statements = list(ast.parse(module.read_text(encoding="utf-8")).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {
                name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)
            }
        elif isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            statements += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            statements += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return frozenset(defined)


def _defines(module: Path, name: str) -> bool:
    names = _top_level_names(module)
    return name in names or "__getattr__" in names


def _unresolved_module(parts: tuple[str, ...], root: tuple[str, ...]) -> str | None:
    """Why `root + parts` names no module or module attribute; None when it does.

    The longest prefix that is a module must be the whole name, or define the next part (`Settings` in
    `timekeeper.settings.Settings.database_url`); what follows that is not checked.
    """
    full = root + parts
    for length in range(len(full), len(root), -1):
        module = _module_source(full[:length])
        if module is None:
            continue
        if length == len(full) or _defines(module, full[length]):
            return None
        return f"`{'.'.join(full[:length])}` has no module or attribute `{full[length]}`"
    return f"no module `{'.'.join(full[: len(root) + 1])}`"


def _module_roots(path: Path) -> tuple[str, ...]:
    """The packages a file's relative names start in: its own (none for tests/); for a page, every product."""
    if path.suffix != ".py" or not path.is_relative_to(ROOT):
        return PRODUCT
    top = path.relative_to(ROOT).parts[0]
    return () if top == "tests" else (top,)


def _where(path: Path, number: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}"


def _dotted_findings(path: Path, number: int, text: str) -> Iterator[str]:
    """`timekeeper.usage.service` checked from the root; `usage.service` where `usage` is a subpackage of a
    root package."""
    where = _where(path, number)
    for match in DOTTED.finditer(text):
        parts = tuple(match.group(1).split("."))
        if parts[-1] in NOT_ATTRIBUTES:
            continue
        if parts[0] in PACKAGES or OUR_FAMILY.fullmatch(parts[0]):
            reasons = [_unresolved_module(parts, ())]
        else:
            roots = [
                root for root in _module_roots(path) if (ROOT / root / parts[0] / "__init__.py").is_file()
            ]
            reasons = [_unresolved_module(parts, (root,)) for root in roots]
        if reasons and all(reasons):
            yield f"{where}: `{match.group(1)}`: {reasons[0]}"


def _path_bases(path: Path) -> list[Path]:
    """Where a file's relative paths start: the root, each product package, deployment/, and a Python
    file's own folder and the ones above it."""
    folders = (
        [folder for folder in path.parents if folder.is_relative_to(ROOT)] if path.suffix == ".py" else []
    )
    return [*folders, ROOT, *(ROOT / package for package in PRODUCT), ROOT / "deployment"]


def _path_findings(path: Path, number: int, text: str) -> Iterator[str]:
    """A path with a folder exists under one of the file's bases, a bare file name anywhere; `:NN` is a line
    of it."""
    where = _where(path, number)
    for match in SOURCE_PATH.finditer(text):
        named, lines = match.groups()
        if "/" in named:
            found = [base / named for base in _path_bases(path) if (base / named).is_file()]
        else:
            found = [source for source in PY_FILES if source.name == named]
        if not found:
            yield f"{where}: `{match.group(0)}`: no such file"
        elif lines:
            needed = max(int(line) for line in re.split(r"[-,]", lines))
            if not any(len(source.read_text(encoding="utf-8").splitlines()) >= needed for source in found):
                yield f"{where}: `{match.group(0)}`: {named} has fewer than {needed} lines"


def _folder_findings(path: Path, number: int, text: str) -> Iterator[str]:
    """A folder of ours (its first part a package, or a subpackage of a root package) exists under a base."""
    for match in SOURCE_FOLDER.finditer(text):
        first = match.group(1).split("/")[0]
        ours = first in PACKAGES or bool(OUR_FAMILY.fullmatch(first))
        ours = ours or any((ROOT / root / first).is_dir() for root in _module_roots(path))
        if ours and not any((base / match.group(1)).is_dir() for base in _path_bases(path)):
            yield f"{_where(path, number)}: `{match.group(1)}`: no such folder"


def reference_findings(path: Path) -> list[str]:
    """Every dotted module name, source path and folder in `path`'s prose that names nothing in the
    repository."""
    findings = []
    for number, text in _prose(path):
        findings += [
            *_dotted_findings(path, number, text),
            *_path_findings(path, number, text),
            *_folder_findings(path, number, text),
        ]
    return findings


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda page: page.name)
def test_modules_and_source_paths_named_in_pages_exist(page: Path) -> None:
    findings = reference_findings(page)
    assert not findings, "names no module or file in the repository:\n" + "\n".join(findings)


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_and_source_paths_named_in_docstrings_and_comments_exist(package: str) -> None:
    findings = [
        finding
        for path in PROSE_CODE
        if path.is_relative_to(ROOT / package)
        for finding in reference_findings(path)
    ]
    assert not findings, "names no module or file in the repository:\n" + "\n".join(findings)


def test_a_docstring_or_comment_naming_a_missing_module_or_line_is_found(tmp_path: Path) -> None:
    """The checker itself: what does not exist is found, at its line; what exists is not."""
    source = tmp_path / "drifted.py"
    source.write_text(
        '"""Reads the snapshot (timekeeper.no_such_module.repository), as `gpuaccounting.names` says."""\n'
        "\n"
        "# By usage.no_such_module.weight; see usage/no_such_file.py and gpuaccounting/wire.py:100000.\n"
        "# True: gpuaccounting.wire.build_report, gpuaccounting/wire.py:1, timekeeper.settings.Settings.\n"
        "# Folders: timekeeper/no_such_folder/ and usage/no_such_folder/, not gpuaccounting/ nor usage/.\n"
        "# A package renamed away: gpuretired.bodies.\n"
        "def f() -> None:\n"
        '    """Not gpuaccounting.wire.no_such_name."""\n',
        encoding="utf-8",
    )
    assert sorted(reference_findings(source)) == [
        f"{source}:1: `timekeeper.no_such_module.repository`: "
        "`timekeeper` has no module or attribute `no_such_module`",
        f"{source}:3: `gpuaccounting/wire.py:100000`: gpuaccounting/wire.py has fewer than 100000 lines",
        f"{source}:3: `usage.no_such_module.weight`: "
        "`timekeeper.usage` has no module or attribute `no_such_module`",
        f"{source}:3: `usage/no_such_file.py`: no such file",
        f"{source}:5: `timekeeper/no_such_folder/`: no such folder",
        f"{source}:5: `usage/no_such_folder/`: no such folder",
        f"{source}:6: `gpuretired.bodies`: no module `gpuretired`",
        f"{source}:8: `gpuaccounting.wire.no_such_name`: "
        "`gpuaccounting.wire` has no module or attribute `no_such_name`",
    ]
