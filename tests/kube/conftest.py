"""Fixtures: a fresh stand-in API server per test, and the timekeeper's KubeClient talking to it as the
timekeeper's own ServiceAccount (so every call also proves the RBAC rules we ship are enough)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT, install_cluster_roles
from tests.support.postgres import url_string
from timekeeper.kube import KubeClient
from timekeeper.settings import Settings


@pytest.fixture
def apiserver() -> Iterator[KubeApiServer]:
    server = KubeApiServer().start()
    install_cluster_roles(server)
    yield server
    server.stop()


@pytest.fixture
async def kube(apiserver: KubeApiServer) -> AsyncIterator[KubeClient]:
    token = apiserver.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    kube_client = KubeClient(apiserver.asyncio_configuration(token), request_timeout_seconds=5)
    yield kube_client
    await kube_client.close()


# The app in Kubernetes auth mode: the timekeeper suite's database and app fixtures, with these settings.
from tests.timekeeper.conftest import (  # noqa: E402, F401
    app,
    built_apps,
    client,
    clock,
    connection,
    database_url,
)


@pytest.fixture
def kubeconfig(apiserver: KubeApiServer, tmp_path: Path) -> Path:
    """A kubeconfig for the stand-in, with the timekeeper's ServiceAccount token, as `kubectl` writes them."""
    token = apiserver.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig", token)


@pytest.fixture
def settings(database_url: URL, kubeconfig: Path) -> Settings:  # noqa: F811 (the imported fixture)
    return Settings(
        database_url=url_string(database_url),
        auth_mode="kubernetes",
        kube_in_cluster=False,
        kubeconfig=kubeconfig,
        # Raw ledger rows kept a week (the default is an hour): the tests that add up charges read them.
        ledger_retention=timedelta(days=7),
    )
