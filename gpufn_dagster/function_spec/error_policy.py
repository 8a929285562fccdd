"""A Function's error policy: what a refresh does when the callable raises on its rows.

A policy is an ordered list of rules; the first rule that matches an error decides: **retry** the
call (up to `attempts` calls in all, waiting an exponential backoff with jitter between them, then
`then`: skip or fail), **skip** the row (NULL, recorded in `gpufn_errors`, retried on the next
refresh) or **fail** the refresh (nothing of this attempt is committed; checkpoints stay). An error
no rule matches fails, as `on_error="fail"` always did. The shorthands stay: `"fail"` is no rule,
`"skip"` is one rule skipping any error. The same rules as Geneva's `Retry/Skip/Fail(ExcType,
match=regex)`, written as data so YAML and Python say the same thing.

A rule names exception classes by name -- `ConnectionError`, or `module.QualName` for one of a
library's -- matched against every class the error is an instance of, so a process that never
imported the library the rule names still decides the same way (the policy is pure data: it pickles
to a warm instance's process and reads the same in every pod).

Example:
    >>> policy = ErrorPolicy.of([Retry(ConnectionError, match="429|rate limit", attempts=3, then="skip"),
    ...                          Skip(ValueError)])
    >>> policy.decide(ConnectionResetError("HTTP 429"), attempt=1).action
    'retry'
    >>> policy.decide(ConnectionResetError("HTTP 429"), attempt=3)
    Decision(action='skip', rule="retry(ConnectionError, match='429|rate limit', attempts=3, then=skip)", delay=0.0)
    >>> policy.decide(ValueError("bad row"), attempt=1).action, policy.decide(KeyError("x"), attempt=1).rule
    ('skip', 'no rule matched')
    >>> str(ErrorPolicy.of("skip")), str(ErrorPolicy.of("fail"))
    ('skip', 'fail')
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..errors import FunctionDefinitionError

Action = Literal["retry", "skip", "fail"]
Then = Literal["skip", "fail"]
UNMATCHED = "no rule matched"


def class_name(cls: type[BaseException] | str) -> str:
    """How a rule names an exception class: a builtin by its name, any other as `module.QualName`.

    >>> class_name(TimeoutError), class_name(FunctionDefinitionError), class_name("requests.HTTPError")
    ('TimeoutError', 'gpufn_dagster.errors.FunctionDefinitionError', 'requests.HTTPError')
    """
    if isinstance(cls, str):
        return cls
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _names_of(err: BaseException) -> set[str]:
    """Every name a rule may give `err`'s classes: the bare name and module.QualName of each."""
    names: set[str] = set()
    for cls in type(err).__mro__:
        names.update((cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"))
    return names


def over_budget(options: Any, failed: int, checked: int) -> str | None:
    """Which failure budget `failed` rows of the `checked` a refresh checks exceed (None: within).

    >>> from types import SimpleNamespace as F
    >>> over_budget(F(max_failed_rows=10, max_failed_fraction=None), 11, 1000)
    'max_failed_rows=10'
    >>> over_budget(F(max_failed_rows=None, max_failed_fraction=0.01), 10, 1000) is None
    True
    >>> over_budget(F(max_failed_rows=None, max_failed_fraction=0.01), 11, 1000)
    'max_failed_fraction=0.01 (10 rows)'
    """
    if options.max_failed_rows is not None and failed > options.max_failed_rows:
        return f"max_failed_rows={options.max_failed_rows}"
    if options.max_failed_fraction is not None and failed > options.max_failed_fraction * checked:
        return f"max_failed_fraction={options.max_failed_fraction} ({int(options.max_failed_fraction * checked):,} rows)"
    return None


@dataclass(frozen=True)
class Decision:
    """What to do with one failed call: its action, the rule that decided, and the wait before a retry."""

    action: Action
    rule: str
    delay: float = 0.0


@dataclass(frozen=True)
class ErrorRule:
    """One rule: which errors it matches (all of them when it names neither classes nor a pattern)
    and what it does with them."""

    action: Action
    errors: tuple[str, ...] = ()  # exception class names; empty: any class
    match: str | None = None  # a regular expression searched in the error's message
    attempts: int = 3  # retry: calls in all, the first included
    backoff_seconds: float = 1.0  # retry: the first wait; doubles with each attempt
    max_backoff_seconds: float = 60.0  # retry: the longest wait
    then: Then = "fail"  # retry: what the last attempt's error does

    def matches(self, err: BaseException) -> bool:
        if self.errors and not set(self.errors) & _names_of(err):
            return False
        return self.match is None or re.search(self.match, str(err) or repr(err)) is not None

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait after failed attempt `attempt`: backoff doubling per attempt, capped, jittered
        over its upper half so that workers retrying the same service do not retry in step.

        >>> rule = ErrorRule("retry", backoff_seconds=1.0, max_backoff_seconds=3.0)
        >>> [0.5 <= rule.delay(1, random.Random(7)) <= 1.0, 1.0 <= rule.delay(2, random.Random(7)) <= 2.0,
        ...  1.5 <= rule.delay(5, random.Random(7)) <= 3.0]
        [True, True, True]
        """
        ceiling = min(self.backoff_seconds * 2 ** (attempt - 1), self.max_backoff_seconds)
        return ceiling * (0.5 + 0.5 * rng.random())

    def __str__(self) -> str:
        what = [*self.errors, *([f"match={self.match!r}"] if self.match is not None else [])]
        if self.action == "retry":
            what += [f"attempts={self.attempts}", f"then={self.then}"]
        return f"{self.action}({', '.join(what)})" if what else self.action


def Retry(*errors: type[BaseException] | str, match: str | None = None, attempts: int = 3,
          backoff_seconds: float = 1.0, max_backoff_seconds: float = 60.0, then: Then = "fail") -> ErrorRule:
    """Retry a call that raised one of `errors` (any, when none is named) whose message matches `match`.

    >>> str(Retry(TimeoutError, attempts=5, then="skip"))
    'retry(TimeoutError, attempts=5, then=skip)'
    """
    return ErrorRule("retry", tuple(map(class_name, errors)), match, attempts, backoff_seconds, max_backoff_seconds,
                     then)


def Skip(*errors: type[BaseException] | str, match: str | None = None) -> ErrorRule:
    """Leave the row NULL and record it (the next refresh tries it again)."""
    return ErrorRule("skip", tuple(map(class_name, errors)), match)


def Fail(*errors: type[BaseException] | str, match: str | None = None) -> ErrorRule:
    """Fail the refresh (useful before a broader rule: `[Fail(KeyError), Skip()]`)."""
    return ErrorRule("fail", tuple(map(class_name, errors)), match)


@dataclass(frozen=True)
class ErrorPolicy:
    """The ordered rules of a Function's `on_error`; an error none matches fails the refresh."""

    rules: tuple[ErrorRule, ...] = ()
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def decide(self, err: BaseException, attempt: int, may_retry: bool = True) -> Decision:
        """What to do after call `attempt` (1 = the first) raised `err`; `may_retry` False when the
        call pins an already-decided batch's error on its rows one by one."""
        for rule in self.rules:
            if rule.matches(err):
                if rule.action != "retry":
                    return Decision(rule.action, str(rule))
                if may_retry and attempt < rule.attempts:
                    return Decision("retry", str(rule), rule.delay(attempt, self.rng))
                return Decision(rule.then, str(rule))
        return Decision("fail", UNMATCHED)

    @property
    def shorthand(self) -> Literal["fail", "skip"] | None:
        """'fail' or 'skip' when the policy is one of the two shorthands, else None."""
        if not self.rules:
            return "fail"
        return "skip" if self.rules == (ErrorRule("skip"),) else None

    def __str__(self) -> str:
        return self.shorthand or "; ".join(map(str, self.rules)) + "; otherwise fail"

    @classmethod
    def of(cls, value: Any, label: str = "Function") -> ErrorPolicy:
        """The policy from what `on_error` says: 'fail', 'skip', a policy, a rule, or a list of rules
        (ErrorRule, or mappings with its fields as YAML writes them). Refused naming the field."""
        where = f"{label}: field 'on_error'"
        if isinstance(value, ErrorPolicy):
            return value
        if value in ("fail", "skip"):
            return cls(() if value == "fail" else (ErrorRule("skip"),))
        if isinstance(value, ErrorRule | Mapping):
            value = [value]
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise FunctionDefinitionError(f"{where}: must be 'fail', 'skip' or a list of rules "
                                          f"(Retry/Skip/Fail), got {value!r}")
        return cls(tuple(_rule(item, f"{where}[{i}]") for i, item in enumerate(value)))


def _rule(item: Any, where: str) -> ErrorRule:
    if isinstance(item, Mapping):
        known = {f.name for f in fields(ErrorRule)}
        if unknown := sorted(set(item) - known):
            raise FunctionDefinitionError(f"{where}: unknown field {', '.join(map(repr, unknown))}; fields: "
                                          f"{', '.join(sorted(known))}")
        values = {k: v for k, v in item.items() if v is not None or k == "match"}
        if "errors" in values:
            values["errors"] = tuple(map(class_name, [values["errors"]] if isinstance(values["errors"], str)
                                         else values["errors"]))
        try:
            item = ErrorRule(**values)
        except TypeError as err:
            raise FunctionDefinitionError(f"{where}: {err}") from None
    if not isinstance(item, ErrorRule):
        raise FunctionDefinitionError(f"{where}: expected Retry(...), Skip(...), Fail(...) or a mapping, got {item!r}")
    if item.action not in ("retry", "skip", "fail"):
        raise FunctionDefinitionError(f"{where}: field 'action': must be retry, skip or fail, got {item.action!r}")
    if item.then not in ("skip", "fail"):
        raise FunctionDefinitionError(f"{where}: field 'then': must be skip or fail, got {item.then!r}")
    if item.attempts < 1 or item.backoff_seconds < 0 or item.max_backoff_seconds < 0:
        raise FunctionDefinitionError(f"{where}: attempts must be at least 1 and backoff_seconds, "
                                      f"max_backoff_seconds not negative, got {item}")
    if item.match is not None:
        try:
            re.compile(item.match)
        except re.error as err:
            raise FunctionDefinitionError(f"{where}: field 'match': not a regular expression: {err}") from None
    return item
