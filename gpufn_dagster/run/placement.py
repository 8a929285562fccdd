"""Where a GPU pod goes: GPU class x GPU count -> the Kubernetes pod configuration.

Pure functions. The launcher reads the GPU requests of a run's steps (op tags written by
`gpu_function`) and, at launch, decides each GPU pod's placement from the class files as they
are then: one `PodPlacement` for a run worker, or one per (class, GPU count) for the step and
shard pods of a run placed per step. Whoever builds the pod merges that decision over whatever
dagster-k8s assembled from the launcher config, the code location, `dagster-k8s/config` tags and
the executor's step config: `check_no_extra_gpus` refuses GPUs in other containers, and
`enforce_placement` runs last, so no user-supplied layer can move a GPU pod off its pool, add a
node-affinity alternative, pin a node, or change the GPU count or resource.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..class_requests import accept
from ..classes import GpuClass
from ..errors import ClassRequestError, PlacementError
from ..k8s_syntax import parse_quantity
from ..tags import CLASS_LABEL, CLASSES_ANNOTATION, COUNT_LABEL, GPU_CLASS_TAG, GPU_COUNT_TAG, choice_request, class_choice
from .claims import CLAIM_NAME, claim_template_spec
from .kueue import kueue_labels

_GPU_RESOURCE_HINTS = ("gpu", "mig-", "nvidia.com/", "amd.com/", "habana.ai/", "google.com/tpu")


@dataclass(frozen=True)
class Placement:
    """A run worker (or step pod) on `gpu_count` GPUs of `gpu_class`'s node pool -- or, when the
    Function accepts several classes, of any of theirs, preferring them in order (`alternatives`
    follow `gpu_class`); `priority` is the run's `dagster/priority`, which picks its Kueue
    priority class when the class is in Kueue mode."""

    gpu_class: GpuClass
    gpu_count: int
    priority: int = 0
    alternatives: tuple[GpuClass, ...] = ()

    @property
    def accepted(self) -> tuple[GpuClass, ...]:
        """The classes whose pools the pod may land on, first choice first."""
        return (self.gpu_class, *self.alternatives)

    @property
    def request(self) -> str:
        """The request text of the classes (`tags.choice_request`): the run's and pod's GPU class."""
        return choice_request([c.name for c in self.accepted])

    def describe(self) -> str:
        return f"{self.gpu_count} x {self.gpu_class.requested_as} on GPU class {_either(self.request)}"


def _either(request: str) -> str:
    """"'l4'", or "'h100-80gb' or else 'a100-80gb'" for classes accepted in order."""
    return " or else ".join(map(repr, class_choice(request)))


@dataclass(frozen=True)
class PodPlacement:
    """One GPU pod's placement as decided at launch: the class's pod configuration then, with the
    run's priority, in a form that travels (JSON) to the run worker, which builds the step pods.

    Example:
        >>> from gpufn_dagster.classes import GpuClass
        >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
        >>> decided = PodPlacement.decide(Placement(l4, 1))
        >>> PodPlacement.from_json(decided.to_json()) == decided, decided.describe()
        (True, "1 x nvidia.com/gpu on GPU class 'l4'")
    """

    gpu_class: str
    gpu_count: int
    resource_name: str
    config: Mapping[str, Any]  # `placement_k8s_config` of the class as it was at launch
    priority_class: str | None = None  # the Kueue priority class the run's priority picked, if any
    # A DRA class's pods: the ResourceClaimTemplate they name, {"name", "spec"} (`claims.claim_template_spec`).
    claim: Mapping[str, Any] | None = None

    @classmethod
    def decide(cls, placement: Placement, claim_template: str | None = None) -> PodPlacement:
        """The pod's placement; a DRA class's pods name `claim_template` (the launcher creates it
        with the run: `claims.claim_template_name`), which a DRA class needs."""
        kueue = placement.gpu_class.kueue
        claim = None
        if placement.gpu_class.claims_devices:
            if claim_template is None:
                raise PlacementError(f"GPU class {placement.gpu_class.name!r} claims DRA devices: its pods need a "
                                     "claim template named at launch")
            claim = {"name": claim_template, "spec": claim_template_spec(placement.accepted, placement.gpu_count)}
        return cls(placement.request, placement.gpu_count, placement.gpu_class.requested_as,
                   placement_k8s_config(placement, claim_template if claim else None),
                   kueue.priority_class_for(placement.priority) if kueue else None, claim)

    def describe(self) -> str:
        if self.claim is not None:
            return (f"{self.gpu_count} x {self.resource_name} through a DRA claim (template {self.claim['name']}) "
                    f"on GPU class {_either(self.gpu_class)}")
        return f"{self.gpu_count} x {self.resource_name} on GPU class {_either(self.gpu_class)}"

    def to_json(self) -> dict[str, Any]:
        return {"gpu_class": self.gpu_class, "gpu_count": self.gpu_count, "resource_name": self.resource_name,
                "config": self.config, "priority_class": self.priority_class, "claim": self.claim}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PodPlacement:
        return cls(value["gpu_class"], int(value["gpu_count"]), value["resource_name"], value["config"],
                   value.get("priority_class"), value.get("claim"))


def request_key(gpu_class: str, gpu_count: int) -> str:
    """How a step's GPU request names its decided placement (`StepPlacements`' keys).

    >>> request_key("l4", 2)
    'l4 x2'
    """
    return f"{gpu_class} x{gpu_count}"


def encode_step_placements(placements: Mapping[str, PodPlacement]) -> str:
    """The decided placements of a run's GPU step pods (by `request_key`), as the run worker reads them."""
    return json.dumps({key: placement.to_json() for key, placement in sorted(placements.items())}, sort_keys=True)


