"""`gpu-budget` (also `kubectl gpu-budget`): the timekeeper's budgets, usage and forecasts in a terminal.

A client of the v1 API only: it imports no deployable, and reaches the timekeeper directly (a URL and a
token) or through the API server's service proxy with the user's own kubeconfig (docs/cli.md)."""
