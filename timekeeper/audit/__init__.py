"""The audit log of every admin change."""
