"""The namespaces' budget states as stored, their history, and the snapshot version."""
