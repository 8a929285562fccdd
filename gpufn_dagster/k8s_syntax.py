"""Kubernetes' own syntax rules for what a GPU class writes into pods: label keys and values,
extended resource names, quantities. Pure; the rules and limits are apimachinery's
(`validation.IsQualifiedName`, `IsValidLabelValue`, `resource.ParseQuantity`) and the API
server's for container resources, so a class that loads is a class Kubernetes accepts.

>>> qualified_name_problem("nvidia.com/gpu.product") is None, qualified_name_problem("NVIDIA A100") is None
(True, False)
>>> quantity_problem("64Gi"), quantity_problem("1e3Gi")
(None, 'not a Kubernetes quantity (digits with an optional suffix such as 500m, 8, 64Gi, 1e3)')
>>> parse_quantity("64Gi"), parse_quantity("500m"), parse_quantity("1e3")
(Decimal('68719476736'), Decimal('0.500'), Decimal('1000'))

Quantities are parsed here rather than with `kubernetes.utils.parse_quantity` so that the embedded
mode (classes loaded, nothing on Kubernetes) never imports the Kubernetes client.
"""

from __future__ import annotations

import re
from decimal import Decimal

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# apimachinery's quantity grammar: a signed decimal number, then one binary-SI, decimal-SI or
# exponent suffix (ASCII digits only; "1e3Gi", "NaN", "1_000" and spaces are not quantities).
_QUANTITY = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?", re.ASCII)
_SUFFIX_FACTOR = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                  "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1, "k": 10**3,
                  "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_MAX_EXPONENT = 18  # past 10**18 a quantity no longer fits the int64 the API server keeps
_NAME_RULE = ("name part must consist of alphanumerics, '-', '_' or '.', start and end with an alphanumeric, "
              "and be at most 63 characters")


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (label key, taint key, affinity key), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return "prefix before '/' must not be empty"
        if "/" in prefix:
            return "at most one '/' is allowed"
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
            return "prefix must be a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)"
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        return _NAME_RULE
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value (empty is valid), or None."""
    if value == "":
        return None
    if len(value) > 63 or not _NAME.fullmatch(value):
        return ("must be empty, or consist of alphanumerics, '-', '_' or '.', start and end with an alphanumeric, "
                "and be at most 63 characters")
    return None


def dns_subdomain_problem(name: str) -> str | None:
    """Why `name` cannot name an object that takes a DNS subdomain (a DeviceClass), or None.

    >>> dns_subdomain_problem("gpu.nvidia.com"), dns_subdomain_problem("GPU")[:26]
    (None, 'must be a DNS subdomain (l')
    """
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return "must be a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253 characters)"
    return None


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be a GPU resource a container asks for (e.g. nvidia.com/gpu), or None."""
    prefix, slash, _ = name.partition("/")
    if not slash:
        return "must be an extended resource name with a domain, such as nvidia.com/gpu or amd.com/gpu"
    if problem := qualified_name_problem(name):
        return problem
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for native resources"
    if prefix.startswith("requests."):
        return "the 'requests.' prefix belongs to quota names, not to container resources"
    return None


def quantity_problem(text: str, *, allow_negative: bool = False) -> str | None:
    """Why `text` is not a Kubernetes quantity a container may request, or None."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return "not a Kubernetes quantity (digits with an optional suffix such as 500m, 8, 64Gi, 1e3)"
    suffix = match.group(2) or ""
    if suffix not in _SUFFIX_FACTOR and abs(int(suffix[1:])) > _MAX_EXPONENT:  # an exponent, e.g. 1e3
        return f"exponent {suffix[1:]} is out of range"
    if text.startswith("-") and not allow_negative:
        return "must not be negative"
    return None


def parse_quantity(text: str | int | float) -> Decimal:
    """The value of a Kubernetes quantity ("64Gi", "500m", "1e3", 8); raises ValueError for anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Decimal(text)
    text = str(text).strip()
    if (problem := quantity_problem(text, allow_negative=True)) is not None:
        raise ValueError(f"{text[:40]!r}: {problem}")
    number, suffix = _QUANTITY.fullmatch(text).group(1, 2)
    sign = -1 if text.startswith("-") else 1
    if (suffix or "") not in _SUFFIX_FACTOR:  # an exponent
        return sign * Decimal(number) * Decimal(10) ** int(suffix[1:])
    return sign * Decimal(number) * _SUFFIX_FACTOR[suffix or ""]
