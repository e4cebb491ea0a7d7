"""`python -m nodeagent`: sample the node and serve its pods' measurements until SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from gpuaccounting.logs import configure_logging
from nodeagent.app import Sampler, make_server
from nodeagent.auth import TokenReviewer
from nodeagent.config import get_settings
from nodeagent.gpus import NodeNvml
from nodeagent.kubelet import PodResourcesClient


def main() -> int:
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    stop = threading.Event()
    nvml = NodeNvml(settings.nvml_library, settings.nvml_reinit_seconds)
    kubelet = PodResourcesClient(settings.podresources_socket, settings.podresources_timeout_seconds)
    sampler = Sampler(settings, nvml, kubelet)
    reviewer = TokenReviewer(
        settings.kubernetes_url,
        settings.kubernetes_token_file,
        settings.kubernetes_ca_file,
        settings.token_cache_seconds,
    )
    server = make_server(settings, sampler, reviewer)

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    # Serve only once the node has been sampled, so no sidecar is told its pod has no GPUs for a tick.
    sampler.sample()
    sampling = threading.Thread(target=sampler.run, args=(stop,), name="nodeagent-sampler", daemon=True)
    sampling.start()
    logging.getLogger("nodeagent").info(
        "nodeagent_started",
        extra={"port": server.server_address[1], "socket": str(settings.podresources_socket)},
    )
    server.serve_forever()
    sampling.join(timeout=5)
    nvml.close()
    kubelet.close()
    logging.getLogger("nodeagent").info("nodeagent_stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
