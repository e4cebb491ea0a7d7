"""A stand-in kube-apiserver: a real HTTP server on 127.0.0.1 speaking the Kubernetes JSON.

No kube-apiserver runs in the unit tests, so the timekeeper's Kubernetes boundary is tested against this,
driven by the real clients (`kubernetes_asyncio` for the timekeeper, `kubernetes` for the webhook's
bootstrap). It reproduces the semantics the timekeeper relies on, as the real server answers them:

- a generic object store (core and `/apis/<group>/<version>` paths, namespaced and cluster-scoped: the kinds
  in `RESOURCE_TYPES`, e.g. Secrets, Deployments, webhook configurations) with
  monotonically increasing resourceVersions, uids, creationTimestamps; create (409 AlreadyExists), get (404
  NotFound), update with optimistic concurrency (409 Conflict), JSON / merge / strategic-merge patch, delete,
  the `status` subresource; errors as `Status` objects with code and reason;
- list with `limit`/`continue`, `labelSelector`, `fieldSelector`, and watch (`?watch=true&resourceVersion=`,
  `timeoutSeconds`) streaming newline-delimited WatchEvents over chunked HTTP; a watch from a compacted
  resourceVersion gets an `ERROR` event carrying a 410 `Expired` Status, as from the watch cache; with
  `allowWatchBookmarks=true` a watch that times out ends with a `BOOKMARK` at the current resourceVersion;
- authentication by bearer token and authorisation by real RBAC objects (Roles, ClusterRoles with
  aggregation, RoleBindings, ClusterRoleBindings) stored like any other object; `system:masters` may do
  anything;
- TokenReview (audiences, pod-bound ServiceAccount tokens with the pod-name / pod-uid extras, invalid once
  their pod is gone) and SubjectAccessReview evaluated against the same RBAC;
- pods/eviction honouring PodDisruptionBudgets (429 TooManyRequests when `disruptionsAllowed` is 0; a
  `dryRun=All` eviction checks without evicting or spending), and
  graceful deletion of running pods (deletionTimestamp first, the object goes when `finish_pod_deletion`);
  the Eviction body's `policy/<version>` must be one the server serves (`eviction_versions`: v1 and v1beta1
  as from 1.22, set `("v1beta1",)` to answer as 1.20 does), and `GET /apis/policy` discovers them;
- every resource request logged in `calls` (verb, resource, namespace, name, answer code), so a test can say
  exactly what a client wrote, or that an idempotent run wrote nothing.

Approximations, documented: continue tokens page over the current state (the list's resourceVersion is the
first page's, so a watch from it still sees every later change); strategic merge merges lists of objects by
`name` and replaces other lists; no defaulting or schema validation beyond names.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import kubernetes
import kubernetes_asyncio

from tests.support.loopback import LoopbackServer, send_json

JSON = dict[str, Any]

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SUPERUSER_GROUP = "system:masters"
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCE_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False),
    ResourceType("", "v1", "pods", "Pod", True),
    ResourceType("", "v1", "nodes", "Node", False),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True),
    ResourceType("", "v1", "events", "Event", True),
    ResourceType("", "v1", "secrets", "Secret", True),
    ResourceType("", "v1", "configmaps", "ConfigMap", True),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True),
    ResourceType("events.k8s.io", "v1", "events", "Event", True),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
    ResourceType("apps", "v1", "deployments", "Deployment", True),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True),
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
    ),
)
_TYPES = {(t.group, t.version, t.plural): t for t in RESOURCE_TYPES}
_KINDS = {(t.group, t.kind): t for t in RESOURCE_TYPES}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error the server answers with a `Status` object, exactly as the real apiserver words it."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    @classmethod
    def not_found(cls, plural: str, name: str) -> ApiError:
        return cls(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})

    @classmethod
    def already_exists(cls, rtype: ResourceType, name: str) -> ApiError:
        details = {"name": name, "group": rtype.group, "kind": rtype.plural}
        return cls(409, "AlreadyExists", f'{rtype.plural} "{name}" already exists', details)

    @classmethod
    def conflict(cls, rtype: ResourceType, name: str) -> ApiError:
        message = (
            f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        return cls(409, "Conflict", message, {"name": name, "group": rtype.group, "kind": rtype.plural})


@dataclass
class TokenInfo:
    """What a bearer token stands for: the user, and the audiences and pod it is bound to."""

    username: str
    uid: str
    groups: tuple[str, ...]
    audiences: tuple[str, ...] = (API_AUDIENCE,)
    extra: dict[str, list[str]] = field(default_factory=dict)
    bound_pod: tuple[str, str, str] | None = None  # namespace, name, uid


@dataclass(frozen=True)
class WatchEvent:
    resource_version: int
    rtype: ResourceType
    namespace: str | None
    type: str
    obj: JSON


@dataclass(frozen=True)
class Call:
    """One resource request as the audit log would show it: who was asked what, and the answer's code."""

    verb: str
    resource: str  # plural[/subresource]
    namespace: str | None
    name: str | None
    code: int