def decode_step_placements(text: str) -> dict[str, PodPlacement]:
    """`encode_step_placements` read back.

    >>> decode_step_placements(encode_step_placements({}))
    {}
    """
    return {key: PodPlacement.from_json(value) for key, value in json.loads(text).items()}


def step_request(step_tags: Mapping[str, str] | None) -> tuple[str, int] | None:
    """One step's GPU request (class, GPU count) from its op tags, or None for a CPU step.

    >>> step_request({"gpufn/gpu-class": "l4", "gpufn/gpu-count": "2"}), step_request({"gpufn/gpu-count": "0"})
    (('l4', 2), None)
    """
    if not step_tags or GPU_CLASS_TAG not in step_tags:
        return None
    return step_tags[GPU_CLASS_TAG], int(step_tags.get(GPU_COUNT_TAG, "1"))


def step_gpu_request(step_tags: Mapping[str, str] | None) -> str | None:
    """The `request_key` of one step's GPU request, or None for a CPU step.

    >>> step_gpu_request({"gpufn/gpu-class": "l4", "gpufn/gpu-count": "2"}), step_gpu_request({"gpufn/gpu-count": "0"})
    ('l4 x2', None)
    """
    request = step_request(step_tags)
    return None if request is None else request_key(*request)


def gpu_requests(step_tags: Iterable[Mapping[str, str] | None]) -> dict[str, int]:
    """GPU class -> the most GPUs any one step of the run asks of it.

    >>> gpu_requests([{"gpufn/gpu-class": "l4", "gpufn/gpu-count": "1"}, {"gpufn/gpu-class": "l4",
    ...               "gpufn/gpu-count": "2"}, {"gpufn/gpu-count": "0"}, None])
    {'l4': 2}
    """
    requests: dict[str, int] = {}
    for request in filter(None, map(step_request, step_tags)):
        name, count = request
        requests[name] = max(count, requests.get(name, 0))
    return requests


def resolve_placement(requests: Mapping[str, int], classes: Mapping[str, GpuClass]) -> Placement | None:
    """One class (or ordered choice of classes) for the run worker, or None for a CPU run.

    A run that selects Functions of two classes is rejected: one pod cannot sit on two node
    pools, and putting it on either would be silently wrong for the other's Functions. (A
    Function that accepts several classes is one request: its pod may land on any of them.)
    """
    if not requests:
        return None
    if len(requests) > 1:
        listed = ", ".join(f"{name} ({count} GPU)" for name, count in sorted(requests.items()))
        raise PlacementError(
            f"this run selects GPU Functions of {len(requests)} GPU classes: {listed}. One run worker cannot run "
            "on two node pools, and this job's executor runs every step in the run worker. Run each GPU step in "
            "its own pod on its own class: use gpufn's executor, gpu_classes_executor "
            "(build_definitions' default, or define_asset_job(..., executor_def=gpu_classes_executor)); or "
            "materialize each class's Functions in its own run")
    (request, count), = requests.items()
    try:
        accepted = accept(request, count, classes)
    except ClassRequestError as err:
        raise PlacementError(f"GPU request {request!r} of {count} GPU: {err.problem}") from err
    return Placement(accepted[0], count, alternatives=tuple(accepted[1:]))


