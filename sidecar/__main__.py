"""`python -m sidecar`: run until SIGTERM. Always exits 0, so the sidecar can never fail its pod's Job."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from types import FrameType

from sidecar.config import Config, ConfigError
from sidecar.logs import configure


def main() -> int:
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        config = Config.from_env()
    except ConfigError as error:
        configure("auto", False).error("config_invalid", detail=str(error))
        return 0
    log = configure(config.log_format, config.log_debug, namespace=config.namespace, pod=config.pod_name)
    try:
        from sidecar.app import Sidecar

        Sidecar(config, log, stop).run()
    except Exception as error:
        log.error("sidecar_crashed", error=repr(error), traceback=traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
