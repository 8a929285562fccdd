"""The one boundary every Kubernetes call of this project goes through.

Calls are bounded in time (`REQUEST_TIMEOUT`) and retried on transient errors by dagster-k8s's own
`k8s_api_retry` (it retries only its whitelist of transient status codes); what still fails is
turned into one of two typed errors that say what it means for the person whose run it is:
`KubernetesUnavailable` (the API did not answer: retrying later may help) or `KubernetesRejected`
(it answered 4xx: retrying will not help until the cause is fixed).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import urllib3
from dagster_k8s.client import (DagsterK8sAPIRetryLimitExceeded, DagsterK8sError, DagsterK8sUnrecoverableAPIError,
                                k8s_api_retry)

from ...errors import KubernetesRejected, KubernetesUnavailable

# (connect, read) seconds for each call; a frozen API server then ends a watcher tick instead of hanging it.
REQUEST_TIMEOUT = (5.0, 20.0)
# The most seconds one watcher tick spends on the API, all its calls together: each call gets what is
# left, so a tick against a frozen API server returns within this, having touched no run.
TICK_DEADLINE = 10.0
# What a failed call can raise, from dagster-k8s's retry, the client, or the connection below it.
API_ERRORS = (DagsterK8sError, DagsterK8sAPIRetryLimitExceeded, DagsterK8sUnrecoverableAPIError,
              urllib3.exceptions.HTTPError, kubernetes.client.ApiException)
# What a status code from the API server means for the person whose run failed.
_STATUS_MEANING = {
    400: "the API server refused it as malformed",
    401: "the launcher's credentials were not accepted",
    403: "the launcher's service account may not create Jobs in this namespace",
    404: "what it names does not exist",  # `_missing` says what, from the API's answer
    409: "a Job with this run's name already exists (this run was launched before)",
    422: "the API server refused a field of it",
}
T = TypeVar("T")


def within(request_timeout: tuple[float, float], deadline: float | None, doing: str = "call") -> tuple[float, float]:
    """`request_timeout` cut to what is left before `deadline` (a `time.monotonic()` moment, None: none);
    raises a read timeout once it has passed, as a frozen server's call would.

    >>> within((5.0, 20.0), None)
    (5.0, 20.0)
    >>> [round(t) for t in within((5.0, 20.0), time.monotonic() + 3)]
    [3, 3]
    """
    if deadline is None:
        return request_timeout
    left = deadline - time.monotonic()
    if left <= 0.05:
        raise urllib3.exceptions.ReadTimeoutError(None, doing, "the tick's deadline passed before this call")
    return min(request_timeout[0], left), min(request_timeout[1], left)


def call(fn: Callable[..., T], *args: Any, request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
         deadline: float | None = None, **kwargs: Any) -> T:
    """One Kubernetes client call, bounded in time (and by `deadline`, retries included), transient
    errors retried (twice, 1 s apart, while the deadline allows)."""
    def attempt() -> T:
        return fn(*args, **kwargs, _request_timeout=within(request_timeout, deadline, getattr(fn, "__name__", "call")))
    return k8s_api_retry(attempt, max_retries=2, timeout=1.0)


def client_without_retries() -> kubernetes.client.ApiClient:
    """An API client on the default configuration whose connection pool does not retry on its own:
    urllib3 retries a timed-out GET three times, which would multiply every deadline by four."""
    configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


@functools.cache
def _camel(name: str) -> str:
    """The JSON key of a client attribute name: `deletion_timestamp` -> `deletionTimestamp`."""
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


class View(dict):
    """A Kubernetes object as the API sent it (JSON), read with the client's attribute names
    (`job.status.active`, `job.metadata.deletion_timestamp`; None when absent). Listing a
    thousand Jobs through the client's models spends most of a tick parsing timestamps the
    watcher never reads; a View parses nothing it is not asked for. Labels and annotations stay
    plain dicts, as in the client's models. A field read once is kept on the View (a watch's kept
    objects are read again every tick, and an object that changes arrives as a new one).

    >>> job = View({"metadata": {"name": "j", "labels": {"a": "b"}}, "status": {"conditions": [{"type": "Failed"}]}})
    >>> job.metadata.name, job.metadata.labels, job.status.active, job.status.conditions[0].type, job.spec
    ('j', {'a': 'b'}, None, 'Failed', None)
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy and pickle look for their hooks: a View has none of its own
            raise AttributeError(name)
        value = self.get(_camel(name))
        if isinstance(value, dict) and name not in ("labels", "annotations"):
            value = View(value)
        elif isinstance(value, list):
            value = [View(item) if isinstance(item, dict) else item for item in value]
        self.__dict__[name] = value
        return value


