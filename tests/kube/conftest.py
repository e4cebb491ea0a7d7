"""Fixtures: a fresh stand-in API server per test, and the timekeeper's KubeClient talking to it as the
timekeeper's own ServiceAccount (so every call also proves the RBAC rules we ship are enough)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT, install_cluster_roles
from timekeeper.kube import KubeClient


@pytest.fixture
def apiserver() -> Iterator[KubeApiServer]:
    server = KubeApiServer().start()
    install_cluster_roles(server)
    yield server
    server.stop()


@pytest.fixture
def kube(apiserver: KubeApiServer) -> Iterator[KubeClient]:
    token = apiserver.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    client = KubeClient(apiserver.client_configuration(token), request_timeout_seconds=5)
    yield client
    client.close()
