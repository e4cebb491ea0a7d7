"""The periodic work (period roll-over, close-out of silent pods, roll-up of old ledger rows, budget-state
sweeps and, with TIMEKEEPER_RECONCILE, the Kubernetes reconcile pass), run by exactly one replica at a
time: the one holding a PostgreSQL advisory lock."""