@dataclass(frozen=True)
class Request:
    """One parsed API request: the resource it addresses and what is asked of it."""

    method: str
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    query: dict[str, str]
    body: Any
    content_type: str

    @property
    def verb(self) -> str:
        if self.method == "GET":
            # Go's strconv.ParseBool: the Python client sends "True".
            if self.query.get("watch", "").lower() in ("1", "t", "true"):
                return "watch"
            return "get" if self.name else "list"
        if self.method == "DELETE":
            return "delete" if self.name else "deletecollection"
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}[self.method]


def _labels_match(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against an object's labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _string_selector_matches(selector: str, lookup: Any) -> bool:
    """`a=b,c!=d,e` selectors (labelSelector equality/existence; fieldSelector equality)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if lookup(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if lookup(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if lookup(term[1:]) is not None:
                return False
        elif lookup(term) is None:
            return False
    return True


def _field(obj: JSON, path: str) -> str | None:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return None if value is None else str(value)


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch; with `strategic`, lists of named objects are merged by `name`."""
    if not isinstance(patch, dict):
        if strategic and isinstance(patch, list) and isinstance(target, list):
            return _merge_named_lists(target, patch)
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value, strategic)
    return result


def _merge_named_lists(target: list[Any], patch: list[Any]) -> list[Any]:
    if not all(isinstance(i, dict) and "name" in i for i in [*target, *patch]):
        return copy.deepcopy(patch)
    merged = {item["name"]: copy.deepcopy(item) for item in target}
    for item in patch:
        merged[item["name"]] = merge_patch(merged.get(item["name"]), item, strategic=True)
    return list(merged.values())


