"""Decisions: what the webhook answers a review (admission, governance, priority, gangs, the sidecar's
injection) from the parsed request and what the watches hold. No I/O of their own: what admission waits on
(a DRA claim or a workload's size not yet seen) the watches fetch."""
