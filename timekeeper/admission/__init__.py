"""Namespace states and the admission snapshot webhooks cache."""
