"""Plain value classes for the lint side, without :mod:`dataclasses`.

A ``@dataclass`` is built when its module is imported: the decorator writes the source of
``__init__``, ``__repr__``, ``__eq__`` (and for a frozen one ``__hash__``, ``__setattr__``,
``__delattr__``) and compiles each with ``exec``, and importing :mod:`dataclasses` imports
:mod:`inspect` (with ``dis`` and ``tokenize``). On the lint side that was 30-40 ms of
every process's start, a third to a half of what ``trainlint check one_file.py`` costs
beyond the interpreter; a pre-commit hook pays it on every commit. These classes write
their ``__init__`` out (compiled once into the bytecode cache, like any other function)
and take the rest from :class:`Record`.
"""

from __future__ import annotations

from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """A value class: its fields are the public names in the ``__slots__`` of the class
    and its bases (bases first), which its ``__init__`` takes; a class may name fewer in
    ``_fields``, those compared and shown (a dataclass's ``compare=False, repr=False``).

    Like a dataclass's: ``repr`` names the class and every field; two records are equal
    when they are of the same class and their fields are equal. ``frozen=True`` (a class
    keyword) makes them hashable by their fields (nothing stops an assignment: these are
    internal values, written only by their ``__init__``); otherwise a record is not
    hashable, as a dataclass with ``eq`` and without ``frozen`` is not. ``eq=False``: equal
    only to itself and hashable by identity. A subclass that passes neither keyword
    compares and hashes as its base does.
    """

    __slots__ = ()
    #: the compared and shown fields; ``_init_fields``: every argument of ``__init__``
    _fields: tuple[str, ...] = ()
    _init_fields: tuple[str, ...] = ()

    def __init_subclass__(
        cls, *, eq: bool | None = None, frozen: bool | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls._init_fields = tuple(
            name
            for base in reversed(cls.__mro__)
            for name in base.__dict__.get("__slots__", ())
            if not name.startswith("_")
        )
        if "_fields" not in cls.__dict__:
            cls._fields = cls._init_fields
        if cls.__dict__.get("__hash__") is not None:
            return  # (written out by the class, with its __eq__)
        if eq is False:
            cls.__eq__ = object.__eq__  # type: ignore[method-assign,assignment]
            cls.__hash__ = object.__hash__  # type: ignore[method-assign,assignment]
        elif frozen:
            cls.__hash__ = Record.field_hash  # type: ignore[method-assign,assignment]
        # (neither: what the base class does; Record's own: equal by fields, no hash)

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined,no-any-return]

    def field_hash(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({fields})"

    def _replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        values = {name: getattr(self, name) for name in self._init_fields}
        values.update(changes)
        return type(self)(**values)

    def _asdict(self) -> dict[str, Any]:
        """The fields by name, in order; records inside (also in tuples and lists) as
        dicts too (``dataclasses.asdict``)."""
        return {name: _plain(getattr(self, name)) for name in self._fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value._asdict()
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value
