"""The run and asset tags this plugin reads and writes (values obey Dagster's tag rules)."""

from __future__ import annotations

import re

GPU_CLASS_TAG = "gpufn/gpu-class"
GPU_COUNT_TAG = "gpufn/gpu-count"
CAPACITY_TAG = "gpufn/capacity"
# dagster-k8s reads pod configuration for step pods (k8s_job_executor) from this op tag.
K8S_CONFIG_TAG = "dagster-k8s/config"


CAPACITY_REASON_TAG = "gpufn/capacity-reason"


def tag_value(text: str) -> str:
    """Text squeezed into a Dagster tag value ([A-Za-z0-9_.-], at most 63 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:63]


def gpu_tags(gpu_class: str, gpu_count: int) -> dict[str, str]:
    return {GPU_CLASS_TAG: gpu_class, GPU_COUNT_TAG: str(gpu_count)}
