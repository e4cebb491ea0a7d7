"""Pure domain logic shared by the timekeeper, the webhook and the sidecar.

Nothing here imports anything beyond the standard library: the sidecar image carries it too.
"""
