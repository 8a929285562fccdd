"""The one rule of GPU class requests (`class_requests.accept`), tested once: what a Function's load, its
steps and the launcher all refuse, and the lenient reading of a request made earlier. The paths
that apply it are tested for how they wrap it (test_function_load, test_placement)."""

from __future__ import annotations

import pytest

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.class_requests import accept
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.errors import ClassRequestError

from ..conftest import CLASSES

CLASSES_BY_NAME = load_gpu_classes(CLASSES)
QUEUED_L4 = GpuClass.model_validate({**CLASSES_BY_NAME["l4"].model_dump(), "kueue": {"local_queue": "gpu-l4"}})


def names(accepted):
    return [c.name for c in accepted]


def test_a_request_accepts_its_classes_first_choice_first_as_names_or_as_request_text():
    assert names(accept(["h100-80gb", "a100-80gb"], 4, CLASSES_BY_NAME)) == ["h100-80gb", "a100-80gb"]
    assert names(accept("h100-80gb|a100-80gb", 4, CLASSES_BY_NAME)) == ["h100-80gb", "a100-80gb"]
    assert names(accept("l4", 4, CLASSES_BY_NAME)) == ["l4"]  # at the class's maximum
    assert names(accept("l4", None, CLASSES_BY_NAME)) == ["l4"]  # no count: the classes alone


@pytest.mark.parametrize(("request_", "count", "classes", "field", "problem"), [
    ([], 1, CLASSES_BY_NAME, "gpu_class", "no GPU class named"),
    (["l4", "l4"], 1, CLASSES_BY_NAME, "gpu_class", "['l4', 'l4'] names a class twice"),
    ("v100", 1, CLASSES_BY_NAME, "gpu_class",
     "unknown GPU class 'v100'; configured classes: a100-80gb, a100-mig-1g-10gb, default, h100-80gb, l4"),
    ("a100-40gb", 1, CLASSES_BY_NAME, "gpu_class", "unknown GPU class 'a100-40gb' (did you mean 'a100-80gb'?)"),
    ("l4|v100", 1, CLASSES_BY_NAME, "gpu_class", "unknown GPU class 'v100'"),
    ("l4", 5, CLASSES_BY_NAME, "gpu_count", "5 GPUs exceeds class 'l4''s max_gpu_count_per_worker of 4"),
    ("a100-80gb|l4", 5, CLASSES_BY_NAME, "gpu_count", "5 GPUs exceeds class 'l4''s max_gpu_count_per_worker of 4"),
    ("l4", 0, CLASSES_BY_NAME, "gpu_count", "GPU count must be at least 1, got 0"),
    ("l4|a100-mig-1g-10gb", 1, CLASSES_BY_NAME, "gpu_class",
     "classes 'l4' (nvidia.com/gpu) and 'a100-mig-1g-10gb' (nvidia.com/mig-1g.10gb) name different GPU resources"),
    ("a100-80gb|l4", 1, {**CLASSES_BY_NAME, "l4": QUEUED_L4}, "gpu_class",
     "'l4' are in Kueue mode and 'a100-80gb' not"),
])
def test_a_request_the_classes_cannot_serve_is_refused_naming_field_and_problem(request_, count, classes, field,
                                                                                problem):
    with pytest.raises(ClassRequestError) as err:
        accept(request_, count, classes)
    assert err.value.field == field and problem in err.value.problem
    assert str(err.value).startswith(f"field {field!r}: ")


def test_the_lenient_reading_of_an_earlier_request_finds_its_classes_or_none_and_checks_nothing_else():
    assert names(accept("h100-80gb|a100-80gb", None, CLASSES_BY_NAME, lenient=True)) == ["h100-80gb", "a100-80gb"]
    assert accept("l4|v100", None, CLASSES_BY_NAME, lenient=True) == ()  # a class gone since
    assert accept("", None, CLASSES_BY_NAME, lenient=True) == ()  # no request on the object
    # what the strict rule refuses for the request as a whole is not its concern
    assert names(accept("l4|a100-mig-1g-10gb", None, CLASSES_BY_NAME, lenient=True)) == ["l4", "a100-mig-1g-10gb"]
