"""Database plumbing: the metadata, the engine and the request-scoped session."""
