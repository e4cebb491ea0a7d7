"""Watches and caches: what admission reads from memory, each kept fresh by one task (the timekeeper's
budget states polled; PriorityClasses, DRA objects and workload pods listed and watched)."""
