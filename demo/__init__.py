"""The local demo (`python -m demo`, `make demo`): the real timekeeper, webhook and sidecars on one machine.

Not a deployable: it starts the three as processes and talks to them over sockets, the way a cluster
would, so it may import their public helpers (webhook.certificates.tls) and the dev tools (rich, jsonpatch).
"""
