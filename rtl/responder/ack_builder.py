"""ACK builder: acknowledgment requests -> one-beat RoCEv2 ACK/NAK frames (ICRC left as zeros)."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common.contexts import qp_bits
from rtl.common.headers import RoceAckHeader, be, drive_roce_headers
from rtl.common.stream import Pair
from rtl.common.tx_beat import TxBeat, SEGMENT as SEG

__all__ = ["AckRequest", "AckBuilder", "ACK_FRAME_LEN", "ATOMIC_ACK_FRAME_LEN"]

ACK_FRAME_LEN = F.OFF_EXT + F.AETH_LEN + F.ICRC_LEN     # 62: Eth/IPv4/UDP/BTH/AETH/ICRC
ATOMIC_ACK_FRAME_LEN = ACK_FRAME_LEN + F.ATOMIC_ACK_ETH_LEN     # 70: and the AtomicAckETH
_ACK_HDR = ACK_FRAME_LEN - F.ICRC_LEN                   # 58 header bytes


def AckRequest(num_qps):
    """One ACK or NAK to send (the fields of ``model.parse.build_response``).

    ``dmac``/``dip``/``dest_qp``: the requester (its MAC, IPv4 and QP number, BTH.DestQP);
    ``src_qpn``: the local (responder) QP, whose low 14 bits pick the UDP source port as
    on the transmit side (``QpContext.qpn`` in the model); ``psn``: BTH.PSN;
    ``syndrome``/``msn``: the AETH (``spec.formats.Aeth``); ``atomic``: an ATOMIC
    ACKNOWLEDGE, with ``orig`` in its AtomicAckETH; ``read``: no frame, the place of a READ's
    responses (a marker beat); ``counted``: that ATOMIC ACK or READ answers a new request,
    which holds a responder resource until then.
    """
    return data.StructLayout({
        "dmac":     unsigned(48),
        "dip":      unsigned(32),
        "dest_qp":  unsigned(24),
        "src_qpn":  unsigned(qp_bits(num_qps)),
        "psn":      unsigned(24),
        "syndrome": unsigned(8),
        "msn":      unsigned(24),
        "atomic":   unsigned(1),
        "orig":     unsigned(64),
        "read":     unsigned(1),
        "counted":  unsigned(1),
    })


class AckBuilder(wiring.Component):
    """Builds the ACK/NAK frames of one or two requests as one transmit beat.

    Each frame is ``model.parse.build_response``'s: Ethernet / IPv4 (checksum) / UDP /
    BTH (opcode ACKNOWLEDGE 0x11, AckReq clear, P_Key 0xFFFF) / AETH, 62 bytes with the 4
    ICRC bytes left as zeros for the ICRC inserter. Headers come from the transmit side's
    one header rule (``rtl.common.headers.drive_roce_headers``), so they match the packet builder's.
    Each beat holds whole frames: the first request's in lanes 0..61 (``nbytes`` =
    ``flen`` = 62, ``last`` = ``frame`` = 1, ``cpl_valid`` = 0) and, for a pair, the
    second's in lanes 64..125 (``sop_hi`` = ``end_hi`` = 1, ``flen_hi`` = 62): the
    responder sends up to two ACKs a cycle (WRITEs of 0 and 1 payload bytes arrive 1.02
    and 1.01 per cycle at line rate, each needing its own ACK), and two 62-byte frames
    fit one 128-byte beat. An ATOMIC ACKNOWLEDGE (``atomic``: opcode 0x12, the AETH and
    the AtomicAckETH, 70 bytes, ``model.read_atomic.build_atomic_ack``'s) comes alone in its
    transfer (``AtomicAckJoin``) and takes lanes 0..69 of its beat. A READ's place holder
    (``read``, alone in its transfer too) becomes a marker beat (``frame`` = 0), where
    ``ResponseMerge`` puts that READ's responses. Either, when ``counted``, carries
    ``answer`` and its QP in ``cpl.qpn`` (``cpl_valid`` clear), for the merge to say when
    the answer leaves. One transfer per cycle; the output is a
    register.

    Parameters
    ----------
    num_qps, num_cqs : the engine's QP and CQ counts (the ``TxBeat`` and ``AckRequest`` widths).

    Members
    -------
    requests : In(stream.Signature(Pair(AckRequest(num_qps))))
        One or two requests per transfer, in order.
    port_mac, port_ip : In
        The port's source MAC and IPv4 address.
    frames : Out(stream.Signature(TxBeat(num_qps, num_cqs)))
        One beat per transfer, one cycle after it is taken.
    """
    def __init__(self, *, num_qps, num_cqs):
        for name, value in (("num_qps", num_qps), ("num_cqs", num_cqs)):
            if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 1 << 24:
                raise ValueError(f"{name} must be an int in 2..2**24, not {value!r}")
        self.num_qps, self.num_cqs = num_qps, num_cqs
        super().__init__({
            "requests": In(stream.Signature(Pair(AckRequest(num_qps)))),
            "port_mac": In(48), "port_ip": In(32),
            "frames": Out(stream.Signature(TxBeat(num_qps, num_cqs))),
        })

    def elaborate(self, platform):
        m = Module()
        out = self.frames

        hdrs = []
        for k in range(2):
            req = self.requests.p.p[k]
            hdr = Signal(RoceAckHeader, name=f"hdr{k}")
            drive_roce_headers(m, hdr, dmac=req.dmac, smac=self.port_mac, sip=self.port_ip, dip=req.dip,
                               flen=Mux(req.atomic, ATOMIC_ACK_FRAME_LEN, ACK_FRAME_LEN), src_qpn=req.src_qpn,
                               opcode=Mux(req.atomic, F.Op.ATOMIC_ACK, F.Op.ACK), dqpn=req.dest_qp,
                               ackreq=0, psn=req.psn)
            m.d.comb += [hdr.aeth.syndrome.eq(be(req.syndrome, 1)), hdr.aeth.msn.eq(be(req.msn, 3))]
            hdrs.append(hdr)

        # One register stage: the 58 header bytes of each frame; the ICRC bytes and the rest
        # of the beat are zero and the other beat fields constant but for the pair flag.
        held = [Signal(RoceAckHeader, name=f"held{k}") for k in range(2)]
        two = Signal()
        atomic = Signal()
        marker = Signal()                          # a READ's place: a marker beat (frame = 0)
        orig = Signal(8 * F.ATOMIC_ACK_ETH_LEN)     # the AtomicAckETH, in wire order
        answer = Signal()                          # it answers a new READ or atomic of QP answer_qpn
        answer_qpn = Signal(qp_bits(self.num_qps))
        m.d.comb += self.requests.ready.eq(~out.valid | out.ready)
        with m.If(out.valid & out.ready):
            m.d.sync += out.valid.eq(0)
        with m.If(self.requests.valid & self.requests.ready):
            r0 = self.requests.p.p[0]
            m.d.sync += [atomic.eq(r0.atomic), marker.eq(r0.read), orig.eq(Mux(r0.atomic, be(r0.orig, F.ATOMIC_ACK_ETH_LEN), 0)),
                         answer.eq((r0.atomic | r0.read) & r0.counted), answer_qpn.eq(r0.src_qpn)]
            m.d.sync += [out.valid.eq(1), held[0].eq(hdrs[0]), two.eq(self.requests.p.second),
                         held[1].eq(Mux(self.requests.p.second, hdrs[1].as_value(), 0))]
        m.d.comb += [
            out.p.data.eq(held[0].as_value() | (orig << (8 * _ACK_HDR)) | (held[1].as_value() << (8 * SEG))),
            out.p.nbytes.eq(Mux(atomic, ATOMIC_ACK_FRAME_LEN, ACK_FRAME_LEN)), out.p.last.eq(1), out.p.frame.eq(~marker),
            out.p.flen.eq(Mux(atomic, ATOMIC_ACK_FRAME_LEN, ACK_FRAME_LEN)), out.p.sop_hi.eq(two), out.p.end_hi.eq(two),
            out.p.flen_hi.eq(Mux(two, ACK_FRAME_LEN, 0)),
            out.p.cpl_valid.eq(0), out.p.cpl.eq(0), out.p.answer.eq(answer), out.p.cpl.qpn.eq(Mux(answer, answer_qpn, 0)),
        ]
        return m
