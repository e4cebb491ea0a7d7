"""docs/security.md's inventory of inputs stays true: every name the webhook, the shared logic, the timekeeper
and the node agent read from a Kubernetes object, a request or a report is classified there, with who can
write it and, where a tenant can, what makes it harmless. The names are found in the source, not in a list
kept beside it (issue 37): a string key read from a mapping (`obj["spec"]`, `.get("labels")`, `.pop(...)`,
`"key" in obj`, a FastAPI parameter's alias), a module constant used as one
(`annotations.get(names.ANNOTATION_GPU_SHARE)`, resolved through imports and f-strings), every string shaped
like a qualified label, annotation or resource name (`nvidia.com/gpu`, `gpu-timekeeper.io/workload`) or a
camelCase Kubernetes field (`runtimeClassName`) wherever it appears, every module constant named `*_LABEL` /
`*_ANNOTATION`, a typed Kubernetes model's field read as an attribute (`pod.spec.priority_class_name`, in the
modules that use kubernetes_asyncio's models) and every field of the report the timekeeper accepts.
Adding a classification is one line: the name in backticks in the first cell of its row.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio.client import models as kube_models
from pydantic import BaseModel

from timekeeper.usage.schemas import GpuFiguresIn, ReportIn

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "security.md"
SECTION = "## Inputs: who writes what a decision reads"
# What counts, classes, evicts and charges: every module of these, generated code aside.
SCANNED = ("webhook", "gpuaccounting", "timekeeper", "nodeagent")
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")  # protobuf stubs (nodeagent/podresources): no decision
# The report models the timekeeper accepts from a sidecar, by the prefix their fields are named with.
REPORT_MODELS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("report.", ReportIn),
    ("report.gpus.", GpuFiguresIn),
)

PARTIES = ("tenant", "tenant through a controller", "sidecar", "node", "admin", "control plane", "product")
# Who a tenant is, or can act through: a row naming one of them says how its value is made harmless.
TENANT_REACHABLE = ("tenant", "tenant through a controller", "sidecar")

# A label, annotation, resource or API group name: a DNS subdomain with a dot, a slash, and a name (or
# nothing: a prefix read with startswith).
QUALIFIED = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}/(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
)
# A key worth classifying: a name ('', '*', '/', '.' and patterns are string handling, not keys).
KEY = re.compile(r"^[A-Za-z][\w./-]*$")
FASTAPI_PARAMETERS = ("Header", "Query", "Cookie", "Path")
KEY_CONSTANT = re.compile(r"(?:^|_)(?:LABELS?|ANNOTATIONS?)(?:_|$)")
# snake_case attribute -> the API's field name, for every model kubernetes_asyncio has.
KUBE_FIELDS: dict[str, str] = {
    attribute: field
    for model in vars(kube_models).values()
    if inspect.isclass(model) and isinstance(getattr(model, "attribute_map", None), dict)
    for attribute, field in model.attribute_map.items()
}
# A Kubernetes field with a camelCase name (`runtimeClassName`) is one wherever its string appears: kept in a
# local, a tuple, a patch. One-word names (`name`, `type`) are too common for that and count only as keys.
CAMEL_FIELDS = frozenset(field for field in KUBE_FIELDS.values() if field != field.lower())


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Constants:
    """Module-level string constants, by qualified name, and each module's imports, so that a key given as
    `names.ANNOTATION_GPU_SHARE` or an imported `KAI_FRACTION_ANNOTATION` reads as its value."""

    def __init__(self, trees: dict[str, ast.Module], packages: set[str]) -> None:
        self.values: dict[str, str] = {}
        self.imports: dict[str, dict[str, str]] = {
            module: _imports(module if module in packages else module.rpartition(".")[0], tree)
            for module, tree in trees.items()
        }
        changed = True
        while changed:  # a constant built from another (f"{DOMAIN}/gpu-share") resolves on a later round
            changed = False
            for module, tree in trees.items():
                for name, node in _assignments(tree):
                    value = self.value(node, module)
                    if value is not None and self.values.get(f"{module}.{name}") != value:
                        self.values[f"{module}.{name}"] = value
                        changed = True

    def value(self, node: ast.AST, module: str) -> str | None:
        """The string `node` always evaluates to, where the source says so; None otherwise."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.Name):
            own = self.values.get(f"{module}.{node.id}")
            imported = self.imports[module].get(node.id)
            return own if own is not None else self.values.get(imported) if imported else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = self.imports[module].get(node.value.id)
            return self.values.get(f"{target}.{node.attr}") if target else None
        if isinstance(node, ast.JoinedStr):
            parts = [
                self.value(p.value if isinstance(p, ast.FormattedValue) else p, module) for p in node.values
            ]
            return None if None in parts else "".join(p or "" for p in parts)
        return None


def _imports(package: str, tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name, for every import at any depth (relative ones from `package`)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.asname or alias.name: alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *filter(None, [base])])
            found |= {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names}
    return found


