import pytest

from fusekit.search import Knob, Space, point_key, top_k


def test_points_are_the_legal_product_last_knob_fastest():
    space = Space(
        (Knob("a", (1, 2, 3)), Knob("b", ("x", "y"))),
        constraints=(lambda p: not (p["a"] == 2 and p["b"] == "y"),),
    )
    assert space.points() == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 3, "b": "x"},
        {"a": 3, "b": "y"},
    ]
    assert len(space) == 5
    assert space.names == ("a", "b")


def test_contains_checks_names_values_and_constraints():
    space = Space((Knob("a", (1, 2)),), constraints=(lambda p: p["a"] != 2,))
    assert space.contains({"a": 1})
    assert not space.contains({"a": 2})  # constraint
    assert not space.contains({"a": 3})  # not a legal value
    assert not space.contains({"a": 1, "b": 0})  # unknown knob


def test_bad_knobs_and_spaces_are_rejected():
    with pytest.raises(ValueError, match="values"):
        Knob("a", ())
    with pytest.raises(ValueError, match="distinct"):
        Knob("a", (1, 1))
    with pytest.raises(ValueError, match="knobs"):
        Space((Knob("a", (1,)), Knob("a", (2,))))


def test_point_key_is_canonical():
    assert point_key({"b": 1, "a": "x"}) == point_key({"a": "x", "b": 1}) == '{"a":"x","b":1}'


def test_top_k_orders_by_prediction_and_keeps_ties_stable():
    points = [{"i": i} for i in range(5)]
    assert top_k(points, [3.0, 1.0, 2.0, 1.0, 9.0], 3) == [{"i": 1}, {"i": 3}, {"i": 2}]
    assert top_k(points, [1.0] * 5, 10) == points
    with pytest.raises(ValueError, match="predicted_s"):
        top_k(points, [1.0], 1)
    with pytest.raises(ValueError, match="'k'"):
        top_k(points, [1.0] * 5, 0)
