"""Who may call the API. One small interface; static tokens and Kubernetes reviews plug into it."""

from timekeeper.auth.base import AccessControl, Action, PodIdentity, Principal

__all__ = ["AccessControl", "Action", "PodIdentity", "Principal"]
