"""Per-QP and per-CQ context layouts, held in ``lib.memory`` RAMs (never per-QP flip-flops)."""
from amaranth.hdl import unsigned
from amaranth.lib import data

__all__ = ["QpConfig", "QpDynamic", "QpEntry", "CqConfig", "CqEntry", "qp_bits", "cq_bits"]


def qp_bits(num_qps):
    return max(1, (num_qps - 1).bit_length())


def cq_bits(num_cqs):
    return max(1, (num_cqs - 1).bit_length())


def QpConfig(num_cqs):
    """What the CPU writes when it creates or modifies a QP."""
    return data.StructLayout({
        "sq_base":    unsigned(64),
        "log_depth":  unsigned(4),      # SQ depth = 2**log_depth WQEBBs
        "cqn":        unsigned(cq_bits(num_cqs)),
        "remote_qpn": unsigned(24),
        "dmac":       unsigned(48),
        "dip":        unsigned(32),
        "mtu":        unsigned(3),      # ibv_mtu code 1..5 (256..4096 bytes)
        "state":      unsigned(3),      # ibv_qp_state
        "weight":     unsigned(4),      # scheduler weight 1..15 (0 counts as 1)
        "uc":         unsigned(1),      # 0: RC (a WQE completes when acknowledged), 1: UC (when sent)
        "max_rd_atomic": unsigned(5),   # READs and atomics in flight at most (0, > 16: 16)
        "max_wqebbs": unsigned(5),      # largest WQE it posts, WQEBBs (0, > 16: 16): read past a cut
    })


# What the scheduler itself moves: producer index from doorbells, fetch index
# (WQEBBs handed to the WQE fetch), and whether the QP sits in the active queue.
# The consumer index and next PSN belong to the WQE parser (its own RAM).
QpDynamic = data.StructLayout({
    "pi":     unsigned(16),
    "fi":     unsigned(16),
    "queued": unsigned(1),
    # a woken QP's next burst at most this many WQEBBs, none read past them (0: no cap):
    # the room its READs and atomics have, so a burst is not fetched only to be dropped
    "cap":    unsigned(5),
    # parked by the parser (a WQE waits on its READs/atomics): not scheduled until woken
    "parked": unsigned(1),
    # no turn yet since the QP's create: its first is at most ``FIRST_TURN_WQEBBS``
    "first":  unsigned(1),
    # a turn at most this many WQEBBs (0: no bound): what its WQEs took to carry
    # ``TURN_BYTES`` of payload, as the WQE parser last saw (a hint, ``QpTurn``)
    "byte_turn": unsigned(8),
})


def QpEntry(num_cqs):
    return data.StructLayout({"cfg": QpConfig(num_cqs), "dyn": QpDynamic})


CqConfig = data.StructLayout({
    "base":      unsigned(64),
    "log_depth": unsigned(4),
    "collapsed": unsigned(1),
})

CqEntry = data.StructLayout({"cfg": CqConfig, "count": unsigned(24)})
