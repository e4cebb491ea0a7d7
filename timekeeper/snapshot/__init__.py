"""The admission snapshot the webhooks cache, and the history of the namespaces' states."""
