"""Name -> component, one registry per kind of extension point: losses here, LR schedules and data sources in
the trainer. Registering a name (or an alias) twice is refused, so two modules cannot silently shadow each
other; an alias is an old name that still resolves to its component, so that params.txt files and
checkpoints written under it keep loading after a rename."""

from __future__ import annotations

from typing import Callable, Dict, Generic, Iterator, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """The registered components of one `kind` ("loss", "LR schedule", "data source"), in registration order.

    `check(name, component)` runs before a component is added (it raises for a bad declaration).
    """

    def __init__(self, kind: str, check: Optional[Callable[[str, T], None]] = None):
        self.kind = kind
        self._check = check
        self._items: Dict[str, T] = {}
        self._aliases: Dict[str, str] = {}

    def add(self, name: str, component: T, aliases: Sequence[str] = ()) -> T:
        """Register `component` under `name` and its old names `aliases`; returns it."""
        for taken in (name, *aliases):
            if taken in self._items or taken in self._aliases:
                raise ValueError(f"{self.kind} {taken!r} is already registered by {self._owner(taken)}")
        if self._check is not None:
            self._check(name, component)
        self._items[name] = component
        self._aliases.update(dict.fromkeys(aliases, name))
        return component

    def register(self, name: str, aliases: Sequence[str] = ()) -> Callable[[T], T]:
        """`@registry.register(name)`: the decorated class or function is the component."""
        return lambda component: self.add(name, component, aliases)

    def canonical(self, name: str) -> str:
        """`name`, or the name an alias stands for; ValueError naming the registered ones if neither."""
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        raise ValueError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}")

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self) -> Tuple[str, ...]:
        """The registered names (not the aliases), in registration order."""
        return tuple(self._items)

    def aliases(self) -> Tuple[str, ...]:
        """The old names that still resolve, in registration order."""
        return tuple(self._aliases)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        """The registered names, in registration order (as `names()`)."""
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()

    def _owner(self, name: str) -> str:
        component = self._items.get(self._aliases.get(name, name))
        return getattr(component, "__module__", repr(component))
