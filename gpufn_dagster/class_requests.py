"""What a Function's GPU request accepts: the one rule of class requests, which a Function's load,
its steps and the launcher all apply (`accept`), and a choice of classes seen as one line (`choice_view`).
Pure: it reads the classes it is given, never their files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .classes import GpuClass, suggestion
from .errors import ClassRequestError
from .tags import choice_request, class_choice

# A Function's GPU classes, first choice first, as the class files are when it is called (empty: a
# CPU Function). Steps read them when they run, so a class file edited after the code loaded
# governs the next run.
ClassNow = Callable[[], "tuple[GpuClass, ...]"]


def accept(request: str | Sequence[str], count: int | None, classes: Mapping[str, GpuClass], *,
           lenient: bool = False) -> tuple[GpuClass, ...]:
    """The classes a GPU request accepts, first choice first: the one rule of what a Function may ask
    for, which its load, its steps and the launcher all apply.

    `request` is class names in order of preference, or their request text (`tags.choice_request`: a
    tag, a pool, an annotation). Refused with a `ClassRequestError` naming the field: no class, a
    class named twice, an unknown class, a `count` below 1 or above a class's
    `max_gpu_count_per_worker`, classes naming different GPU resources (one pod asks for one
    resource whichever pool it lands on), DRA classes mixed with extended-resource classes (one pod
    gets its GPUs through a claim or through a resource limit), and classes in Kueue mode mixed with classes not (Kueue
    admits a Job on one ClusterQueue's flavors, or the scheduler places it, never both).

    `lenient` reads back a request made earlier (a run's tag, a pod's annotation), when the classes
    may have changed since: () when one of its classes is not a class now, and no other check.

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
    >>> [c.name for c in accept("l4", 1, {"l4": l4})], accept("l4|t4", None, {"l4": l4}, lenient=True)
    (['l4'], ())
    >>> accept(["l4"], 2, {"l4": l4})
    Traceback (most recent call last):
    ...
    gpufn_dagster.errors.ClassRequestError: field 'gpu_count': 2 GPUs exceeds class 'l4''s max_gpu_count_per_worker of 1
    """
    names = class_choice(request) if isinstance(request, str) else tuple(request)
    if lenient:
        found = tuple(classes.get(name) for name in names)
        return found if names and all(found) else ()
    if not names:
        raise ClassRequestError("gpu_class", "no GPU class named")
    if len(set(names)) < len(names):
        raise ClassRequestError("gpu_class", f"{list(names)} names a class twice")
    accepted: list[GpuClass] = []
    for name in names:
        if name not in classes:
            raise ClassRequestError("gpu_class", f"unknown GPU class {name!r}{suggestion(name, sorted(classes))}; "
                                                 f"configured classes: {', '.join(sorted(classes))}")
        gpu_class = classes[name]
        if count is not None and count > gpu_class.max_gpu_count_per_worker:
            raise ClassRequestError("gpu_count", f"{count} GPUs exceeds class {name!r}'s max_gpu_count_per_worker of "
                                                 f"{gpu_class.max_gpu_count_per_worker}")
        if accepted and gpu_class.resource_name != accepted[0].resource_name and not (
                gpu_class.claims_devices or accepted[0].claims_devices):  # a claim names no resource
            raise ClassRequestError("gpu_class", f"classes {accepted[0].name!r} ({accepted[0].resource_name}) and "
                                                 f"{name!r} ({gpu_class.resource_name}) name different GPU resources; "
                                                 "the classes accepted together must share one, since their pod asks "
                                                 "for one whichever pool it lands on")
        accepted.append(gpu_class)
    if count is not None and count < 1:
        raise ClassRequestError("gpu_count", f"GPU count must be at least 1, got {count}")
    if len({c.claims_devices for c in accepted}) > 1:
        raise ClassRequestError("gpu_class", f"of the classes accepted together, "
                                             f"{', '.join(repr(c.name) for c in accepted if c.claims_devices)} get their "
                                             f"GPUs through a DRA claim and "
                                             f"{', '.join(repr(c.name) for c in accepted if not c.claims_devices)} "
                                             "through an extended resource; accept DRA classes together (one claim "
                                             "whose firstAvailable tries them in order) or extended-resource classes "
                                             "together (one resource, any of their pools)")
    if len(accepted) > 1 and accepted[0].claims_devices and accepted[0].kueue is not None:
        raise ClassRequestError("gpu_class", f"classes {', '.join(repr(c.name) for c in accepted)} claim DRA devices in "
                                             "Kueue mode: their claim would try them in order (firstAvailable), which "
                                             "Kueue (v0.19) does not admit; accept one such class, or use the classes "
                                             "outside Kueue mode")
    if len({c.kueue is None for c in accepted}) > 1:
        raise ClassRequestError("gpu_class", f"of the classes accepted together, "
                                             f"{', '.join(repr(c.name) for c in accepted if c.kueue)} are in Kueue mode "
                                             f"and {', '.join(repr(c.name) for c in accepted if not c.kueue)} not; "
                                             "accept classes all in Kueue mode (Kueue admits the Job on the first "
                                             "with quota) or none")
    return tuple(accepted)


def choice_view(accepted: tuple[GpuClass, ...]) -> GpuClass:
    """Classes a Function accepts in order, seen as the one line its steps and pods wait in: named
    by their request (`tags.choice_request`), their local slots together, everything else the first
    class's (its max_wait, its resource). One class is itself.

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, local={"slots": 2})
    >>> t4 = GpuClass(name="t4", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1, local={"slots": 1})
    >>> view = choice_view((t4, l4))
    >>> view.name, view.local.slots, choice_view((l4,)) is l4
    ('t4|l4', 3, True)
    """
    if len(accepted) == 1:
        return accepted[0]
    first = accepted[0]
    return first.model_copy(update={"name": choice_request([c.name for c in accepted]), "local": first.local.model_copy(
        update={"slots": sum(c.local.slots for c in accepted)})})
