"""Reconciliation from the Kubernetes pod watch: silent pods charged, ended pods closed out, exhausted
namespaces downgraded, concurrent limits applied as ResourceQuotas (docs/kubernetes.md)."""
