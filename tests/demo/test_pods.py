"""How the demo "runs" an admitted pod: the injected sidecar's own env, resolved as a kubelet would, must
be a configuration the real sidecar accepts, with every path inside the pod's local folder."""

from __future__ import annotations

import copy
from pathlib import Path

from demo.pods import Admitted, PodSpec, sidecar_command
from gpuaccounting import names
from sidecar.config import Config
from sidecar.discovery import read_downward_file
from webhook.decisions.injection import SidecarTemplate
from webhook.settings import WebhookSettings

SPEC = PodSpec("team-a", "trainer", "HAMi", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"})


def admitted(settings: WebhookSettings) -> Admitted:
    """The pod as stored after /mutate: the webhook's own sidecar template, annotations and a uid."""
    pod = copy.deepcopy(SPEC.manifest())
    SidecarTemplate(settings).inject(pod["spec"], "0.5")
    pod["metadata"]["uid"] = "0b4f3c52-0f0e-4a55-9d43-6f8f2f1f5e11"
    pod["metadata"]["labels"] = {"app": "trainer"}
    pod["metadata"]["annotations"] = {names.ANNOTATION_GPU_SHARE: "0.5", "note": 'says "hi"'}
    return Admitted(SPEC, pod)


def test_the_sidecar_env_is_the_injected_one_resolved_into_the_pods_folder(tmp_path: Path) -> None:
    settings = WebhookSettings(timekeeper_url="http://127.0.0.1:9", sidecar_report_interval_seconds=1)
    argv, env = sidecar_command(admitted(settings), tmp_path, "reporter-token", {"PATH": "/bin"})

    assert argv[1:] == ["-m", "sidecar"]
    config = Config.from_env(env)
    assert (config.namespace, config.pod_name, config.pod_uid) == (
        "team-a",
        "trainer",
        "0b4f3c52-0f0e-4a55-9d43-6f8f2f1f5e11",
    )
    assert config.gpu_share == 0.5
    assert config.timekeeper_url == "http://127.0.0.1:9"
    assert config.report_interval_seconds == 1
    assert config.nvml_backend == "fake"
    assert config.token_file == tmp_path / names.SIDECAR_TOKEN_VOLUME / "token"
    assert config.token_file.read_text() == "reporter-token"
    assert config.buffer_dir == tmp_path / names.SIDECAR_BUFFER_VOLUME
    assert config.buffer_dir.is_dir()
    assert env["PATH"] == "/bin"


def test_pod_info_is_written_as_the_downward_api_writes_it(tmp_path: Path) -> None:
    pod = admitted(WebhookSettings())
    _, env = sidecar_command(pod, tmp_path, "token", {})

    podinfo = Path(env["SIDECAR_PODINFO_DIR"])
    assert podinfo == tmp_path / names.SIDECAR_PODINFO_VOLUME
    assert read_downward_file(podinfo / "annotations") == pod.annotations
    assert read_downward_file(podinfo / "labels") == {"app": "trainer"}
