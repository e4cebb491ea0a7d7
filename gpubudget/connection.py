"""Where the timekeeper is and which credential to show it: a URL and a token (flags, else environment),
or, without a URL, the API server of the kubeconfig's context, whose service proxy forwards to the
timekeeper's Service, authenticated as the kubeconfig's user. A caller of a fleet's member cluster also
names its cluster (CLUSTER_HEADER), so the hub has that cluster's API server review its token."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuaccounting.names import CLUSTER_HEADER, DNS_LABEL, PROXIED_AUTHORIZATION_HEADER
from gpubudget.errors import CliError

ENV_URL = "GPU_BUDGET_URL"
ENV_TOKEN = "GPU_BUDGET_TOKEN"
ENV_TOKEN_FILE = "GPU_BUDGET_TOKEN_FILE"
ENV_SERVICE = "GPU_BUDGET_SERVICE"
ENV_CA_FILE = "GPU_BUDGET_CA_FILE"
ENV_CLUSTER = "GPU_BUDGET_CLUSTER"
# deployment/: the Service gpu-timekeeper in the namespace gpu-timekeeper, plain HTTP on port 8080.
DEFAULT_SERVICE = "gpu-timekeeper/gpu-timekeeper:8080"
_SERVICE = re.compile(r"^(?:(https?):)?([a-z0-9-]{1,63})/([a-z0-9-]{1,63})(?::([a-z0-9-]{1,63}))?$")


@dataclass(frozen=True)
class Options:
    """What the command line (and the environment behind it) says about the connection."""

    url: str | None = None
    token: str | None = None
    token_file: Path | None = None
    kubeconfig: str | None = None
    context: str | None = None
    service: str | None = None
    ca_file: str | None = None
    cluster: str | None = None


@dataclass(frozen=True)
class Target:
    """An httpx client's settings for one timekeeper; `through_api_server` when answers (and refusals)
    may come from the API server's proxy rather than the timekeeper."""

    base_url: str
    description: str
    headers: dict[str, str] = field(default_factory=dict)
    verify: bool | str = True
    cert: tuple[str, str] | None = None
    through_api_server: bool = False
    has_token: bool = False
    context: str | None = None


def resolve(options: Options) -> Target:
    """Flags first, then GPU_BUDGET_* variables; no URL anywhere means the kubeconfig."""
    token = _token(options)
    cluster = _cluster(options)
    url = options.url or os.environ.get(ENV_URL)
    if url:
        if not url.startswith(("http://", "https://")):
            raise CliError(f"the timekeeper URL must start with http:// or https://, not {url!r}", 2)
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        verify: bool | str = options.ca_file or os.environ.get(ENV_CA_FILE) or True
        target = Target(url.rstrip("/"), url, headers, verify, has_token=token is not None)
    else:
        target = _through_api_server(options, token)
    if cluster is None:
        return target
    return replace(target, headers=target.headers | {CLUSTER_HEADER: cluster})


def _cluster(options: Options) -> str | None:
    """The member cluster the caller's credential is of (--cluster, else GPU_BUDGET_CLUSTER; unset or
    empty: the hub's own cluster). A name that is no DNS label is refused here; one the hub does not
    list, by the hub (a 400 that says so)."""
    cluster = options.cluster or os.environ.get(ENV_CLUSTER) or None
    if cluster is not None and re.fullmatch(DNS_LABEL, cluster) is None:
        raise CliError(f"--cluster must be a member cluster's name (a DNS label), not {cluster!r}", 2)
    return cluster


def _token(options: Options) -> str | None:
    if options.token:
        return options.token
    path = options.token_file or (
        Path(os.environ[ENV_TOKEN_FILE]) if os.environ.get(ENV_TOKEN_FILE) else None
    )
    if path is not None:
        try:
            return path.read_text().strip() or None
        except OSError as error:
            raise CliError(f"cannot read the token file {path}: {error.strerror}", 2) from None
    return os.environ.get(ENV_TOKEN) or None


def parse_service(spec: str) -> tuple[str, str, str, str]:
    """`[SCHEME:]NAMESPACE/NAME[:PORT]` as (scheme, namespace, name, port); http and 8080 unless given."""
    match = _SERVICE.fullmatch(spec)
    if match is None:
        raise CliError(f"--service must look like [https:]NAMESPACE/NAME[:PORT], not {spec!r}", 2)
    scheme, namespace, name, port = match.groups()
    return scheme or "http", namespace, name, port or "8080"


def _through_api_server(options: Options, token: str | None) -> Target:
    """The timekeeper behind the kubeconfig's API server and service proxy. The API server removes
    `Authorization` after authenticating the user, so the user's token (or --token) is repeated for the
    timekeeper in PROXIED_AUTHORIZATION_HEADER."""
    from kubernetes import client, config  # only here: slow to import, and needed only for this path

    scheme, namespace, name, port = parse_service(
        options.service or os.environ.get(ENV_SERVICE) or DEFAULT_SERVICE
    )
    configuration = client.Configuration()
    try:
        config.load_kube_config(
            config_file=options.kubeconfig,
            context=options.context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (config.ConfigException, OSError, ValueError) as error:
        raise CliError(
            f"no timekeeper URL (--url or {ENV_URL}) and no usable kubeconfig: {error}", 2
        ) from None
    headers: dict[str, str] = {}
    user_token = configuration.get_api_key_with_prefix("authorization")
    if user_token:
        headers["Authorization"] = user_token
    timekeeper_token = f"Bearer {token}" if token is not None else user_token
    if timekeeper_token:
        headers[PROXIED_AUTHORIZATION_HEADER] = timekeeper_token
    verify: bool | str = configuration.ssl_ca_cert or True
    if not configuration.verify_ssl:
        verify = False
    cert = (
        (configuration.cert_file, configuration.key_file)
        if configuration.cert_file and configuration.key_file
        else None
    )
    host = configuration.host.rstrip("/")
    base = f"{host}/api/v1/namespaces/{namespace}/services/{scheme}:{name}:{port}/proxy"
    return Target(
        base,
        f"service {namespace}/{name}:{port} through the API server {host}",
        headers,
        verify,
        cert,
        through_api_server=True,
        has_token=bool(timekeeper_token),
        context=options.context,
    )
