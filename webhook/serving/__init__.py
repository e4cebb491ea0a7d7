"""Serving: the ASGI app (`/mutate`, `/validate`, `/healthz`, `/metrics`) that starts the watches in its
lifespan, and the HTTPS server `python -m webhook` runs it in. The one room that wires the others."""
