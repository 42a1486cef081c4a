import math

import pytest
from hypothesis import given, strategies as st

from broker.core.billing import Billing

billings = st.one_of(
    st.just(Billing.hourly()),
    st.just(Billing.per_second()),
    st.builds(
        Billing.custom,
        st.sampled_from([1.0, 60.0, 300.0, 600.0, 3600.0]),
        st.sampled_from([0.0, 60.0, 600.0, 3600.0, 7200.0]),
    ),
)
elapsed = st.floats(min_value=0, max_value=10 * 86400, allow_nan=False)


def test_hourly_charges_every_started_hour():
    b = Billing.hourly()
    assert b.units(1) == 1
    assert b.units(3600) == 1  # the boundary belongs to the hour that ends there
    assert b.units(3600.5) == 2
    assert b.cost_usd(3601, 0.17) == pytest.approx(0.34)
    assert b.paid_until(100.0, 100.0 + 10) == pytest.approx(3700.0)


def test_per_second_has_a_one_minute_minimum():
    b = Billing.per_second()
    assert b.billed_s(5) == 60
    assert b.billed_s(61.2) == 62
    assert b.cost_usd(3600, 0.36) == pytest.approx(0.36)


@given(billings, elapsed)
def test_paid_until_never_precedes_now_and_covers_the_minimum(b, e):
    t0 = 1000.0
    pu = b.paid_until(t0, t0 + e)
    assert pu >= t0 + e - 1e-6
    assert pu - t0 >= b.minimum_s - 1e-9
    # paid-until sits on a unit boundary unless the minimum dominates
    billed = pu - t0
    if billed > b.minimum_s + 1e-9:
        assert math.isclose(billed / b.unit_s, round(billed / b.unit_s), abs_tol=1e-6)


@given(billings, elapsed, elapsed)
def test_charges_are_monotone_in_time(b, e1, e2):
    lo, hi = sorted((e1, e2))
    assert b.billed_s(lo) <= b.billed_s(hi)
    assert b.cost_usd(lo, 1.0) <= b.cost_usd(hi, 1.0)


@given(billings, elapsed)
def test_no_new_charge_until_paid_until(b, e):
    pu = b.paid_until(0.0, e)
    assert b.billed_s(pu) == pytest.approx(b.billed_s(e))
    assert b.billed_s(pu + 1e-3) > b.billed_s(e)


def test_invalid_billing_is_refused():
    with pytest.raises(ValueError):
        Billing.custom(0, 60)
    with pytest.raises(ValueError):
        Billing.custom(60, -1)
