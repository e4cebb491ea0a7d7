"""What the two HTTP servers (timekeeper, webhook) share about serving: bounds on each client connection
(`connections`) and on each request body (`bodies`).

Kept apart from gpuaccounting, which stays pure for the sidecar; this package may use uvicorn's parser."""
