"""A DRA class's GPU pod claims its devices: the ResourceClaimTemplate decided at launch. Pure.

Every GPU pod of a class with `dra` (and no `extended_resource`) names one claim, `gpu`, made from
a template the launcher creates with the run (`claim_template`) and owns by the run's Job, so it is
deleted with it: `count x count_per_gpu` devices of the class's device class that pass its selectors.
A Function that accepts several DRA classes in order gets one request whose `firstAvailable`
subrequests are those classes in that order (`subrequest_names`): the allocator takes the first it
can satisfy, and the claim's allocation says which (`class_got`).

>>> from gpufn_dagster.classes import GpuClass
>>> h100 = GpuClass(name="h100", gpu_model="H100", gpu_memory="80GiB", max_gpu_count_per_worker=8,
...                 dra={"device_class": "gpu.nvidia.com", "selectors": ['device.attributes["gpu.nvidia.com"].productName == "H100"']})
>>> a100 = h100.model_copy(update={"name": "a100.80gb"})
>>> spec = claim_template_spec((h100, a100), 2)
>>> [(s["name"], s["count"]) for s in spec["devices"]["requests"][0]["firstAvailable"]]
[('h100', 2), ('a100-80gb', 2)]
>>> class_got({"status": {"allocation": {"devices": {"results": [{"request": "gpu/a100-80gb"}]}}}}, (h100, a100)).name
'a100.80gb'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..classes import GpuClass

CLAIM_NAME = "gpu"  # the pod's claim and its one device request
RESOURCE_API = "resource.k8s.io/v1"


def claim_template_name(run_id: str, request: str) -> str:
    """The template of one run's GPU pods of one request (`placement.request_key`): unique per run and request.

    >>> claim_template_name("0f9d1c3e-aaaa-bbbb-cccc-000000000000", "l4 x1")
    'gpufn-0f9d1c3e-aaaa-bbbb-cccc-000000000000-5dd2b6f0'
    """
    return f"gpufn-{run_id}-{hashlib.sha256(request.encode()).hexdigest()[:8]}"


def subrequest_names(accepted: Sequence[GpuClass]) -> list[str]:
    """Each accepted class's subrequest name (a DNS label: the class name with '.' as '-'; its
    place in the order when that is taken or too long)."""
    names: list[str] = []
    for index, gpu_class in enumerate(accepted):
        name = re.sub(r"[^a-z0-9-]", "-", gpu_class.name).strip("-")[:63]
        names.append(name if name and name not in names else f"class-{index}")
    return names


def _device_request(gpu_class: GpuClass, count: int) -> dict[str, Any]:
    assert gpu_class.dra is not None
    return {"deviceClassName": gpu_class.dra.device_class, "allocationMode": "ExactCount",
            "count": count * gpu_class.dra.count_per_gpu,
            **({"selectors": [{"cel": {"expression": e}} for e in gpu_class.dra.selectors]}
               if gpu_class.dra.selectors else {})}


def claim_template_spec(accepted: Sequence[GpuClass], count: int) -> dict[str, Any]:
    """The `spec.spec` (a ResourceClaimSpec) of the template: one request, exactly the first class's
    devices, or `firstAvailable` over the classes in order."""
    if len(accepted) == 1:
        request: dict[str, Any] = {"name": CLAIM_NAME, "exactly": _device_request(accepted[0], count)}
    else:
        request = {"name": CLAIM_NAME, "firstAvailable": [
            {"name": name, **_device_request(c, count)} for name, c in zip(subrequest_names(accepted), accepted)]}
    return {"devices": {"requests": [request]}}


def claim_template(name: str, spec: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceClaimTemplate object the launcher creates (its owner, the run's Job, is added once that exists)."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": dict(labels)}, "spec": {"spec": dict(spec)}}


def owned_by(job: Any) -> dict[str, Any]:
    """A patch making an object owned by `job` (a V1Job or its JSON), deleted with it by the garbage collector."""
    metadata = job["metadata"] if isinstance(job, Mapping) else job.metadata
    name = metadata["name"] if isinstance(metadata, Mapping) else metadata.name
    uid = metadata["uid"] if isinstance(metadata, Mapping) else metadata.uid
    return {"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                              "blockOwnerDeletion": False, "controller": False}]}}


def class_got(claim: Mapping[str, Any] | None, accepted: Sequence[GpuClass]) -> GpuClass | None:
    """The class whose subrequest the allocator satisfied, from an allocated claim (JSON); None before allocation."""
    results = (((((claim or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])
    names = dict(zip(subrequest_names(accepted), accepted))
    for result in results:
        _, _, sub = str(result.get("request", "")).partition("/")
        if sub in names:
            return names[sub]
    return accepted[0] if results and len(accepted) == 1 else None


def allocated_devices(claims: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device allocated to any of `claims` (JSON)."""
    out: set[tuple[str, str, str]] = set()
    for claim in claims:
        for result in ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []):
            out.add((result.get("driver", ""), result.get("pool", ""), result.get("device", "")))
    return out
