"""The Python API's boundary: every argument of every public call checked against its
annotation before anything is read, written or started, and every mistake the API's
own `UsageError` in one line (`WrongType`, also a TypeError; `BadValue`, also a
ValueError) naming the argument and the fix.

`guard(namespace)` wraps the functions and the public methods of the classes a module
exports (`__all__`), so a call added later is checked as soon as it is annotated. What
the annotations say is checked as such: `str` (no NUL, at most MAX_TEXT characters),
`int` (not a bool, 0..MAX_COUNT), `float` (a finite number, 0..MAX_SECONDS),
`Sequence[str]` (a list or tuple of strings, never one string: `args="--lr 0.1"` is
refused with the list it meant), `Mapping[str, str]`, `Mapping[str, Any]` (data YAML and
JSON can hold: no cycle, at most MAX_DEPTH deep), unions of these and None.

A usage error of the layers below that is not the launcher's (the serving side's,
publishing a version) comes back as the API's, with its message.
"""
from __future__ import annotations

import collections.abc as abc
import functools
import inspect
import math
import shlex
import types
import typing
from collections.abc import Callable
from typing import Any

from mljob import errors as core
from submit.errors import UsageError

MAX_TEXT = 100_000        # characters in one string argument
MAX_ITEMS = 100_000       # items in one list or mapping
MAX_COUNT = 1_000_000     # an int argument (a count, a limit, a size)
MAX_SECONDS = 10 ** 9     # a float argument (a timeout, seconds)
MAX_DEPTH = 64            # nesting of a config or an instance


class WrongType(UsageError, TypeError):
    """An argument of the wrong type (a string where a list is wanted, None where a
    value is)."""