class KubeApiServer:
    """The stand-in server. `start()` it, point a `kubernetes.client.Configuration` at `url`, `stop()` it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 0
        self._objects: dict[tuple[ResourceType, str | None, str], JSON] = {}
        self._history: list[WatchEvent] = []
        self._compacted_rv = 0
        self._epoch = 0  # bumped by end_watches(): open watches end
        self._tokens: dict[str, TokenInfo] = {}
        self._stopping = False
        self._server: LoopbackServer | None = None
        # The policy/ versions whose Eviction the server accepts (and discovery lists).
        self.eviction_versions: tuple[str, ...] = ("v1", "v1beta1")
        # Whether resource.k8s.io/v1 is served (discovery lists it; off: the group is absent, as before 1.32).
        self.serves_dra = True
        # (verb, resource plural[/subresource]) of every authorised request, for assertions on traffic.
        self.requests: Counter[tuple[str, str]] = Counter()
        # Every resource request in order, with its answer, for assertions on exactly what was written.
        self.calls: list[Call] = []
        # Paths a hostile API server answers with any bytes it likes (200), whatever is stored.
        self.raw_answers: dict[str, bytes] = {}
        # Paths a hostile API server answers only after this many seconds (a slow one, at will), and how
        # many requests for each have arrived (counted before the wait).
        self.delays: dict[str, float] = {}
        self.delayed: Counter[str] = Counter()
        # Paths a hostile API server answers with a 307 to this URL.
        self.redirects: dict[str, str] = {}

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._server = LoopbackServer(handler).start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        return self._server.url

    def client_configuration(self, token: str) -> kubernetes.client.Configuration:
        """A client configuration that talks to this server with a bearer token."""
        config = kubernetes.client.Configuration(host=self.url)
        config.api_key = {"authorization": token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return config

    def asyncio_configuration(self, token: str) -> kubernetes_asyncio.client.Configuration:
        """The same for kubernetes_asyncio (the timekeeper's client)."""
        config = kubernetes_asyncio.client.Configuration(host=self.url)
        config.api_key = {"BearerToken": f"Bearer {token}"}
        return config

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig for this server with a bearer token, as `kubectl` writes them (JSON is YAML)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": token}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config))
        return path

    def writes(self) -> list[Call]:
        """The calls that asked for a change (whatever the answer)."""
        return [c for c in self.calls if c.verb not in ("get", "list", "watch")]

    # ---- identities ------------------------------------------------------------------------------------

    def add_user(self, username: str, groups: Iterable[str] = (), token: str | None = None) -> str:
        """Register a user's API token (as from an OIDC or static-token authenticator); returns it."""
        token = token or secrets.token_urlsafe(24)
        all_groups = (*groups, "system:authenticated")
        self._tokens[token] = TokenInfo(username, str(uuid.uuid4()), all_groups)
        return token

    def add_service_account_token(
        self,
        namespace: str,
        service_account: str,
        audiences: Iterable[str] = (API_AUDIENCE,),
        pod: JSON | None = None,
    ) -> str:
        """Issue a ServiceAccount token, optionally bound to a pod (a projected token) and to audiences."""
        token = secrets.token_urlsafe(32)
        extra: dict[str, list[str]] = {"authentication.kubernetes.io/credential-id": [f"JTI={uuid.uuid4()}"]}
        bound_pod = None
        if pod is not None:
            meta = pod["metadata"]
            bound_pod = (meta["namespace"], meta["name"], meta["uid"])
            extra[POD_NAME_EXTRA] = [meta["name"]]
            extra[POD_UID_EXTRA] = [meta["uid"]]
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
        self._tokens[token] = TokenInfo(
            f"system:serviceaccount:{namespace}:{service_account}",
            str(uuid.uuid4()),
            groups,
            tuple(audiences),
            extra,
            bound_pod,
        )
        return token

    def _authenticate(self, token: str, audiences: Iterable[str]) -> tuple[TokenInfo, list[str]] | str:
        """The token's identity and the audiences it is valid for, or why it is not accepted."""
        info = self._tokens.get(token)
        if info is None:
            return "invalid bearer token"
        wanted = list(audiences) or [API_AUDIENCE]
        matched = [a for a in wanted if a in info.audiences]
        if not matched:
            return (
                f"invalid bearer token, token audiences {json.dumps(list(info.audiences))} is invalid for "
                f"the target audiences {json.dumps(wanted)}"
            )
        if info.bound_pod is not None:
            namespace, name, pod_uid = info.bound_pod
            with self._cond:
                pod = self._objects.get((_TYPES["", "v1", "pods"], namespace, name))
            if pod is None:
                return f'invalid bearer token, pods "{name}" not found'
            if pod["metadata"]["uid"] != pod_uid:
                return (
                    f"invalid bearer token, the UID in the bound object reference ({pod_uid}) does not "
                    f"match the UID in record. The object might have been deleted and then recreated"
                )
        return info, matched

    # ---- RBAC ------------------------------------------------------------------------------------------

    def rbac_allows(
        self,
        user: str,
        groups: Iterable[str],
        verb: str,
        group: str,
        resource: str,
        namespace: str | None,
        name: str | None = None,
    ) -> bool:
        """RBAC as the real authorizer evaluates it: cluster bindings anywhere, role bindings in their ns."""
        groups = set(groups)
        if SUPERUSER_GROUP in groups:
            return True
        with self._cond:
            bindings = [
                obj
                for (rtype, ns, _), obj in self._objects.items()
                if rtype.plural == "clusterrolebindings"
                or (rtype.plural == "rolebindings" and namespace and ns == namespace)
            ]
            for binding in bindings:
                if not any(self._subject_matches(s, user, groups) for s in binding.get("subjects") or []):
                    continue
                rules = self._role_rules(binding["roleRef"], binding["metadata"].get("namespace"))
                if any(self._rule_matches(r, verb, group, resource, name) for r in rules):
                    return True
        return False

    @staticmethod
    def _subject_matches(subject: JSON, user: str, groups: set[str]) -> bool:
        kind, name = subject["kind"], subject["name"]
        if kind == "User":
            return name == user
        if kind == "Group":
            return name in groups
        if kind == "ServiceAccount":
            return user == f"system:serviceaccount:{subject.get('namespace')}:{name}"
        return False

    def _role_rules(self, role_ref: JSON, binding_namespace: str | None) -> list[JSON]:
        rbac = "rbac.authorization.k8s.io"
        if role_ref["kind"] == "Role":
            role = self._objects.get((_TYPES[rbac, "v1", "roles"], binding_namespace, role_ref["name"]))
            return (role or {}).get("rules") or []
        cluster_roles = _TYPES[rbac, "v1", "clusterroles"]
        role = self._objects.get((cluster_roles, None, role_ref["name"]))
        if role is None:
            return []
        aggregation = role.get("aggregationRule")
        if not aggregation:
            return role.get("rules") or []
        # What the clusterrole-aggregation controller would have written into `rules`.
        return [
            rule
            for (rtype, _, _), other in self._objects.items()
            if rtype is cluster_roles
            and any(
                _labels_match(sel, other["metadata"].get("labels") or {})
                for sel in aggregation.get("clusterRoleSelectors") or []
            )
            for rule in other.get("rules") or []
        ]

    @staticmethod
    def _rule_matches(rule: JSON, verb: str, group: str, resource: str, name: str | None) -> bool:
        def has(values: Iterable[str] | None, wanted: str) -> bool:
            values = list(values or [])
            return "*" in values or wanted in values

        if not has(rule.get("verbs"), verb) or not has(rule.get("apiGroups"), group):
            return False
        resources = rule.get("resources") or []
        sub = resource.partition("/")[2]
        if not (has(resources, resource) or (sub and f"*/{sub}" in resources)):
            return False
        names = rule.get("resourceNames") or []
        return not names or (name is not None and name in names)

    # ---- store -----------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def end_watches(self) -> None:
        """End every open watch (as an apiserver restart or a load balancer does); clients resume."""
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget the watch history and end open watches, as an apiserver restart after etcd compaction
        does: a watch resumed from an older resourceVersion now gets 410 Expired."""
        with self._cond:
            self._compacted_rv = self._rv
            self._history.clear()
        self.end_watches()

    def put(self, obj: JSON) -> JSON:
        """Create or replace an object directly (test setup, or what a controller/kubelet would write)."""
        rtype = self._type_of(obj)
        meta = obj.setdefault("metadata", {})
        with self._cond:
            existing = self._objects.get((rtype, meta.get("namespace"), meta["name"]))
            if existing is None:
                return self._create(rtype, meta.get("namespace"), obj)
            meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
            return self._update(rtype, meta.get("namespace"), meta["name"], obj)

    def apply(self, objects: Iterable[JSON], namespace: str) -> None:
        """Store manifests as `kubectl apply -n <namespace>` does: namespaced kinds land in `namespace`."""
        for obj in objects:
            if self._type_of(obj).namespaced:
                obj.setdefault("metadata", {}).setdefault("namespace", namespace)
            self.put(obj)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> JSON | None:
        group = api_version.rpartition("/")[0]
        with self._cond:
            obj = self._objects.get((_KINDS[group, kind], namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[JSON]:
        rtype = _KINDS[api_version.rpartition("/")[0], kind]
        with self._cond:
            return [
                copy.deepcopy(o)
                for (t, ns, _), o in sorted(self._objects.items(), key=lambda kv: (kv[0][1] or "", kv[0][2]))
                if t is rtype and (namespace is None or ns == namespace)
            ]

    def with_identity(self) -> KubeApiServer:
        """The server's `kube-system` namespace, as a real API server has: its uid (unique per server) is
        the cluster's identity a fleet's hub reads (timekeeper/auth/kubernetes.py, ClusterIdentities)."""
        self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
        return self

    def forge_uid(self, namespace: str, name: str, uid: str) -> JSON:
        """Give a stored pod the uid `uid`, as the admin of a hostile API server can (etcd written
        directly): its TokenReviews and pod reads then answer that uid. Returns the pod."""
        with self._cond:
            pod = self._objects[(_TYPES["", "v1", "pods"], namespace, name)]
            pod["metadata"]["uid"] = uid
            self._bump(_TYPES["", "v1", "pods"], namespace, "MODIFIED", pod)
            return copy.deepcopy(pod)

    def remove(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        with self._cond:
            self._delete(_KINDS[api_version.rpartition("/")[0], kind], namespace, name, graceful=False)

    def delete_pod(self, namespace: str, name: str, grace_period_seconds: int) -> None:
        """What a client's DELETE of the pod with this gracePeriodSeconds does."""
        with self._cond:
            self._delete(
                _KINDS["", "Pod"], namespace, name, options={"gracePeriodSeconds": grace_period_seconds}
            )

    def finish_pod_deletion(self, namespace: str, name: str) -> None:
        """What the kubelet does once a gracefully deleted pod's containers have stopped."""
        self.remove("v1", "Pod", namespace, name)

    @staticmethod
    def _type_of(obj: JSON) -> ResourceType:
        return _KINDS[obj["apiVersion"].rpartition("/")[0], obj["kind"]]

    def _bump(self, rtype: ResourceType, namespace: str | None, type_: str, obj: JSON) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append(WatchEvent(self._rv, rtype, namespace, type_, copy.deepcopy(obj)))
        self._cond.notify_all()

    def _create(self, rtype: ResourceType, namespace: str | None, obj: JSON) -> JSON:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.kind} "" is invalid: metadata.name: Required value: '
                "name or generateName is required",
                {"kind": rtype.kind, "causes": [{"reason": "FieldValueRequired", "field": "metadata.name"}]},
            )
        key = (rtype, namespace, meta["name"])
        if key in self._objects:
            raise ApiError.already_exists(rtype, meta["name"])
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        self._fill_status(rtype, obj)
        self._objects[key] = obj
        self._bump(rtype, namespace, "ADDED", obj)
        return copy.deepcopy(obj)

    def _update(self, rtype: ResourceType, namespace: str | None, name: str, obj: JSON) -> JSON:
        current = self._objects.get((rtype, namespace, name))
        if current is None:
            raise ApiError.not_found(rtype.plural, name)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})",
            )
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rtype, name)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        for kept in ("uid", "creationTimestamp", "namespace", "deletionTimestamp"):
            if kept in current["metadata"]:
                meta[kept] = current["metadata"][kept]
        meta["name"] = name
        changed_spec = {k: v for k, v in obj.items() if k not in ("metadata", "status")} != {
            k: v for k, v in current.items() if k not in ("metadata", "status")
        }
        meta["generation"] = current["metadata"].get("generation", 1) + (1 if changed_spec else 0)
        self._fill_status(rtype, obj)
        self._objects[(rtype, namespace, name)] = obj
        self._bump(rtype, namespace, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def _delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        graceful: bool = True,
        options: JSON | None = None,
    ) -> JSON:
        """`options`: the DeleteOptions (an Eviction's `deleteOptions`): their `gracePeriodSeconds` over
        the pod's terminationGracePeriodSeconds, and a `preconditions.uid` that must match (else 409)."""
        obj = self._objects.get((rtype, namespace, name))
        if obj is None:
            raise ApiError.not_found(rtype.plural, name)
        options = options or {}
        wanted_uid = (options.get("preconditions") or {}).get("uid")
        if wanted_uid is not None and wanted_uid != obj["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {wanted_uid}")
        if graceful and rtype.plural == "pods" and self._deletes_gracefully(obj):
            # The deletionTimestamp is when the grace ends; a second DELETE may shorten it, never lengthen.
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            current = obj["metadata"].get("deletionGracePeriodSeconds")
            if current is None or grace < current:
                ends = datetime.now(UTC) + timedelta(seconds=grace)
                obj["metadata"]["deletionTimestamp"] = ends.strftime("%Y-%m-%dT%H:%M:%SZ")
                obj["metadata"]["deletionGracePeriodSeconds"] = grace
                self._bump(rtype, namespace, "MODIFIED", obj)
            return copy.deepcopy(obj)
        del self._objects[(rtype, namespace, name)]
        self._bump(rtype, namespace, "DELETED", obj)
        return copy.deepcopy(obj)

    @staticmethod
    def _deletes_gracefully(pod: JSON) -> bool:
        """A pod on a node that has not finished is deleted gracefully; the kubelet removes it later."""
        phase = (pod.get("status") or {}).get("phase")
        return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")

    @staticmethod
    def _fill_status(rtype: ResourceType, obj: JSON) -> None:
        """What the quota controller writes back shortly after a ResourceQuota changes."""
        if rtype.plural == "resourcequotas":
            status = obj.setdefault("status", {})
            status["hard"] = dict((obj.get("spec") or {}).get("hard") or {})
            status.setdefault("used", {})

    # ---- request handling ------------------------------------------------------------------------------

    def handle(self, request: Request) -> tuple[int, JSON]:
        """Answer one non-watch request (authorised already)."""
        r = request
        with self._cond:
            if r.rtype.plural == "pods" and r.subresource == "eviction" and r.method == "POST":
                return self._evict(r)
            if r.subresource not in (None, "status"):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if r.method == "GET" and r.name:
                obj = self._objects.get((r.rtype, r.namespace, r.name))
                if obj is None:
                    raise ApiError.not_found(r.rtype.plural, r.name)
                return 200, copy.deepcopy(obj)
            if r.method == "GET":
                return 200, self._list(r)
            if r.method == "POST" and not r.name:
                return 201, self._create(r.rtype, r.namespace, self._checked_body(r))
            if r.method == "PUT" and r.name:
                body = self._checked_body(r)
                if r.subresource == "status":
                    current = self._objects.get((r.rtype, r.namespace, r.name))
                    if current is None:
                        raise ApiError.not_found(r.rtype.plural, r.name)
                    body = {
                        **copy.deepcopy(current),
                        "status": body.get("status"),
                        "metadata": body["metadata"],
                    }
                return 200, self._update(r.rtype, r.namespace, r.name, body)
            if r.method == "PATCH" and r.name:
                return 200, self._patch(r)
            if r.method == "DELETE" and r.name:
                options = r.body if isinstance(r.body, dict) else None
                return 200, self._delete(r.rtype, r.namespace, r.name, options=options)
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on {r.rtype.plural}")

    def _checked_body(self, r: Request) -> JSON:
        body = r.body
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body is not a JSON object")
        body.setdefault("metadata", {})
        body_ns = body["metadata"].get("namespace")
        if r.rtype.namespaced and body_ns and body_ns != r.namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        return body

    def _patch(self, r: Request) -> JSON:
        current = self._objects.get((r.rtype, r.namespace, r.name))
        if current is None:
            raise ApiError.not_found(r.rtype.plural, r.name or "")
        if r.content_type == "application/json-patch+json":
            try:
                patched = jsonpatch.apply_patch(current, r.body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}") from exc
        elif r.content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            strategic = r.content_type == "application/strategic-merge-patch+json"
            patched = merge_patch(current, r.body, strategic)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {r.content_type}",
            )
        if r.subresource == "status":
            patched = {**copy.deepcopy(current), "status": patched.get("status")}
        patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self._update(r.rtype, r.namespace, r.name or "", patched)

    def _list(self, r: Request) -> JSON:
        items = self._matching(r.rtype, r.namespace, r.query)
        first = int(base64.urlsafe_b64decode(r.query["continue"]).decode()) if r.query.get("continue") else 0
        limit = int(r.query.get("limit") or 0)
        page = items[first : first + limit] if limit else items[first:]
        metadata: JSON = {"resourceVersion": str(self._rv)}
        if limit and first + limit < len(items):
            metadata["continue"] = base64.urlsafe_b64encode(str(first + limit).encode()).decode()
            metadata["remainingItemCount"] = len(items) - first - limit
        return {
            "kind": f"{r.rtype.kind}List",
            "apiVersion": r.rtype.api_version,
            "metadata": metadata,
            "items": [copy.deepcopy(o) for o in page],
        }

    def _matching(self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str]) -> list[JSON]:
        return [
            obj
            for (t, ns, _), obj in sorted(self._objects.items(), key=lambda kv: (kv[0][1] or "", kv[0][2]))
            if t is rtype and (namespace is None or ns == namespace) and self._selected(obj, query)
        ]

    @staticmethod
    def _selected(obj: JSON, query: Mapping[str, str]) -> bool:
        labels = obj["metadata"].get("labels") or {}
        if query.get("labelSelector") and not _string_selector_matches(query["labelSelector"], labels.get):
            return False
        fields = query.get("fieldSelector")
        return not fields or _string_selector_matches(fields, lambda path: _field(obj, path))

    def policy_group(self) -> JSON:
        """`GET /apis/policy`: the APIGroup discovery document."""
        versions = [{"groupVersion": f"policy/{v}", "version": v} for v in self.eviction_versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": "policy",
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def dra_group(self) -> JSON | None:
        """`GET /apis/resource.k8s.io`: the APIGroup discovery document; None where it is not served."""
        if not self.serves_dra:
            return None
        versions = [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": "resource.k8s.io",
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def _evict(self, r: Request) -> tuple[int, JSON]:
        body = r.body if isinstance(r.body, dict) else {}
        served = {f"policy/{v}" for v in self.eviction_versions}
        if body.get("kind") != "Eviction" or body.get("apiVersion") not in served:
            raise ApiError(
                400,
                "BadRequest",
                f'no kind "{body.get("kind")}" is registered for version "{body.get("apiVersion")}"',
            )
        pod = self._objects.get((r.rtype, r.namespace, r.name))
        if pod is None:
            raise ApiError.not_found("pods", r.name or "")
        dry_run = r.query.get("dryRun") == "All"
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            self._charge_disruption_budget(pod, spend=not dry_run)
        if not dry_run:
            self._delete(r.rtype, r.namespace, r.name or "", options=body.get("deleteOptions"))
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _charge_disruption_budget(self, pod: JSON, spend: bool = True) -> None:
        """Refuse the eviction when the pod's PDB allows no disruption, else spend one allowed disruption
        (not for a dry run)."""
        pdb_type = _TYPES["policy", "v1", "poddisruptionbudgets"]
        namespace = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        pdbs = [
            obj
            for (t, ns, _), obj in self._objects.items()
            if t is pdb_type
            and ns == namespace
            and _labels_match((obj.get("spec") or {}).get("selector"), labels)
        ]
        if len(pdbs) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, "
                "which the eviction subresource does not support.",
            )
        if not pdbs:
            return
        pdb = pdbs[0]
        status = pdb.setdefault("status", {})
        if int(status.get("disruptionsAllowed", 0)) <= 0:
            cause = {
                "reason": "DisruptionBudget",
                "message": (
                    f"The disruption budget {pdb['metadata']['name']} needs "
                    f"{status.get('desiredHealthy', 0)} healthy pods and has "
                    f"{status.get('currentHealthy', 0)} currently"
                ),
            }
            raise ApiError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {"causes": [cause]},
            )
        if spend:
            status["disruptionsAllowed"] = int(status["disruptionsAllowed"]) - 1
            self._bump(pdb_type, namespace, "MODIFIED", pdb)

    def review_token(self, body: JSON) -> JSON:
        spec = body.get("spec") or {}
        outcome = self._authenticate(spec.get("token", ""), spec.get("audiences") or [])
        status: JSON
        if isinstance(outcome, str):
            status = {"authenticated": False, "user": {}, "error": outcome}
        else:
            info, audiences = outcome
            user = {"username": info.username, "uid": info.uid, "groups": list(info.groups)}
            if info.extra:
                user["extra"] = info.extra
            status = {"authenticated": True, "user": user, "audiences": audiences}
        return {**body, "metadata": {"creationTimestamp": None}, "status": status}

    def review_access(self, body: JSON) -> JSON:
        spec = body.get("spec") or {}
        attrs = spec.get("resourceAttributes")
        if not attrs:
            allowed = False
        else:
            resource = attrs.get("resource", "")
            if attrs.get("subresource"):
                resource = f"{resource}/{attrs['subresource']}"
            allowed = self.rbac_allows(
                spec.get("user", ""),
                spec.get("groups") or [],
                attrs.get("verb", ""),
                attrs.get("group", ""),
                resource,
                attrs.get("namespace") or None,
                attrs.get("name") or None,
            )
        status: JSON = {"allowed": allowed}
        if allowed:
            status["reason"] = "allowed by RBAC"
        return {**body, "metadata": {"creationTimestamp": None}, "status": status}

    def watch(self, request: Request) -> Iterator[JSON]:
        """WatchEvents for the request, from its resourceVersion, until its timeout or the server stops."""
        r = request
        timeout = float(r.query.get("timeoutSeconds") or 1800)
        deadline = datetime.now(UTC).timestamp() + timeout
        since_text = r.query.get("resourceVersion") or "0"
        with self._cond:
            epoch = self._epoch
            if since_text == "0":
                # "Any" resourceVersion: start with the current state as synthetic ADDED events.
                since = self._rv
                backlog = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in self._matching(r.rtype, r.namespace, r.query)
                ]
            else:
                since = int(since_text)
                backlog = []
                if since < self._compacted_rv:
                    message = f"too old resource version: {since} ({self._compacted_rv})"
                    yield {"type": "ERROR", "object": ApiError(410, "Expired", message).status()}
                    return
        yield from backlog
        while True:
            with self._cond:
                pending = [e for e in self._history if e.resource_version > since]
                timed_out = False
                while not pending and not self._stopping and self._epoch == epoch:
                    remaining = deadline - datetime.now(UTC).timestamp()
                    if remaining <= 0:
                        timed_out = True
                        break
                    self._cond.wait(timeout=min(remaining, 0.5))
                    pending = [e for e in self._history if e.resource_version > since]
                if self._stopping or self._epoch != epoch:
                    return
                current = self._rv
            if timed_out:
                # Go's strconv.ParseBool, as the apiserver reads it (the Python clients send "True").
                if r.query.get("allowWatchBookmarks") in ("1", "t", "T", "true", "True", "TRUE"):
                    # As the watch cache does just before a watch times out: where to resume from.
                    metadata = {"resourceVersion": str(current)}
                    bookmark = {"kind": r.rtype.kind, "apiVersion": r.rtype.api_version, "metadata": metadata}
                    yield {"type": "BOOKMARK", "object": bookmark}
                return
            for event in pending:
                since = event.resource_version
                if (
                    event.rtype is r.rtype
                    and (r.namespace is None or event.namespace == r.namespace)
                    and self._selected(event.obj, r.query)
                ):
                    yield {"type": event.type, "object": copy.deepcopy(event.obj)}

    def parse(self, method: str, raw_path: str, body: Any, content_type: str) -> Request:
        """Map a URL onto a resource type, namespace, name and subresource, as the apiserver routes it."""
        split = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = [p for p in split.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if (
            not rest
            or (group, version, rest[0]) not in _TYPES
            or (group == "resource.k8s.io" and not self.serves_dra)
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rtype = _TYPES[group, version, rest[0]]
        if rtype.namespaced and namespace is None and method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        return Request(method, rtype, namespace, name, subresource, query, body, content_type)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes: with Nagle on, the body waits for the client's delayed
    # ACK of the headers (~40 ms a response on Linux loopback).
    disable_nagle_algorithm = True
    server_state: KubeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on `requests`, not on logs."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        state = self.server_state
        if state._stopping:
            # A stopped server answers nothing, on a kept-alive connection either: as one that went down.
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.partition("?")[0]
        if path in state.delays:
            state.delayed[path] += 1
            time.sleep(state.delays[path])
        if path in state.redirects:
            self.send_response(HTTPStatus.TEMPORARY_REDIRECT)
            self.send_header("Location", state.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        forged = state.raw_answers.get(path)
        if forged is not None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(forged)))
            self.end_headers()
            self.wfile.write(forged)
            return
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            self._reply(400, ApiError(400, "BadRequest", "the request body is not valid JSON").status())
            return
        content_type = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        try:
            user = self._user()
            if self.path.startswith(TOKEN_REVIEW_PATH) and method == "POST":
                self._authorize(user, "create", "authentication.k8s.io", "tokenreviews", None, None)
                state.requests["create", "tokenreviews"] += 1
                self._reply(201, state.review_token(body or {}))
                return
            if (
                self.path.startswith("/apis/authorization.k8s.io/v1/subjectaccessreviews")
                and method == "POST"
            ):
                self._authorize(user, "create", "authorization.k8s.io", "subjectaccessreviews", None, None)
                state.requests["create", "subjectaccessreviews"] += 1
                self._reply(201, state.review_access(body or {}))
                return
            if urlsplit(self.path).path.rstrip("/") == "/apis/policy" and method == "GET":
                # Discovery: every authenticated user may read it (system:discovery).
                self._reply(200, state.policy_group())
                return
            if urlsplit(self.path).path.rstrip("/") == "/apis/resource.k8s.io" and method == "GET":
                group = state.dra_group()
                if group is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                self._reply(200, group)
                return
            request = state.parse(method, self.path, body, content_type)
            resource = request.rtype.plural + (f"/{request.subresource}" if request.subresource else "")
            try:
                self._authorize(
                    user, request.verb, request.rtype.group, resource, request.namespace, request.name
                )
                state.requests[request.verb, resource] += 1
                if request.verb == "watch":
                    state.calls.append(Call("watch", resource, request.namespace, request.name, 200))
                    self._stream(state.watch(request))
                    return
                status, answer = state.handle(request)
            except ApiError as error:
                state.calls.append(Call(request.verb, resource, request.namespace, request.name, error.code))
                raise
            state.calls.append(Call(request.verb, resource, request.namespace, request.name, status))
        except ApiError as error:
            self._reply(error.code, error.status())
            return
        self._reply(status, answer)

    def _user(self) -> TokenInfo:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        outcome = self.server_state._authenticate(token, []) if scheme.lower() == "bearer" else "no token"
        if isinstance(outcome, str):
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return outcome[0]

    def _authorize(
        self, user: TokenInfo, verb: str, group: str, resource: str, namespace: str | None, name: str | None
    ) -> None:
        if self.server_state.rbac_allows(user.username, user.groups, verb, group, resource, namespace, name):
            return
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        base = resource.split("/")[0]
        message = (
            f'{resource.replace("/", " ")} is forbidden: User "{user.username}" cannot {verb} resource '
            f'"{base}" in API group "{group}" {where}'
        )
        raise ApiError(403, "Forbidden", message, {"kind": base})

    def _reply(self, code: int, body: JSON) -> None:
        send_json(self, code, body)

    def _stream(self, events: Iterator[JSON]) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
