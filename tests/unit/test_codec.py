"""JSON encoding of payloads and typed decoding."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, Optional, Union

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure import codec, errors


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str
    qty: int
    price: float = 0.0


@dataclasses.dataclass
class Order:
    order_id: uuid.UUID
    placed: datetime
    color: Color
    items: list[Item]
    by_sku: dict[str, Item]
    pair: tuple[int, str]
    tags: tuple[str, ...]
    status: Literal["new", "paid"]
    note: Optional[str] = None  # noqa: UP045 - the spelling under test
    shipped: Item | None = None
    day: date | None = None
    computed: int = dataclasses.field(default=0, init=False)


class Address(pydantic.BaseModel):
    street: str
    zip: str


class Customer(pydantic.BaseModel):
    name: str
    addresses: list[Address]
    primary: Address | None = None
    since: datetime
    color: Color


def make_order() -> Order:
    return Order(
        order_id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        placed=datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        color=Color.GREEN,
        items=[Item("a", 1, 2.5), Item("b", 2)],
        by_sku={"a": Item("a", 1, 2.5)},
        pair=(7, "seven"),
        tags=("x", "y"),
        status="paid",
        note=None,
        shipped=Item("c", 3),
        day=date(2030, 1, 2),
    )


def roundtrip(value: Any, hint: Any) -> Any:
    return codec.convert(codec.decode(codec.encode(value)), hint)


# -- encode / decode ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**63,
        1.5,
        "",
        "héllo ✓",
        [],
        {},
        [1, [2, {"a": None}]],
        {"k": {"nested": [True, 1.25, "s"]}},
    ],
)
def test_json_values_roundtrip(value: Any) -> None:
    text = codec.encode(value)
    assert isinstance(text, str)
    assert codec.decode(text) == value


def test_encode_is_compact() -> None:
    assert codec.encode({"a": [1, 2], "b": None}) == '{"a":[1,2],"b":null}'


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=25,
)


@given(json_values)
def test_any_json_value_roundtrips(value: Any) -> None:
    assert codec.decode(codec.encode(value)) == value
    assert codec.convert(codec.decode(codec.encode(value)), Any) == value


def test_known_non_json_types_are_encoded_as_json() -> None:
    when = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    ident = uuid.UUID(int=5)
    assert codec.decode(codec.encode(when)) == when.isoformat()
    assert codec.decode(codec.encode(date(2030, 5, 6))) == "2030-05-06"
    assert codec.decode(codec.encode(ident)) == str(ident)
    assert codec.decode(codec.encode(Color.RED)) == "red"
    assert codec.decode(codec.encode(Level.HIGH)) == 2
    assert codec.decode(codec.encode((1, "a"))) == [1, "a"]
    assert sorted(codec.decode(codec.encode({3, 1, 2}))) == [1, 2, 3]
    assert codec.decode(codec.encode(Item("a", 1))) == {"sku": "a", "qty": 1, "price": 0.0}


@pytest.mark.parametrize(
    "value",
    [
        object(),
        b"bytes",
        bytearray(b"x"),
        Decimal("1.5"),
        1 + 2j,
        timedelta(seconds=1),
        {"nested": [object()]},
        {(1, 2): "tuple key"},
        Item("a", object()),  # type: ignore[arg-type]
        lambda: None,
        type,
    ],
    ids=lambda v: type(v).__name__,
)
def test_non_json_values_are_refused(value: Any) -> None:
    with pytest.raises(errors.InvalidPayload) as caught:
        codec.encode(value)
    assert caught.value.code == "invalid_payload"
    assert isinstance(caught.value, ValueError)


def test_a_dataclass_type_is_not_a_value() -> None:
    with pytest.raises(errors.InvalidPayload):
        codec.encode(Item)


def test_circular_values_are_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(errors.InvalidPayload):
        codec.encode(loop)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, [1.0, math.nan], {"x": math.inf}, Item("a", 1, math.nan)],
)
def test_nan_and_infinity_are_refused_on_encode(value: Any) -> None:
    with pytest.raises(errors.InvalidPayload):
        codec.encode(value)


def test_nan_inside_a_pydantic_model_is_refused() -> None:
    class Reading(pydantic.BaseModel):
        value: float

    with pytest.raises(errors.InvalidPayload):
        codec.encode(Reading(value=math.nan))


@pytest.mark.parametrize("text", ["", "{", "{'a': 1}", "[1,]", "undefined", "\x00"])
def test_malformed_json_is_refused_on_decode(text: str) -> None:
    with pytest.raises(errors.InvalidPayload):
        codec.decode(text)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", '{"x": NaN}'])
def test_nan_is_refused_on_decode(text: str) -> None:
    with pytest.raises(errors.InvalidPayload):
        codec.decode(text)


def test_digest() -> None:
    assert codec.digest(None) is None
    first = codec.digest('{"a":1}')
    assert first == codec.digest('{"a":1}')
    assert first != codec.digest('{"a":2}')
    assert isinstance(first, str)
    assert len(first) == 32


# -- typed decoding -------------------------------------------------------------


def test_nested_dataclass_roundtrip_by_hint() -> None:
    order = make_order()
    back = roundtrip(order, Order)
    assert back == order
    assert isinstance(back.order_id, uuid.UUID)
    assert isinstance(back.placed, datetime)
    assert back.placed.tzinfo is not None
    assert back.color is Color.GREEN
    assert all(isinstance(i, Item) for i in back.items)
    assert isinstance(back.by_sku["a"], Item)
    assert back.pair == (7, "seven")
    assert isinstance(back.pair, tuple)
    assert back.tags == ("x", "y")
    assert isinstance(back.shipped, Item)
    assert back.day == date(2030, 1, 2)


def test_dataclass_optional_fields_absent_or_null() -> None:
    data = codec.decode(codec.encode(make_order()))
    data["shipped"] = None
    data.pop("note")
    back = codec.convert(data, Order)
    assert back.shipped is None
    assert back.note is None


def test_pydantic_model_roundtrip_by_hint() -> None:
    customer = Customer(
        name="Ada",
        addresses=[Address(street="1 Main", zip="123"), Address(street="2 Side", zip="456")],
        primary=Address(street="1 Main", zip="123"),
        since=datetime(2029, 12, 31, 23, 59, tzinfo=UTC),
        color=Color.RED,
    )
    back = roundtrip(customer, Customer)
    assert back == customer
    assert isinstance(back.addresses[1], Address)
    assert back.color is Color.RED


def test_models_inside_containers() -> None:
    items = [Item("a", 1), Item("b", 2)]
    assert roundtrip(items, list[Item]) == items
    assert roundtrip({"x": Item("x", 9)}, dict[str, Item]) == {"x": Item("x", 9)}
    assert roundtrip((Item("a", 1), 3), tuple[Item, int]) == (Item("a", 1), 3)
    assert roundtrip([Address(street="s", zip="z")], list[Address]) == [
        Address(street="s", zip="z")
    ]
    assert roundtrip({"k": [Item("a", 1)]}, dict[str, list[Item]]) == {"k": [Item("a", 1)]}


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        (None, Optional[Item], None),  # noqa: UP045
        ({"sku": "a", "qty": 1}, Optional[Item], Item("a", 1)),  # noqa: UP045
        (None, Item | None, None),
        ({"sku": "a", "qty": 1}, Item | None, Item("a", 1)),
        (5, Union[int, str], 5),  # noqa: UP007
        ("5", int | str, "5"),
        ([1, 2], tuple[int, ...], (1, 2)),
        ([], tuple[int, ...], ()),
        ([1, "a"], tuple[int, str], (1, "a")),
        ([3, 1], set[int], {1, 3}),
        ([3, 1], frozenset[int], frozenset({1, 3})),
        ("paid", Literal["new", "paid"], "paid"),
        (2, Literal[1, 2], 2),
        ("red", Color, Color.RED),
        (1, Level, Level.LOW),
        ("2030-01-02T03:04:05+00:00", datetime, datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (
            "2030-01-02T03:04:05+02:00",
            datetime,
            datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
        ),
        ("2030-01-02", date, date(2030, 1, 2)),
        (str(uuid.UUID(int=7)), uuid.UUID, uuid.UUID(int=7)),
        (3, float, 3.0),
        ({"a": 1}, dict[str, int], {"a": 1}),
        ({"a": 1}, dict, {"a": 1}),
        ([1], list, [1]),
        ({"x": [1, "y"]}, Any, {"x": [1, "y"]}),
        ({"x": 1}, None, {"x": 1}),
    ],
)
def test_convert_by_hint(value: Any, hint: Any, expected: Any) -> None:
    got = codec.convert(value, hint)
    assert got == expected
    assert type(got) is type(expected)


def test_datetime_keeps_its_offset_through_a_roundtrip() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    back = roundtrip(when, datetime)
    assert back == when
    assert back.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("x", int),
        ("1", float),
        (1, str),
        (1, bool),
        ("a", list[int]),
        (["a"], list[int]),
        ({"a": "b"}, dict[str, int]),
        ([1, 2, 3], tuple[int, int]),
        ("paid", Literal["new"]),
        ("blue", Color),
        ("not a date", datetime),
        ("not-a-uuid", uuid.UUID),
        ([], Item),
        ({"sku": "a"}, Item),  # missing required qty
        ({"sku": "a", "qty": "many"}, Item),
        ({"name": "x"}, Customer),
        (["x"], int | None),
    ],
)
def test_values_that_do_not_fit_the_hint_are_refused(value: Any, hint: Any) -> None:
    with pytest.raises(errors.InvalidPayload):
        codec.convert(value, hint)


def test_hints_of_functions() -> None:
    def fn(ctx: object, order: Order, n: int = 1) -> list[Item]: ...

    assert codec.return_hint(fn) == list[Item]
    assert codec.param_hints(fn) == {"ctx": object, "order": Order, "n": int}

    def bare(a, b):  # type: ignore[no-untyped-def]
        ...

    assert codec.return_hint(bare) is None
    assert codec.param_hints(bare) == {}

    def unresolvable(a: NoSuchType) -> NoSuchType: ...  # type: ignore[name-defined]  # noqa: F821

    assert codec.return_hint(unresolvable) is None
    assert codec.param_hints(unresolvable) == {}


@given(
    sku=st.text(),
    qty=st.integers(),
    price=st.floats(allow_nan=False, allow_infinity=False),
)
def test_dataclass_roundtrip_property(sku: str, qty: int, price: float) -> None:
    item = Item(sku, qty, price)
    assert roundtrip(item, Item) == item
    assert json.loads(codec.encode(item)) == {"sku": sku, "qty": qty, "price": price}