def _affinity_terms(gpu_class: GpuClass, pinned: bool) -> list[dict[str, Any]]:
    """The class's node affinity terms (ORed); `pinned` adds its node selector to each as `In`
    expressions, so the class can be one alternative among the ORed terms of several classes."""
    selector = [{"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(gpu_class.node_selector.items())] if pinned else []
    terms = [[{"key": r.key, "operator": r.operator, **({"values": r.values} if r.values else {})}
              for r in term.match_expressions] for term in gpu_class.node_affinity] or [[]]
    return [{"match_expressions": selector + term} for term in terms if selector + term]


# How much the scheduler prefers a node of the first accepted class over one of the next (and so on).
_PREFERENCE_WEIGHTS = (100, 50, 25, 12, 6, 3, 1)


# dagster-k8s's user-defined config sections (`dagster-k8s/config`, `run_k8s_config`), as its
# UserDefinedDagsterK8sConfig names them (a test holds them equal): the four gpufn writes, and all.
CONTAINER_CONFIG = "container_config"
POD_SPEC_CONFIG = "pod_spec_config"
POD_METADATA = "pod_template_spec_metadata"
JOB_METADATA = "job_metadata"
K8S_CONFIG_SECTIONS = (CONTAINER_CONFIG, POD_METADATA, POD_SPEC_CONFIG, "job_config", JOB_METADATA, "job_spec_config",
                       "deployment_metadata", "service_metadata", "service_spec_config")


def placement_k8s_config(placement: Placement, claim_template: str | None = None) -> dict[str, Any]:
    """The class's placement as a dagster-k8s user-defined config (snake_case, merged last).

    A DRA class's pod asks for no GPU resource: its container names the claim `gpu`, which the pod
    makes from `claim_template`.

    A placement that accepts several classes may land on any of their pools: its required node
    affinity ORs one term per class (the class's selector and affinity), its tolerations are all
    theirs, and a preferred node affinity weighs the classes in order, so the scheduler picks
    the first class with room. Its CPU and memory are the first class's; its label names the first
    class and an annotation all of them (`CLASSES_ANNOTATION`).
    """
    gpu_class, count = placement.gpu_class, placement.gpu_count
    gpus = {} if claim_template else {gpu_class.resource_name: str(count)}
    limits: dict[str, str] = dict(gpus)
    requests: dict[str, str] = dict(gpus)
    if gpu_class.cpu:
        requests["cpu"] = gpu_class.cpu
    if gpu_class.memory:
        requests["memory"] = limits["memory"] = gpu_class.memory
    labels = {CLASS_LABEL: gpu_class.name, COUNT_LABEL: str(count)}
    job_labels = {**labels, **kueue_labels(gpu_class, placement.priority, placement.alternatives)}  # Kueue reads them
    choice = len(placement.accepted) > 1
    tolerations: list[dict[str, Any]] = []
    for toleration in (t.to_k8s() for c in placement.accepted for t in c.tolerations):
        if toleration not in tolerations:
            tolerations.append(toleration)
    pod_spec: dict[str, Any] = {"node_selector": {} if choice else dict(gpu_class.node_selector),
                                "tolerations": tolerations}
    required = [term for c in placement.accepted for term in _affinity_terms(c, pinned=choice)]
    node_affinity: dict[str, Any] = {}
    if required:
        node_affinity["required_during_scheduling_ignored_during_execution"] = {"node_selector_terms": required}
    if choice:
        node_affinity["preferred_during_scheduling_ignored_during_execution"] = [
            {"weight": weight, "preference": term}
            for c, weight in zip(placement.accepted, _PREFERENCE_WEIGHTS) for term in _affinity_terms(c, pinned=True)]
    if node_affinity:
        pod_spec["affinity"] = {"node_affinity": node_affinity}
    annotations = {CLASSES_ANNOTATION: placement.request} if choice else {}
    resources: dict[str, Any] = {"limits": limits, "requests": requests}
    if claim_template:
        resources["claims"] = [{"name": CLAIM_NAME}]
        pod_spec["resource_claims"] = [{"name": CLAIM_NAME, "resource_claim_template_name": claim_template}]
    return {
        CONTAINER_CONFIG: {"resources": resources},
        POD_SPEC_CONFIG: pod_spec,
        POD_METADATA: {"labels": labels, **({"annotations": annotations} if annotations else {})},
        JOB_METADATA: {"labels": job_labels, **({"annotations": annotations} if annotations else {})},
    }


def _is_gpu_resource(name: str) -> bool:
    return any(hint in name for hint in _GPU_RESOURCE_HINTS)


def _container_gpus(container: Mapping[str, Any], gpu_resource: str | None) -> dict[str, str]:
    resources = container.get("resources") or {}
    asked: dict[str, str] = {}
    for kind in ("limits", "requests"):
        for name, value in (resources.get(kind) or {}).items():
            if name == gpu_resource or _is_gpu_resource(name):
                asked[name] = str(value)
    return asked


def check_no_extra_gpus(pod_spec_config: Mapping[str, Any], placement: PodPlacement | None) -> None:
    """Refuse sidecars and init containers that ask for a GPU resource.

    The class bounds the GPUs of the whole pod; only the pod's own (Dagster) container gets them,
    from the placement. Without this, a `dagster-k8s/config` tag or a step pod config could add
    containers that each ask for GPUs and so multiply the pod's request past the class's limit.
    Run pods and step pods are checked alike, with the same message.

    >>> check_no_extra_gpus({"containers": [{"name": "log", "resources": {"limits": {"cpu": "1"}}}]}, None)
    >>> check_no_extra_gpus({"init_containers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": 8}}}]},
    ...                     None)
    Traceback (most recent call last):
    ...
    gpufn_dagster.errors.PlacementError: init container 'warm' asks for nvidia.com/gpu=8; ...
    """
    gpu_resource = placement.resource_name if placement else None
    claims = pod_spec_config.get("resource_claims") or pod_spec_config.get("resourceClaims")
    if claims:
        raise PlacementError(
            f"the pod config names resource claims {[c.get('name', '?') for c in claims]}; a GPU pod gets its devices "
            f"from its class alone ({placement.describe() if placement else 'its class'}), so no layer may add a "
            "claim (remove resource_claims from the dagster-k8s/config tag or step pod config)")
    for key, kind in (("containers", "container"), ("init_containers", "init container"),
                      ("initContainers", "init container")):
        for container in pod_spec_config.get(key) or []:
            asked = _container_gpus(container, gpu_resource)
            if (container.get("resources") or {}).get("claims"):
                asked["claims"] = ",".join(c.get("name", "?") for c in container["resources"]["claims"])
            if asked:
                bound = (f"class {placement.gpu_class!r} gives the pod's Dagster container {placement.gpu_count} x "
                         f"{gpu_resource} and no other container of the pod may ask for GPUs" if placement else
                         "each GPU step's pod gets its GPUs from its class; no other container may ask for GPUs")
                raise PlacementError(
                    f"{kind} {container.get('name', '?')!r} asks for "
                    f"{', '.join(f'{k}={v}' for k, v in sorted(asked.items()))}; {bound} (remove the GPU resources "
                    "from that container in the dagster-k8s/config tag or step pod config)")


def enforce_placement(config: Mapping[str, Any], placement: PodPlacement) -> dict[str, Any]:
    """Make a merged dagster-k8s config obey the placement decided at launch, whatever the layers
    below it said."""
    out = copy.deepcopy(dict(config))
    wanted = placement.config
    container = out.setdefault(CONTAINER_CONFIG, {})
    resources = container.setdefault("resources", {})
    for kind in ("limits", "requests"):
        section = {k: v for k, v in (resources.get(kind) or {}).items() if not _is_gpu_resource(k)}
        section.update({k: v for k, v in wanted[CONTAINER_CONFIG]["resources"][kind].items()})
        resources[kind] = section
    resources.pop("claims", None)  # the container's claims are the class's, or none
    if "claims" in wanted[CONTAINER_CONFIG]["resources"]:
        resources["claims"] = list(wanted[CONTAINER_CONFIG]["resources"]["claims"])
    for name, request in resources["requests"].items():  # a limit below the class's request is invalid
        limit = resources["limits"].get(name)
        if limit is not None and parse_quantity(limit) < parse_quantity(request):
            resources["limits"][name] = request
    pod_spec = out.setdefault(POD_SPEC_CONFIG, {})
    pod_spec.pop("node_name", None)
    pod_spec["node_selector"] = {**(pod_spec.get("node_selector") or {}), **wanted[POD_SPEC_CONFIG]["node_selector"]}
    tolerations = list(pod_spec.get("tolerations") or [])
    for toleration in wanted[POD_SPEC_CONFIG]["tolerations"]:
        if toleration not in tolerations:
            tolerations.append(toleration)
    pod_spec["tolerations"] = tolerations
    pod_spec.pop("resource_claims", None)  # refused above any layer (check_no_extra_gpus); the class's alone
    if "resource_claims" in wanted[POD_SPEC_CONFIG]:
        pod_spec["resource_claims"] = list(wanted[POD_SPEC_CONFIG]["resource_claims"])
    affinity = pod_spec.get("affinity") or {}
    node_affinity = affinity.get("node_affinity") or {}
    if "affinity" in wanted[POD_SPEC_CONFIG]:
        # Node selector terms are ORed: only the class's own may stand, or a user term could widen the
        # pool; and the order of the classes accepted is the placement's, not a layer's below it.
        node_affinity.update(wanted[POD_SPEC_CONFIG]["affinity"]["node_affinity"])
        affinity["node_affinity"] = node_affinity
        pod_spec["affinity"] = affinity
    for section in (POD_METADATA, JOB_METADATA):
        metadata = out.setdefault(section, {})
        for key in ("labels", "annotations"):
            if key in wanted[section]:
                metadata[key] = {**(metadata.get(key) or {}), **wanted[section][key]}
    return out
