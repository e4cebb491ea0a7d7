"""The Kubernetes boundary's reviews: TokenReview (who a bearer token stands for) and SubjectAccessReview
(whether RBAC lets them), for the API's Kubernetes auth mode."""

from __future__ import annotations

from kubernetes_asyncio import client

from timekeeper.kube.core import KubeCore
from timekeeper.kube.types import TokenReviewResult


class KubeReviews(KubeCore):
    """Authentication and authorisation reviews."""

    async def token_review(self, token: str, audiences: tuple[str, ...]) -> TokenReviewResult:
        """Ask the API server who a bearer token stands for (and whether it is meant for `audiences`)."""
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences)))
        review = await self._typed(
            self._authn.create_token_review(body, _preload_content=False, _request_timeout=self._timeout),
            "V1TokenReview",
        )
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return TokenReviewResult(authenticated=False, error=(status.error or "") if status else "")
        user = status.user
        return TokenReviewResult(
            authenticated=True,
            username=user.username or "",
            uid=user.uid or "",
            groups=tuple(user.groups or ()),
            extra={k: tuple(v or ()) for k, v in (user.extra or {}).items()},
            audiences=tuple(status.audiences or ()),
        )

    async def subject_access_review(
        self,
        user: str,
        groups: tuple[str, ...],
        verb: str,
        resource: str,
        group: str,
        namespace: str | None,
    ) -> bool:
        """Whether RBAC (or any authorizer) lets the user perform the verb on the resource."""
        attributes = client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=namespace or ""
        )
        body = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user, groups=list(groups), resource_attributes=attributes
            )
        )
        review = await self._typed(
            self._authz.create_subject_access_review(
                body, _preload_content=False, _request_timeout=self._timeout
            ),
            "V1SubjectAccessReview",
        )
        return bool(review.status and review.status.allowed and not review.status.denied)
