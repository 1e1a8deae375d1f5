"""The cluster model (model/cluster.py) and the cost records (spec/costs.py)."""
import pytest

from model.cluster import ATOMIC_FRAME, ClusterModel, Fabric, wire_ns, write_wire_ns
from spec import costs as C
from spec import params as P


def _recs(lat_gda=4000.0, lat_rc=5000.0, rate_gda=400e6, rate_rc=2e6):
    return [{"workload": "latency", "path": "ibgda", "size": 8, "post_to_signal_ns": lat_gda},
            {"workload": "latency", "path": "ibrc", "size": 8, "post_to_signal_ns": lat_rc},
            {"workload": "rate", "path": "ibgda", "ops_per_s": 300e6, "steady_ops_per_s": rate_gda},
            {"workload": "rate", "path": "ibrc", "ops_per_s": rate_rc, "steady_ops_per_s": 9e9},
            {"workload": "rate", "path": "ibrc", "ops_per_s": 9e9, "tweaked": True}]


def test_wire_arithmetic():
    # SPEC section 6: an 8-byte WRITE is 106 wire bytes, 2.12 ns at 400G; 4 KiB + 4 KiB: 2 packets
    assert write_wire_ns(8) == pytest.approx(106 * 8 / 400)
    assert write_wire_ns(8192) == pytest.approx(2 * (98 + 4096) * 8 / 400)
    assert wire_ns(ATOMIC_FRAME) == pytest.approx((ATOMIC_FRAME + 24) * 8 / 400)


def test_fit_takes_the_rtl_records():
    m = ClusterModel(_recs())
    f = m.fitted()
    # the RTL cable's 200 ns taken out of the latency; IBGDA's steady rate, a proxy's overall
    # one, a tweaked point ignored
    assert f["ibgda"] == {"latency_ns": 3800.0, "post_ns_per_op": pytest.approx(2.5)}
    assert f["ibrc"]["post_ns_per_op"] == pytest.approx(500.0)
    with pytest.raises(ValueError):
        ClusterModel(_recs()[1:])


def test_a2a_closed_form():
    m = ClusterModel(_recs())
    # 2 RTL nodes: one put_signal each, so the fitted latency plus the RTL cable
    assert m.a2a_ns("ibgda", 2, 8) == pytest.approx(4000.0)
    # 4 RTL nodes through the switch model (180 ns one way), 3 put_signals of 8 KiB: the
    # first's latency; the later ones at the wire's pace (WRITE + the signal's frame), each
    # 1 us sooner for finding the signal word in the atomic cache: 2 x 3.5 us < 1 us, so
    # the first decides
    first = 3800 + 180 + write_wire_ns(8192) - write_wire_ns(8)
    per = write_wire_ns(8192) + wire_ns(ATOMIC_FRAME)
    assert 2 * per < 1000
    assert m.a2a_ns("ibgda", 4, 8192) == pytest.approx(first)
    # 64 KiB: 2 x 1.34 us - 1 us beyond the first
    big = 3800 + 180 + write_wire_ns(65536) - write_wire_ns(8)
    per = write_wire_ns(65536) + wire_ns(ATOMIC_FRAME)
    assert m.a2a_ns("ibgda", 4, 65536) == pytest.approx(big + 2 * per - 1000)
    # through a proxy a request takes 500 ns: the third lands 1000 - 1000 ns after the first
    assert m.a2a_ns("ibrc", 4, 8) == pytest.approx(4800 + 180)
    assert m.a2a_ns("ibrc", 8, 8, Fabric()) == pytest.approx(4800 + 340 + 6 * 500 - 1000)


def test_fabric_and_scale():
    f = Fabric()
    assert f.one_way_ns(2) == pytest.approx(2 * 40 + 260)
    assert f.one_way_ns(32) == pytest.approx(2 * 40 + 260)                 # one leaf of 32
    assert f.one_way_ns(100_000) == pytest.approx(4 * 40 + 3 * 260, rel=1e-3)
    m = ClusterModel(_recs())
    last = 0
    for n in (8, 64, 1024, 100_000):
        a = m.a2a_ns("ibgda", n, 8, f)
        assert a > last and m.a2a_ns("ibrc", n, 8, f) > a
        last = a
    d, c = m.moe_ns("ibgda", 16, fabric=f)
    assert 0 < d < c                # BF16 combine tokens are twice the FP8 dispatch's


def test_costs_records():
    assert C.PROXY.per_op_ns == pytest.approx(570.0)
    assert 1.7e6 <= 1e9 / C.PROXY.per_op_ns <= 2e6        # calibrated to the published IBRC rate
    assert C.PROXY_MT.threads == 4 and C.PROXY_MT.batch == 32
    with pytest.raises(ValueError):
        C.ProxyCosts(threads=0)
    with pytest.raises(ValueError):
        C.GpuCosts(atomic_ns=-1)
    assert C.GPU.with_(pcie_ns=250).pcie_ns == 250 and C.GPU.pcie_ns == 500
    assert set(C.PATHS) == set(C.PATH_LABELS)
    assert P.CLOCK_PERIOD_NS == 2


def test_doorbell_batching_wait():
    m = ClusterModel(_recs())
    # two warps on a QP: a submission each (146 + 20 + 146 ns) / 2 = 156 ns, 31 of them before
    # the 32nd rings; four: the ready CAS chain's 146 ns decides; one warp rings every time
    assert m.batch_wait_ns("ibgda", 2, 64) == pytest.approx(31 * 156)
    assert m.batch_wait_ns("ibgda", 4, 64) == pytest.approx(31 * 146)
    assert m.batch_wait_ns("ibgda", 2, 10) == pytest.approx(9 * 156)
    assert m.batch_wait_ns("ibgda", 1, 64) == 0 and m.batch_wait_ns("ibrc", 2, 64) == 0
    # the combine pays it (8 local experts on 4 QPs a source), the dispatch does not
    d0, c0 = m.moe_ns("ibgda", 4, qpp=8)
    d1, c1 = m.moe_ns("ibgda", 4, qpp=4)
    assert d0 == d1 and c1 - c0 == pytest.approx(31 * 156)
