"""Tier 1: the base of the pure state machines and their shells (common/statemachine.py)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass

import pytest

from kvlease.common.statemachine import Event, Instruction, Shell, StateMachine, UnhandledError, on

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Add(Event):
    n: int


@dataclass(frozen=True)
class Reset(Event):
    pass


@dataclass(frozen=True)
class Unknown(Event):
    pass


@dataclass(frozen=True)
class Total(Instruction):
    value: int


@dataclass(frozen=True)
class Alarm(Instruction):
    pass


class Counter(StateMachine):
    def __init__(self) -> None:
        self.value = 0

    @on(Add)
    def _add(self, ev: Add) -> list[Instruction]:
        self.value += ev.n
        return [Total(self.value)]

    @on(Reset)
    def _reset(self, ev: Reset) -> list[Instruction]:
        self.value = 0
        return [Total(0), Alarm()]


class Recorder(Shell):
    def __init__(self) -> None:
        self.totals: list[int] = []

    @on(Total)
    def _total(self, ins: Total) -> None:
        self.totals.append(ins.value)


def test_events_go_to_the_handler_registered_for_their_type():
    machine = Counter()
    assert machine.handle(Add(2), Add(3)) == [Total(2), Total(5)]
    assert machine.handle(Reset()) == [Total(0), Alarm()]
    assert machine.value == 0


def test_an_event_without_a_handler_raises_and_changes_nothing():
    machine = Counter()
    machine.handle(Add(4))
    with pytest.raises(UnhandledError, match="Counter has no handler for Unknown"):
        machine.handle(Unknown())
    assert machine.value == 4


def test_dispatch_is_by_exact_type_not_by_subclass():
    @dataclass(frozen=True)
    class MoreAdd(Add):
        pass

    with pytest.raises(UnhandledError):
        Counter().handle(MoreAdd(1))


def test_dispatch_is_by_type_not_by_class_name():
    same_name = type("Add", (Event,), {})
    with pytest.raises(UnhandledError):
        Counter().handle(same_name())


def test_an_instruction_without_an_executor_raises():
    shell = Recorder()
    shell.execute([Total(1)])
    with pytest.raises(UnhandledError, match="Recorder has no handler for Alarm"):
        shell.execute(Counter().handle(Reset()))
    assert shell.totals == [1, 0]  # carried out up to the unknown one


def test_a_subclass_adds_and_overrides_handlers():
    class Doubling(Counter):
        @on(Add)
        def _double(self, ev: Add) -> list[Instruction]:
            self.value += 2 * ev.n
            return [Total(self.value)]

    machine = Doubling()
    assert machine.handle(Add(2), Reset()) == [Total(4), Total(0), Alarm()]
    assert Counter().handle(Add(2)) == [Total(2)]  # the base class keeps its own


def test_two_handlers_for_one_type_in_one_class_are_refused():
    with pytest.raises(TypeError, match="two handlers for Add"):
        class Twice(StateMachine):
            @on(Add)
            def _one(self, ev):
                return []

            @on(Add)
            def _two(self, ev):
                return []


def test_every_event_carries_an_id_to_log():
    a, b = Add(1), Add(1)
    assert a.event_id != b.event_id
    assert Add(1, event_id=7).event_id == 7
    assert "event_id=7" in repr(Add(1, event_id=7))
    with pytest.raises(FrozenInstanceError):
        a.n = 2  # type: ignore[misc]
