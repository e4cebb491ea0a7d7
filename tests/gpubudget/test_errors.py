"""Refusals and failures say what happened and what to do; exit 1 for what the timekeeper (or the way to
it) refused, 2 for a command line that is wrong before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubudget.commands import main
from tests.gpubudget.conftest import Cli
from tests.support.processes import free_port

pytestmark = pytest.mark.e2e


def test_an_unreachable_timekeeper_says_where_it_looked_and_how_to_reach_it(cli: Cli) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    code, out, err = cli.run("status", url=url)

    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot reach the timekeeper at {url}")
    assert "port-forward" in err and "--url" in err


def test_no_token_says_how_to_give_one(cli: Cli) -> None:
    code, _, err = cli.run("status", token=None)

    assert code == 1
    assert "needs a token and none was given" in err
    assert "--token" in err and "GPU_BUDGET_TOKEN" in err


def test_a_token_not_accepted_says_so(cli: Cli) -> None:
    code, _, err = cli.run("status", "cli-train", token="not-a-token")

    assert code == 1
    assert "did not accept the token (token not accepted)" in err


@pytest.mark.parametrize(
    "command",
    [
        ("set", "cli-train", "--budget", "1"),
        ("grant", "cli-train", "5", "--reason", "x"),
        ("defaults",),
        ("audit",),
        ("reset", "cli-train"),
    ],
)
def test_a_reader_asking_for_admin_work_is_told_which_role_it_needs(
    cli: Cli, command: tuple[str, ...]
) -> None:
    code, _, err = cli.run(*command, token="reader")

    assert code == 1
    assert err.startswith("error: not allowed:")
    assert "gpu-timekeeper-admin" in err
    assert cli.api("/namespaces/cli-train/budget")["budget_gpu_minutes"] == 1000  # nothing changed


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (("grant", "cli-train", "0", "--reason", "x"), "gpu_minutes: Input should be greater than 0"),
        (("status", "Not_A_Namespace"), "refused (422)"),
        (("usage", "cli-train", "--since", "yesterday"), "since:"),
        (("reset", "never-had-one"), "namespace never-had-one has no budget of its own"),
    ],
)
def test_what_the_timekeeper_refuses_is_reported_in_its_words(
    cli: Cli, command: tuple[str, ...], said: str
) -> None:
    code, out, err = cli.run(*command)

    assert (code, out) == (1, "")
    assert said in err


@pytest.mark.parametrize(
    "command",
    [
        ("grant", "cli-train", "-5", "--reason", "x"),
        ("grant", "cli-train", "lots", "--reason", "x"),
        ("grant", "cli-train", "5"),  # a grant needs a reason
        ("set", "cli-train", "--budget", "NaN"),
        ("set", "cli-train", "--period", "yearly"),
        ("usage", "cli-train", "--by", "week"),
        ("status", "-o", "xml"),
        (),
    ],
)
def test_a_wrong_command_line_is_refused_before_anything_is_sent(
    cli: Cli, command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--url", cli.url, "--token", cli.tokens.admin, *command])

    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert cli.api("/namespaces/cli-train/budget")["budget_gpu_minutes"] == 1000


def test_a_bad_url_or_missing_token_file_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    assert cli.run("status", url="timekeeper:8080")[0] == 2
    code, _, err = cli.run("--token-file", str(tmp_path / "absent"), "status", token=None)
    assert code == 2 and "cannot read the token file" in err
