"""broker.core.frozen.fast_init: the same objects as the dataclass's own __init__, still frozen."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from broker.core.control.actions import Assign, SlotRef
from broker.core.control.ledger.records import Attempt, Ended
from broker.core.control.snapshot import NodeView, Observations, RunningTask, Snapshot
from broker.core.frozen import fast_init


def twin(cls):
    """The same dataclass with the generated __init__ (fast_init not applied)."""
    fields = [(f.name, f.type, field(default=f.default) if f.default is not dataclasses.MISSING else
               field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING else field())
              for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__ + "Plain", fields, frozen=True, slots=True)


@pytest.mark.parametrize("cls", [RunningTask, NodeView, Observations, Snapshot, SlotRef, Assign, Attempt, Ended])
def test_every_field_is_set_as_the_generated_init_sets_it(cls):
    plain = twin(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    values = {n: (k, n) for k, n in enumerate(names)}  # distinct, hashable sentinels
    # positional, keywords, and the required fields alone (the defaults and factories)
    for args, kwargs in (([values[n] for n in names], {}), ([], values), ([], {n: values[n] for n in required})):
        got, want = cls(*args, **kwargs), plain(*args, **kwargs)
        assert [getattr(got, n) for n in names] == [getattr(want, n) for n in names]
    obj = cls(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, names[0], "changed")
    assert dataclasses.replace(obj, **{names[-1]: "x"}) == cls(**{**values, names[-1]: "x"})
    assert pickle.loads(pickle.dumps(obj)) == obj and hash(obj) == hash(cls(**values))
    with pytest.raises(TypeError):
        cls(*[values[n] for n in names], "one too many")


def test_a_default_factory_makes_a_new_value_each_time():
    a, b = (Snapshot(0.0, {}, (), None, 0, 0, Observations(), 0.0) for _ in range(2))
    assert a.spot_seen == {} and a.spot_seen is not b.spot_seen


def test_refuses_what_it_cannot_build():
    @dataclass
    class Mutable:
        x: int

    @dataclass(frozen=True, slots=True)
    class Post:
        x: int

        def __post_init__(self):
            pass

    @dataclass(frozen=True, slots=True)
    class KwOnly:
        x: int = field(kw_only=True)

    for cls in (Mutable, Post, KwOnly):
        with pytest.raises(TypeError):
            fast_init(cls)
