"""`python -m gpubudget`, the `gpu-budget` and `kubectl-gpu_budget` console scripts."""

from __future__ import annotations

import sys

from gpubudget.commands import main

if __name__ == "__main__":
    sys.exit(main())
