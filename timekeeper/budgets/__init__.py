"""Budgets per namespace, the cluster-wide default, grants and the per-period running totals."""
