"""Pure state machines and the shells that run them: events in, instructions out.

Model: dask/distributed ``worker_state_machine.py``. A machine's one entry
point is :meth:`StateMachine.handle`: it takes events (small frozen
dataclasses, each with an ``event_id`` to log) and returns instructions; no
I/O and no clock inside. A shell carries the instructions out
(:meth:`Shell.execute`) and feeds the outcomes back as events.

Both sides dispatch by registration: a method decorated ``@on(SomeType)``
handles objects of exactly that type. An object whose type has no handler
raises :class:`UnhandledError`: a machine handed an event it does not know,
or a shell handed an instruction it does not know, is a bug, never something
to skip.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, TypeVar

_event_ids = itertools.count(1)


def next_event_id() -> int:
    """A new process-wide event id (``itertools.count`` is atomic under the GIL: thread-safe)."""
    return next(_event_ids)


@dataclass(frozen=True)
class Event:
    """A stimulus for a state machine.

    ``event_id`` names it in logs and in the replies it causes; keyword only,
    a new one is drawn unless given.
    """

    event_id: int = field(default_factory=next_event_id, kw_only=True)


@dataclass(frozen=True)
class Instruction:
    """What a state machine asks its shell to do."""


class UnhandledError(TypeError):
    """No handler is registered for this type of event or instruction."""


F = TypeVar("F", bound=Callable[..., Any])


def on(*types: type) -> Callable[[F], F]:
    """Register the decorated method as the handler of objects of exactly these types."""
    def register(method: F) -> F:
        method._dispatch_types = types  # type: ignore[attr-defined]
        return method
    return register


class Dispatcher:
    """Calls the method registered with :func:`on` for an object's type.

    Each subclass collects its registered methods (a subclass may override
    what a base class registered, but not register a type twice itself).
    """

    _handlers: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherited = dict(cls._handlers)
        own: dict[type, Callable[..., Any]] = {}
        for method in vars(cls).values():
            for t in getattr(method, "_dispatch_types", ()):
                if t in own:
                    raise TypeError(f"{cls.__name__}: two handlers for {t.__name__}")
                own[t] = method
        cls._handlers = inherited | own

    def dispatch(self, obj: object, *args: Any) -> Any:
        handler = self._handlers.get(type(obj))
        if handler is None:
            raise UnhandledError(f"{type(self).__name__} has no handler for {type(obj).__name__}: {obj!r}")
        return handler(self, obj, *args)


class StateMachine(Dispatcher):
    """Pure: every handler takes one event and returns a list of instructions."""

    def handle(self, *events: Event) -> list[Instruction]:
        out: list[Instruction] = []
        for event in events:
            out.extend(self.dispatch(event))
        return out


class Shell(Dispatcher):
    """Carries out a machine's instructions: one registered executor per instruction type."""

    def execute(self, instructions: Iterable[Instruction], *args: Any) -> None:
        """Carry out each instruction in order; ``args`` go to every executor (e.g. what a call collects)."""
        for instruction in instructions:
            self.dispatch(instruction, *args)
