"""`gpu-budget` (also `kubectl gpu-budget`): the timekeeper's budgets, usage and forecasts in a terminal; a
client of the v1 API only, direct or through the API server's service proxy (docs/cli.md)."""
