"""`python -m webhook.certbootstrap`, the command the manifests, the chart and the compose file run: the
webhook's serving certificate kept in Secrets or a folder (`webhook.certificates.bootstrap`)."""

from __future__ import annotations

import sys

from webhook.certificates.bootstrap import main

if __name__ == "__main__":
    sys.exit(main())