def list_items(fn: Callable[..., Any], *args: Any, request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
               deadline: float | None = None, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
    """A list call's items as the API sent them (JSON, nothing deserialized) and the list's
    resourceVersion, from which a watch goes on (one call, bounded and retried like `call`)."""
    answer = call(fn, *args, request_timeout=request_timeout, deadline=deadline, _preload_content=False, **kwargs)
    body = json.loads(answer.data)
    return body["items"], (body.get("metadata") or {}).get("resourceVersion") or ""


def list_views(fn: Callable[..., Any], *args: Any, request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
               deadline: float | None = None, **kwargs: Any) -> list[View]:
    """A list call's items as `View`s (one call, bounded and retried like `call`; nothing deserialized)."""
    return [View(item) for item in list_items(fn, *args, request_timeout=request_timeout, deadline=deadline,
                                              **kwargs)[0]]


def api_host() -> str:
    """The API server the client's default configuration talks to (for messages)."""
    return kubernetes.client.Configuration.get_default_copy().host


def _answer(err: BaseException) -> kubernetes.client.ApiException | None:
    """The API server's answer behind dagster-k8s's wrapped errors, None when no answer came."""
    for candidate in (err, getattr(err, "k8s_api_exception", None), err.__cause__, err.__context__):
        if isinstance(candidate, kubernetes.client.ApiException) and candidate.status:
            return candidate
    return None


def answered_status(err: BaseException) -> int | None:
    """The HTTP status the API server answered a failed call with (None: it did not answer)."""
    answer = _answer(err)
    return answer.status if answer is not None else None


def _missing(answer: kubernetes.client.ApiException) -> str | None:
    """What a 404 says is missing, from the API's own details: "the namespace 'x' does not exist".

    >>> e = kubernetes.client.ApiException(status=404)
    >>> e.body = '{"details": {"name": "dagster-run-1", "kind": "jobs"}, "code": 404}'
    >>> _missing(e)
    "the Job 'dagster-run-1' does not exist"
    """
    try:
        details = json.loads(answer.body)["details"]
        kind = {"jobs": "Job", "namespaces": "namespace", "pods": "pod"}.get(details["kind"], details["kind"])
        return f"the {kind} {details['name']!r} does not exist"
    except (TypeError, ValueError, KeyError):
        return None


def _message(answer: kubernetes.client.ApiException) -> str:
    """The API server's own message (it names the refused field: `spec.containers[0]...: Invalid value`)."""
    try:
        return str(json.loads(answer.body)["message"])[:500]
    except (TypeError, ValueError, KeyError):
        return f"{answer.status} {answer.reason}"


def api_error(err: BaseException, doing: str, where: str, *,
              when_unavailable: str = "Retry once the API answers.",
              when_rejected: str = "Retrying will not help until that is fixed.",
              ) -> KubernetesUnavailable | KubernetesRejected:
    """What a failed call means: `doing` (e.g. "create the GPU run worker Job") failed at `where`
    (the API host), followed by what the person should do in either case."""
    answer = _answer(err)
    if answer is not None and 400 <= answer.status < 500:
        meaning = (answer.status == 404 and _missing(answer)) or _STATUS_MEANING.get(
            answer.status, "the API server refused the request")
        return KubernetesRejected(f"could not {doing}: {where} answered {answer.status}: {meaning}: "
                                  f"{_message(answer)}. {when_rejected}")
    detail = _message(answer) if answer is not None else (
        f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
    answered = f"answered {answer.status}" if answer is not None else "did not answer"
    return KubernetesUnavailable(f"could not {doing}: {where} {answered} ({detail}). {when_unavailable}")