def _assignments(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value


def _key_node(node: ast.AST) -> ast.AST | None:
    """The key a node reads from a mapping, if it is such a read."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        return node.args[0] if node.func.attr in ("get", "pop") else None
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
        return node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FASTAPI_PARAMETERS:
        # A request parameter FastAPI reads under its alias (`Header(alias=CLUSTER_HEADER)`).
        return next((keyword.value for keyword in node.keywords if keyword.arg == "alias"), None)
    return None


def reads(root: Path, packages: Iterable[str]) -> dict[str, list[str]]:
    """Every name read by the packages under `root`, each with the `path:line` places that read it."""
    paths = sorted(
        path
        for package in packages
        for path in (root / package).rglob("*.py")
        if not GENERATED.search(path.name)
    )
    trees = {
        _module_name(path, root): ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in paths
    }
    packages = {_module_name(path, root) for path in paths if path.name == "__init__.py"}
    constants = _Constants(trees, packages)
    found: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for path, (module, tree) in zip(paths, trees.items(), strict=True):
        for name, line in _module_reads(module, tree, constants):
            found[name].add((str(path.relative_to(root)), line))
    return {name: [f"{where}:{line}" for where, line in sorted(places)] for name, places in found.items()}


def _module_reads(module: str, tree: ast.Module, constants: _Constants) -> Iterator[tuple[str, int]]:
    # Route paths in decorators (`@router.get("/usage")`) are served, not read; a method called is no field.
    decorators = {id(d) for node in ast.walk(tree) for d in getattr(node, "decorator_list", ())}
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    typed = "kubernetes_asyncio" in {name.split(".")[0] for name in constants.imports[module].values()}
    # Attributes of our own objects and of modules are not a model's fields.
    ours = {"self", "cls", *constants.imports[module], *(name for name, _ in _assignments(tree))}
    for name, assigned in _assignments(tree):
        if KEY_CONSTANT.search(name):  # a key, or keys read in a loop (`for key in POD_GROUP_LABELS`)
            items = assigned.elts if isinstance(assigned, ast.Tuple | ast.List | ast.Set) else [assigned]
            for item in items:
                value = constants.value(item, module)
                if value is not None and KEY.match(value):
                    yield value, item.lineno
    for node in ast.walk(tree):
        if id(node) in decorators or not isinstance(node, ast.expr):  # every read is an expression
            continue
        key = _key_node(node)
        value = constants.value(key, module) if key is not None else None
        if value is not None and KEY.match(value):
            yield value, node.lineno
        if isinstance(node, ast.Constant | ast.JoinedStr):
            text = constants.value(node, module)
            if text is not None and (QUALIFIED.match(text) or text in CAMEL_FIELDS):
                yield text, node.lineno
        if (
            typed
            and isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and node.attr in KUBE_FIELDS
            and id(node) not in called
            and not (isinstance(node.value, ast.Name) and node.value.id in ours)
        ):
            yield KUBE_FIELDS[node.attr], node.lineno
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            attribute = constants.value(node.args[1], module) if len(node.args) > 1 else None
            if typed and attribute in KUBE_FIELDS:  # `getattr(pod.spec, "runtime_class_name", None)`
                yield KUBE_FIELDS[attribute], node.lineno


def report_fields() -> dict[str, list[str]]:
    """`report.seq`, `report.gpus.sm_util_pct`...: what a sidecar (or whoever holds its token) writes."""
    where = str(Path(inspect.getsourcefile(ReportIn) or "").relative_to(ROOT))
    return {
        prefix + field: [f"{where}:{model.__name__}"]
        for prefix, model in REPORT_MODELS
        for field in model.model_fields
    }


@dataclass(frozen=True)
class Row:
    line: int
    names: tuple[str, ...]
    writers: tuple[str, ...]
    harmless: str
    text: str


def inventory(text: str) -> tuple[dict[str, Row], list[Row]]:
    """The section's rows (first cell: the names, in backticks; the fourth: who writes them; the fifth: what
    makes a tenant's value harmless) and each name's row."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    first = text[:start].count("\n") + 1
    rows: list[Row] = []
    for offset, line in enumerate(section.splitlines()):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 5 or cells[0] in ("reads", "") or set(cells[0]) <= {"-"}:
            continue
        writers = tuple(part.strip() for part in re.sub(r"\s*\([^)]*\)", "", cells[3]).split(","))
        names = tuple(re.findall(r"`([^`]+)`", cells[0]))
        rows.append(Row(first + offset, names, writers, cells[4], line))
    return {name: row for row in rows for name in row.names}, rows


def unclassified(found: dict[str, list[str]], rows: list[Row]) -> list[str]:
    """One message per name read but not classified, naming where it is read and the line to change: a row
    that mentions the name in words (an input another change was to read) is the one to put it in."""
    classified = {name for row in rows for name in row.names}
    messages = []
    for name in sorted(found.keys() - classified):
        word = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")
        mentioned = [row.line for row in rows if word.search(row.text)]
        hint = (
            f"docs/security.md:{mentioned[0]} mentions it in words: put `{name}` in that row's first cell"
            if mentioned
            else f"add `{name}` to the first cell of the row that says who writes it, or add a row: "
            f"| `{name}` | <what it is> | <read by> | <{' / '.join(PARTIES)}> | <how a tenant's value is "
            "made harmless, and the test that shows it> |"
        )
        messages.append(
            f"{', '.join(found[name][:3])} read `{name}`, which docs/security.md ({SECTION[3:]}) does not "
            f"classify: {hint}"
        )
    return messages


def _all_reads() -> dict[str, list[str]]:
    return reads(ROOT, SCANNED) | report_fields()


def test_every_input_read_is_classified() -> None:
    _, rows = inventory(PAGE.read_text(encoding="utf-8"))
    missing = unclassified(_all_reads(), rows)
    assert not missing, "\n".join(missing)


def test_every_classified_input_is_still_read() -> None:
    """A name no code reads any more goes from the inventory (a row that still tells is kept in words)."""
    classified, _ = inventory(PAGE.read_text(encoding="utf-8"))
    stale = sorted(classified.keys() - _all_reads().keys())
    assert not stale, f"docs/security.md classifies names nothing reads: {stale}"


def test_each_row_names_its_writers_and_how_a_tenant_value_is_made_harmless() -> None:
    _, rows = inventory(PAGE.read_text(encoding="utf-8"))
    assert rows, f"no rows under {SECTION!r}"
    wrong = [f"line {row.line}: {row.writers}" for row in rows if not set(row.writers) <= set(PARTIES)]
    assert not wrong, f"writers must be among {PARTIES}: {wrong}"
    unsaid = [
        f"line {row.line}"
        for row in rows
        if set(row.writers) & set(TENANT_REACHABLE)
        and not re.search(r"tests/|test_\w+|issue 37", row.harmless)
    ]
    assert not unsaid, (
        f"a tenant-written input's row must say how it is made harmless, with its test: {unsaid}"
    )


# ---- the test of the test ------------------------------------------------------------------------------

SYNTHETIC = """
from kubernetes_asyncio import client
from example import keys

PREFIX = "example.com"
NEW_ANNOTATION = f"{PREFIX}/new-annotation"


def decide(pod: dict, typed: client.V1Pod) -> bool:
    spec = pod["spec"]
    if keys.FLAG in pod["metadata"].get("labels", {}):
        return True
    grace = "terminationGracePeriodSeconds"
    ipc = getattr(typed.spec, "host_ipc", None)
    return spec.get("hostNetwork") or typed.spec.runtime_class_name or spec.get(grace) or spec.get(PLAIN)


from .keys import PLAIN
"""


def test_a_new_unclassified_read_fails_naming_the_input_and_its_line(tmp_path: Path) -> None:
    """A synthetic module's reads: a literal key, an imported constant (absolute and relative), a constant
    only defined, a typed model's field (as an attribute and through getattr), a field kept in a local.
    Each is found at its line, and the ones left out of a small inventory are named with the line to add."""
    (tmp_path / "example").mkdir()
    (tmp_path / "example" / "__init__.py").write_text("")
    (tmp_path / "example" / "keys.py").write_text('FLAG = "example.com/flag"\nPLAIN = "plainKey"\n')
    (tmp_path / "example" / "decide.py").write_text(SYNTHETIC)
    found = reads(tmp_path, ["example"])

    assert found["spec"] == ["example/decide.py:10", "example/decide.py:14", "example/decide.py:15"]
    assert "example/decide.py:11" in found["example.com/flag"]  # through the import, as a label key
    assert found["example.com/new-annotation"] == ["example/decide.py:6"]
    assert found["hostNetwork"] == ["example/decide.py:15"]
    assert found["runtimeClassName"] == ["example/decide.py:15"]
    assert found["terminationGracePeriodSeconds"] == ["example/decide.py:13"]
    assert found["hostIPC"] == ["example/decide.py:14"]
    assert found["plainKey"] == ["example/decide.py:15"]

    page = (
        f"{SECTION}\n\n| reads | what | read by | written by | made harmless by |\n|---|---|---|---|---|\n"
        "| `spec`, `metadata`, `labels`, `example.com/flag`, `example.com/new-annotation`, "
        "`runtimeClassName`, `terminationGracePeriodSeconds`, `plainKey`, `hostIPC` "
        "| x | x | tenant | ignored: `tests/x.py::test_x` |\n"
        "| `example.com/` | the prefix; hostNetwork is the tenant's | x | product | |\n"
    )
    [message] = unclassified(found, inventory(page)[1])
    assert message.startswith("example/decide.py:15 read `hostNetwork`")
    assert "docs/security.md:6 mentions it in words: put `hostNetwork` in that row's first cell" in message
    [message] = unclassified(found, inventory(page.replace("hostNetwork is the tenant's", "-"))[1])
    assert "| `hostNetwork` | <what it is> |" in message
    assert not unclassified(
        found, inventory(page.replace("`example.com/`", "`example.com/`, `hostNetwork`"))[1]
    )
