"""Receive header parser: frame checks and one descriptor per received RoCEv2 frame."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from .headers import EthHeader, Ipv4Header, UdpHeader, BthHeader, ipv4_checksum
from .rx_beat import RxBeat, SEGMENT as SEG
from .rx_packet import RxDrop, RxPacket

__all__ = ["RxHeaderParser", "RxHeader", "KNOWN_OPCODES"]

BEAT = 128
IMMDT_LEN = 4                               # ImmDt extension header (SPEC section 5)
EXT_BYTES = F.RETH_LEN + IMMDT_LEN          # longest extension headers: WRITE ONLY_IMM
HDR_BYTES = F.OFF_EXT + EXT_BYTES           # 74 header bytes looked at
MIN_FRAME = F.OFF_BTH + F.BTH_LEN + F.ICRC_LEN   # 58: Ethernet+IPv4+UDP+BTH+ICRC
ETH_MIN_FRAME = 60                          # shortest Ethernet frame without FCS (padded up to it)
LEN_CAP = 1 << 17                           # frame byte counts saturate here (no IPv4 length matches)

# opcode -> (RETH, ImmDt, AETH) present: the opcodes model/rc.py knows.
KNOWN_OPCODES = {
    F.Op.WRITE_FIRST: (1, 0, 0), F.Op.WRITE_MIDDLE: (0, 0, 0), F.Op.WRITE_LAST: (0, 0, 0),
    F.Op.WRITE_LAST_IMM: (0, 1, 0), F.Op.WRITE_ONLY: (1, 0, 0), F.Op.WRITE_ONLY_IMM: (1, 1, 0),
    F.Op.ACK: (0, 0, 1),
}

# The first 74 bytes of a frame in wire order (byte 0 in bits [7:0]).
RxHeader = data.StructLayout({
    "eth": EthHeader, "ip": Ipv4Header, "udp": UdpHeader, "bth": BthHeader,
    "ext": data.ArrayLayout(unsigned(8), EXT_BYTES),
})
assert RxHeader.size == 8 * HDR_BYTES and HDR_BYTES <= SEG + BEAT


def _num(field):
    """The number a big-endian byte field holds (wire byte 0 is the most significant)."""
    v = Value.cast(field)
    n = len(v) // 8
    return Cat(*(v.word_select(n - 1 - i, 8) for i in range(n)))


class RxHeaderParser(wiring.Component):
    """Checks each received frame's headers and describes it, one beat per cycle.

    Beats pass from ``i`` to ``o`` unchanged and combinationally (for the payload
    buffer). The parser keeps the first 74 bytes of the frame in progress: from the
    beat it starts in when it starts at lane 0, or 64 bytes from lanes 64..127 of one
    beat and 10 from lanes 0..9 of the next when it starts at lane 64, so a beat may end
    one frame and start the next. On a frame's last beat the header, the frame length
    and ``icrc_ok`` are registered; the checks run on that register and the descriptor
    goes into a two-entry queue in front of ``packets`` (two cycles after the last beat).

    The checks and their order are those of ``model.rc.parse_frame``: shorter than 58
    bytes (BAD_LENGTH); EtherType not IPv4 or version/IHL byte not 0x45 (NOT_ROCE);
    IPv4 header checksum, the stored value against the one computed (BAD_IP_CHECKSUM);
    protocol not UDP, a fragment (MF or offset) or UDP destination port not 4791
    (NOT_ROCE); IPv4 total length or UDP length not matching the frame,
    after removing Ethernet padding from a 60-byte frame whose IPv4 length is shorter
    (BAD_LENGTH); ``icrc_ok`` clear (BAD_ICRC); P_Key not 0xFFFF (BAD_PKEY); opcode not
    accepted (BAD_OPCODE); the opcode's extension headers and PadCnt not fitting, or an
    ACK with bytes after its AETH (BAD_LENGTH). The frame length is counted exactly up
    to 128 KiB and saturates beyond, where no IPv4 length can match it.

    ``icrc_ok`` must be the verdict on the frame as ``parse_frame`` checks it: for a
    60-byte frame padded behind a shorter IPv4 packet, the ICRC in front of the padding.

    Only a frame's last beat needs a descriptor slot: it waits (so the input stalls)
    while the register and the queue hold three descriptors; other beats pass. The
    slot count is registered, so no ready depends on ``packets.ready``
    combinationally.

    Parameters
    ----------
    opcodes : iterable of int, or None
        BTH opcodes accepted (others are BAD_OPCODE), a subset of ``KNOWN_OPCODES``:
        RC RDMA WRITE FIRST/MIDDLE/LAST/LAST_IMM/ONLY/ONLY_IMM and ACK. None: all of them.

    Members
    -------
    i : In(stream.Signature(RxBeat()))
        Beats after the ICRC check (``icrc_ok`` valid on each frame's last beat), in the
        segment format of ``rtl/rx_beat.py``.
    o : Out(stream.Signature(RxBeat()))
        The same beats, unchanged and in order.
    packets : Out(stream.Signature(RxPacket()))
        One descriptor per frame, in frame order, after its last beat has left on ``o``.
    """
    def __init__(self, *, opcodes=None):
        if opcodes is None:
            opcodes = tuple(KNOWN_OPCODES)
        try:
            opcodes = tuple(opcodes)
        except TypeError:
            raise ValueError(f"opcodes must be an iterable of BTH opcodes or None, not {opcodes!r}") from None
        bad = [op for op in opcodes if not isinstance(op, int) or op not in KNOWN_OPCODES]
        if bad:
            raise ValueError(f"opcodes must be among {sorted(KNOWN_OPCODES)} (RC WRITE and ACK), "
                             f"not {bad!r}")
        if not opcodes:
            raise ValueError("opcodes must name at least one opcode")
        self.opcodes = frozenset(opcodes)
        super().__init__({
            "i": In(stream.Signature(RxBeat())),
            "o": Out(stream.Signature(RxBeat())),
            "packets": Out(stream.Signature(RxPacket())),
        })

    def elaborate(self, platform):
        m = Module()
        beat = self.i.p

        # ---- descriptor slots: the check register (s1) and a two-entry queue ------------
        s1_valid = Signal()
        s1_hdr = Signal(RxHeader)
        s1_len = Signal(18)             # frame bytes, exact up to LEN_CAP
        s1_icrc = Signal()
        q_level = Signal(range(3))
        q0 = Signal(RxPacket())         # head
        q1 = Signal(RxPacket())
        desc = Signal(RxPacket())       # s1's descriptor
        # Three slots keep one frame per cycle with a registered stall decision.
        room = Signal()
        m.d.comb += room.eq(s1_valid + q_level < 3)

        # ---- pass-through; only a last beat needs a slot ------------------------------
        go = Signal()
        m.d.comb += [
            go.eq(~beat.last | room),
            self.o.p.eq(beat),
            self.o.valid.eq(self.i.valid & go),
            self.i.ready.eq(self.o.ready & go),
        ]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)

        # ---- the current frame's header and length --------------------------------------
        count = Signal(range(LEN_CAP + 1))   # bytes of the current frame in earlier beats
        partial = Signal()                   # it started at lane 64 of the previous beat
        hdr_reg = Signal(8 * HDR_BYTES)
        before = Signal(range(LEN_CAP + 1))
        m.d.comb += before.eq(Mux(beat.sop, 0, count))
        hdr_cont = Signal(8 * HDR_BYTES)
        m.d.comb += hdr_cont.eq(Mux(partial, Cat(hdr_reg[:8 * SEG], beat.data[:8 * (HDR_BYTES - SEG)]),
                                    hdr_reg))
        hdr_now = Signal(8 * HDR_BYTES)
        m.d.comb += hdr_now.eq(Mux(beat.sop, beat.data[:8 * HDR_BYTES], hdr_cont))
        flen = Signal(18)
        m.d.comb += flen.eq(before + beat.nbytes)
        count_next = Signal(range(LEN_CAP + BEAT + 1))
        m.d.comb += count_next.eq(before + BEAT)

        with m.If(take):
            with m.If(beat.last):
                m.d.sync += [s1_hdr.eq(hdr_now), s1_len.eq(flen), s1_icrc.eq(beat.icrc_ok),
                             partial.eq(beat.sop_hi), count.eq(SEG)]
                with m.If(beat.sop_hi):
                    m.d.sync += hdr_reg[:8 * SEG].eq(beat.data[8 * SEG:])
            with m.Else():
                m.d.sync += [hdr_reg.eq(hdr_now), partial.eq(0),
                             count.eq(Mux(count_next > LEN_CAP, LEN_CAP, count_next))]

        # ---- checks on s1, in model.rc.parse_frame's order ------------------------------
        h = s1_hdr
        n = s1_len
        ip_v = h.ip.as_value()
        cs_off, cs_w = F.get_field(F.IPV4, "checksum")
        ip_zero = Signal(8 * F.IPV4_LEN)     # the IPv4 header with its checksum field zero
        m.d.comb += ip_zero.eq(Cat(ip_v[:8 * cs_off], C(0, 8 * cs_w), ip_v[8 * (cs_off + cs_w):]))
        csum = Signal(16)
        m.d.comb += csum.eq(ipv4_checksum(ip_zero))

        total_len, udp_len, flags_frag = Signal(16), Signal(16), Signal(16)
        opcode, flags, pkey = Signal(8), Signal(8), Signal(16)
        m.d.comb += [total_len.eq(_num(h.ip.total_len)), udp_len.eq(_num(h.udp.length)),
                     flags_frag.eq(_num(h.ip.flags_frag)), opcode.eq(_num(h.bth.opcode)),
                     flags.eq(_num(h.bth.flags)), pkey.eq(_num(h.bth.pkey))]

        short = Signal()
        eth_bad = Signal()
        csum_bad = Signal()
        udp_bad = Signal()
        m.d.comb += [
            short.eq(n < MIN_FRAME),
            eth_bad.eq((_num(h.eth.ethertype) != F.ETHERTYPE_IPV4) | (_num(h.ip.ver_ihl) != F.IPV4_VER_IHL)),
            csum_bad.eq(_num(h.ip.checksum) != csum),
            udp_bad.eq((_num(h.ip.proto) != F.IP_PROTO_UDP) | (flags_frag & 0x3FFF).any()
                       | (_num(h.udp.dport) != F.ROCEV2_UDP_PORT)),
        ]
        # A 60-byte frame may be a shorter packet padded to Ethernet's minimum: its end
        # is then where the IPv4 length says.
        pad = Signal()
        m.d.comb += pad.eq((n == ETH_MIN_FRAME) & (total_len < ETH_MIN_FRAME - F.OFF_IP))
        n_eff = Signal(18)
        m.d.comb += n_eff.eq(Mux(pad, total_len + F.OFF_IP, n))
        ip_len_bad = Signal()
        m.d.comb += ip_len_bad.eq((n_eff < MIN_FRAME) | (total_len + F.OFF_IP != n_eff)
                                  | (udp_len + F.OFF_UDP != n_eff))

        known, has_reth, has_imm, has_aeth = Signal(), Signal(), Signal(), Signal()
        with m.Switch(opcode):
            for op in sorted(self.opcodes):
                reth, imm, aeth = KNOWN_OPCODES[op]
                with m.Case(op):
                    m.d.comb += [known.eq(1), has_reth.eq(reth), has_imm.eq(imm), has_aeth.eq(aeth)]
        padcnt = Signal(2)
        m.d.comb += padcnt.eq(flags[4:6])
        ext_len = Signal(range(EXT_BYTES + 1))
        m.d.comb += ext_len.eq(Mux(has_reth, F.RETH_LEN, 0) + Mux(has_imm, IMMDT_LEN, 0)
                               + Mux(has_aeth, F.AETH_LEN, 0))
        need = Signal(range(MIN_FRAME + EXT_BYTES + 4))   # headers + ICRC + pad bytes
        m.d.comb += need.eq(MIN_FRAME + ext_len + padcnt)
        ext_bad = Signal()                   # an ACK carries nothing after the AETH
        m.d.comb += ext_bad.eq((n_eff < need) | (has_aeth & (n_eff != need)))

        with m.If(short):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Elif(eth_bad):
            m.d.comb += desc.drop.eq(RxDrop.NOT_ROCE)
        with m.Elif(csum_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_IP_CHECKSUM)
        with m.Elif(udp_bad):
            m.d.comb += desc.drop.eq(RxDrop.NOT_ROCE)
        with m.Elif(ip_len_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Elif(~s1_icrc):
            m.d.comb += desc.drop.eq(RxDrop.BAD_ICRC)
        with m.Elif(pkey != F.DEFAULT_PKEY):
            m.d.comb += desc.drop.eq(RxDrop.BAD_PKEY)
        with m.Elif(~known):
            m.d.comb += desc.drop.eq(RxDrop.BAD_OPCODE)
        with m.Elif(ext_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Else():
            m.d.comb += desc.drop.eq(RxDrop.NONE)

        # ---- descriptor fields ----------------------------------------------------------
        ext = h.ext.as_value()
        imm_bytes = Signal(8 * IMMDT_LEN)    # ImmDt follows the RETH when there is one
        m.d.comb += imm_bytes.eq(Mux(has_reth, ext[8 * F.RETH_LEN:8 * EXT_BYTES], ext[:8 * IMMDT_LEN]))
        payload_len = Signal(18)
        m.d.comb += payload_len.eq(n_eff - need)
        m.d.comb += [
            desc.opcode.eq(opcode), desc.se.eq(flags[7]), desc.padcnt.eq(padcnt),
            desc.dqpn.eq(_num(h.bth.dqpn)), desc.ackreq.eq(h.bth.ackreq[0][7]), desc.psn.eq(_num(h.bth.psn)),
            desc.has_reth.eq(has_reth), desc.has_imm.eq(has_imm), desc.has_aeth.eq(has_aeth),
            desc.reth.va.eq(Mux(has_reth, _num(ext[0:64]), 0)),
            desc.reth.rkey.eq(Mux(has_reth, _num(ext[64:96]), 0)),
            desc.reth.dma_len.eq(Mux(has_reth, _num(ext[96:128]), 0)),
            desc.imm.eq(Mux(has_imm, _num(imm_bytes), 0)),
            desc.aeth.syndrome.eq(Mux(has_aeth, ext[0:8], 0)),
            desc.aeth.msn.eq(Mux(has_aeth, _num(ext[8:32]), 0)),
            desc.payload_offset.eq(F.OFF_EXT + ext_len),
            desc.payload_len.eq(Mux(desc.drop == RxDrop.NONE, payload_len[:16], 0)),
            desc.frame_len.eq(Mux(n > 0xFFFF, 0xFFFF, n[:16])),
            desc.smac.eq(_num(h.eth.smac)), desc.sip.eq(_num(h.ip.sip)),
        ]

        # ---- s1 -> queue -> packets -------------------------------------------------------
        read = Signal()
        write = Signal()
        m.d.comb += [
            self.packets.valid.eq(q_level != 0), self.packets.p.eq(q0),
            read.eq(self.packets.valid & self.packets.ready),
            write.eq(s1_valid & (q_level != 2)),
        ]
        with m.If(write & ((q_level == 0) | (read & (q_level == 1)))):
            m.d.sync += q0.eq(desc)
        with m.Elif(read):
            m.d.sync += q0.eq(q1)
        with m.If(write & ~read & (q_level == 1)):
            m.d.sync += q1.eq(desc)
        m.d.sync += q_level.eq(q_level + write - read)
        with m.If(write):
            m.d.sync += s1_valid.eq(0)
        with m.If(take & beat.last):
            m.d.sync += s1_valid.eq(1)
        return m