class BadValue(UsageError, ValueError):
    """An argument of the right type and a value no call takes (nan, negative, huge,
    NUL in a string, a cycle in a config)."""


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) \
        else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _words(hint: Any) -> str:
    """What an annotation asks for, in a user's words."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_words(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if origin is not None and isinstance(origin, type) and issubclass(origin, abc.Mapping):
        return "a dict"
    if origin is not None and isinstance(origin, type) and issubclass(origin, abc.Sequence):
        return "a list of strings" if typing.get_args(hint)[:1] == (str,) else "a list"
    if origin is abc.Callable:
        return "a function"
    return {str: "a string", int: "a whole number", float: "a number", bool: "True or False",
            Any: "a value"}.get(hint, getattr(hint, "__name__", str(hint)))


def _fits(value: Any, hint: Any) -> bool:
    """Whether the value is of the annotation's type (its outer type: the items of a
    list or mapping are checked by `_check_value`)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(hint))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        if origin is abc.Callable:
            return callable(value)
        if issubclass(origin, (str, bytes)):
            return False
        if issubclass(origin, abc.Mapping):
            return isinstance(value, abc.Mapping)
        if issubclass(origin, abc.Sequence):
            return isinstance(value, (list, tuple))
        return isinstance(value, origin)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _branch(value: Any, hint: Any) -> Any:
    """The member of a union the value is of."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for member in typing.get_args(hint):
            if _fits(value, member):
                return _branch(value, member)
    return hint


def check(value: Any, hint: Any, where: str) -> None:
    """Raise WrongType / BadValue when `value` is not what `hint` says; `where` names
    it in the message (`submit(args=...)`)."""
    if not _fits(value, hint):
        raise WrongType(f"{where} is {_show(value)}, not {_words(hint)}{_hint(value, hint)}")
    _check_value(value, _branch(value, hint), where)


def _hint(value: Any, hint: Any) -> str:
    """The fix a common slip calls for: one string given for a list of them."""
    if isinstance(value, str) and "a list of strings" in _words(hint):
        try:
            split = shlex.split(value)
        except ValueError:
            split = value.split()
        shown = repr(split)
        return f"; give a list, one string per item: {shown if len(shown) < 80 else '[...]'}"
    return ""


def _check_value(value: Any, hint: Any, where: str) -> None:
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int) and hint is int:
        if not 0 <= value <= MAX_COUNT:
            raise BadValue(f"{where} is {_show(value)}; give a whole number from 0 to "
                           f"{MAX_COUNT:,}")
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value) \
                or not 0 <= value <= MAX_SECONDS:
            raise BadValue(f"{where} is {_show(value)}; give a finite number from 0 to "
                           f"{MAX_SECONDS:,}")
    elif isinstance(value, abc.Mapping):
        args = typing.get_args(hint)
        if args and args[1] is not Any:
            if len(value) > MAX_ITEMS:
                raise BadValue(f"{where} holds {len(value):,} items; at most {MAX_ITEMS:,}")
            for k, v in value.items():
                for part, what in ((k, "key"), (v, "value")):
                    if not isinstance(part, str):
                        raise WrongType(f"{where} holds the {what} {_show(part)}; its keys "
                                        f"and values are strings")
                    _check_text(part, where)
        else:
            check_data(value, where)
    elif isinstance(value, (list, tuple)):
        if typing.get_args(hint)[:1] != (str,):
            check_data(value, where)
            return
        if len(value) > MAX_ITEMS:
            raise BadValue(f"{where} holds {len(value):,} items; at most {MAX_ITEMS:,}")
        for item in value:
            if not isinstance(item, str):
                raise WrongType(f"{where} holds {_show(item)}; each item is a string")
            _check_text(item, where)


def _check_text(value: str, where: str) -> None:
    if len(value) > MAX_TEXT:
        raise BadValue(f"{where} is {len(value):,} characters long; at most {MAX_TEXT:,}")
    if "\0" in value:
        raise BadValue(f"{where} {_show(value)} holds a NUL character; remove it")


def check_data(value: Any, where: str) -> None:
    """Data that YAML and JSON can hold (a config, prediction instances): strings,
    numbers, booleans, None, lists and string-keyed dicts, no cycle, at most MAX_DEPTH
    deep. Walked without recursion, so no nesting can exhaust the stack."""
    stack: list[tuple[Any, int, tuple[int, ...]]] = [(value, 0, ())]
    seen = 0
    while stack:
        item, depth, path = stack.pop()
        seen += 1
        if seen > MAX_ITEMS * 10:
            raise BadValue(f"{where} holds more than {MAX_ITEMS * 10:,} values")
        if isinstance(item, str):
            _check_text(item, where)
        elif item is None or isinstance(item, (bool, int)):
            continue
        elif isinstance(item, float):
            continue
        elif isinstance(item, (abc.Mapping, list, tuple)):
            if id(item) in path:
                raise BadValue(f"{where} contains itself; give data without a cycle")
            if depth >= MAX_DEPTH:
                raise BadValue(f"{where} is nested more than {MAX_DEPTH} deep")
            inner = (*path, id(item))
            if isinstance(item, abc.Mapping):
                for k, v in item.items():
                    if not isinstance(k, str):
                        raise WrongType(f"{where} has the key {_show(k)}; keys are strings")
                    stack.append((v, depth + 1, inner))
            else:
                stack.extend((v, depth + 1, inner) for v in item)
        else:
            raise WrongType(f"{where} holds {_show(item)}, which YAML and JSON cannot "
                            "write; give strings, numbers, booleans, lists and dicts")


def checked(fn: Callable[..., Any], extra: Callable[[str, str, Any], None] | None = None
            ) -> Callable[..., Any]:
    """`fn` with its arguments checked against its annotations first (`extra(call,
    name, value)` checks each `**options` keyword), and any package's usage error it
    raises turned into the API's."""
    signature = inspect.signature(fn)
    name = fn.__qualname__.replace(".__init__", "")
    hints: dict[str, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hints:
            hints.update(typing.get_type_hints(fn))
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise WrongType(f"{name}(): {core.first_line(exc)}") from None
        for param, value in bound.arguments.items():
            kind = signature.parameters[param].kind
            if param == "self":
                continue
            if kind is inspect.Parameter.VAR_KEYWORD:
                for key, given in value.items():
                    if extra is not None:
                        extra(name, key, given)
                    else:
                        check(given, hints.get(param, Any), f"{name}({key}=...)")
            elif kind is not inspect.Parameter.VAR_POSITIONAL:
                check(value, hints.get(param, Any), f"{name}({param}=...)")
        try:
            return fn(*args, **kwargs)
        except core.UsageError as exc:
            if isinstance(exc, UsageError):
                raise
            raise UsageError(core.first_line(exc)) from exc
    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    return wrapper


def guard(namespace: dict[str, Any],
          extra: dict[str, Callable[[str, str, Any], None]] | None = None) -> None:
    """Wrap (`checked`) every function of the module's `__all__`, and every public
    method (and `__init__`) of its classes that are not exceptions; `extra`: the
    `**options` checks by function name."""
    extra = extra or {}
    for name in namespace["__all__"]:
        obj = namespace[name]
        if inspect.isfunction(obj):
            namespace[name] = checked(obj, extra.get(name))
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, member in list(vars(obj).items()):
                if inspect.isfunction(member) and (attr == "__init__"
                                                   or not attr.startswith("_")):
                    setattr(obj, attr, checked(member, extra.get(f"{name}.{attr}")))
