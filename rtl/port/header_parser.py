"""Receive header parser: frame checks and descriptors of received RoCEv2 frames."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common.headers import EthHeader, Ipv4Header, UdpHeader, BthHeader, from_be, ipv4_checksum
from rtl.common.rx_beat import RxBeat, QUARTER, QUARTERS
from rtl.common.rx_packet import RxDrop, RxPacket, RxPacketPair, INLINE_MAX
from spec.params import DATA_BYTES

__all__ = ["RxHeaderParser", "RxHeader", "KNOWN_OPCODES"]

BEAT = DATA_BYTES                           # 128 bytes
assert BEAT == QUARTERS * QUARTER
EXT_BYTES = F.MASKED_ATOMIC_ETH_LEN         # longest extension headers: a masked atomic request
assert max(F.RETH_LEN + F.IMMDT_LEN, F.AETH_LEN + F.ATOMIC_ACK_ETH_LEN, F.ATOMIC_ETH_LEN) <= EXT_BYTES
HDR_BYTES = F.OFF_EXT + EXT_BYTES           # 102 header bytes looked at
MIN_FRAME = F.OFF_BTH + F.BTH_LEN + F.ICRC_LEN   # 58: Ethernet+IPv4+UDP+BTH+ICRC
LEN_CAP = 1 << 17                           # frame byte counts saturate here (no IPv4 length matches)
LEN_BITS = 18                               # a frame length: up to LEN_CAP + BEAT
INLINE_LANE_BITS = (BEAT - 1).bit_length()  # an inline payload stays within one 128-byte line

# opcode -> (RETH, ImmDt, AETH, AtomicAckETH, AtomicETH, MaskedAtomicETH) present: the opcodes model/parse.py knows (spec.formats.EXT_HEADERS),
# and the SENDs of the two-sided verbs (model.parse parses them when asked to: its _SEND_EXT; an ImmDt on LAST_IMM and ONLY_IMM)
KNOWN_OPCODES = {op: tuple(int(e) for e in ext) for op, ext in F.EXT_HEADERS.items()}
KNOWN_OPCODES.update({op: (0, int(op in (F.Op.SEND_LAST_IMM, F.Op.SEND_ONLY_IMM)), 0, 0, 0, 0)
                      for op in (F.Op.SEND_FIRST, F.Op.SEND_MIDDLE, F.Op.SEND_LAST, F.Op.SEND_LAST_IMM, F.Op.SEND_ONLY,
                                 F.Op.SEND_ONLY_IMM)})

# The first 102 bytes of a frame in wire order (byte 0 in bits [7:0]).
RxHeader = data.StructLayout({
    "eth": EthHeader, "ip": Ipv4Header, "udp": UdpHeader, "bth": BthHeader,
    "ext": data.ArrayLayout(unsigned(8), EXT_BYTES),
})
# A header spans at most two beats (a frame starting at the last quarter takes 42 bytes
# of the next one: 70 here), and its length count has room for a beat beyond LEN_CAP.
assert RxHeader.size == 8 * HDR_BYTES and HDR_BYTES <= QUARTER + BEAT
assert LEN_CAP + BEAT < 1 << LEN_BITS


class _FrameCheck(wiring.Component):
    """The checks on one frame and its descriptor, combinational (the parser has two).

    Members
    -------
    hdr : In(RxHeader)
        The frame's first 102 bytes (those past its end are don't-care).
    length : In(18)
        The frame's bytes, exact up to ``LEN_CAP`` (may exceed it by less than a beat).
    icrc_ok : In(1)
        The ICRC verdict on the frame.
    port_mac, port_ip : In(48), In(32)
        The port's MAC and IPv4 address: the frame's destination must be these.
    desc : Out(RxPacket())
        The frame's descriptor.
    """
    def __init__(self, opcodes):
        self.opcodes = opcodes
        super().__init__({
            "hdr": In(RxHeader),
            "length": In(LEN_BITS),
            "icrc_ok": In(1),
            "port_mac": In(48), "port_ip": In(32),
            "desc": Out(RxPacket()),
        })

    def elaborate(self, platform):
        m = Module()
        h = self.hdr
        n = self.length
        desc = self.desc

        # ---- checks, in model.parse.parse_frame's order ------------------------------------
        ip_v = h.ip.as_value()
        cs_off, cs_w = F.get_field(F.IPV4, "checksum")
        ip_zero = Signal(8 * F.IPV4_LEN)     # the IPv4 header with its checksum field zero
        m.d.comb += ip_zero.eq(Cat(ip_v[:8 * cs_off], C(0, 8 * cs_w), ip_v[8 * (cs_off + cs_w):]))
        csum = Signal(16)
        m.d.comb += csum.eq(ipv4_checksum(ip_zero))

        total_len, udp_len, flags_frag = Signal(16), Signal(16), Signal(16)
        opcode, flags, pkey = Signal(8), Signal(8), Signal(16)
        m.d.comb += [total_len.eq(from_be(h.ip.total_len)), udp_len.eq(from_be(h.udp.length)),
                     flags_frag.eq(from_be(h.ip.flags_frag)), opcode.eq(from_be(h.bth.opcode)),
                     flags.eq(from_be(h.bth.flags)), pkey.eq(from_be(h.bth.pkey))]

        short = Signal()
        eth_bad = Signal()
        csum_bad = Signal()
        udp_bad = Signal()
        m.d.comb += [
            short.eq(n < MIN_FRAME),
            eth_bad.eq((from_be(h.eth.ethertype) != F.ETHERTYPE_IPV4) | (from_be(h.ip.ver_ihl) != F.IPV4_VER_IHL)),
            csum_bad.eq(from_be(h.ip.checksum) != csum),
            udp_bad.eq((from_be(h.ip.proto) != F.IP_PROTO_UDP) | (flags_frag & 0x3FFF).any()
                       | (from_be(h.udp.dport) != F.ROCEV2_UDP_PORT)),
        ]
        # A 60-byte frame may be a shorter packet padded to Ethernet's minimum: its end
        # is then where the IPv4 length says.
        pad = Signal()
        m.d.comb += pad.eq((n == F.ETH_MIN_FRAME) & (total_len < F.ETH_MIN_FRAME - F.OFF_IP))
        n_eff = Signal(LEN_BITS)
        m.d.comb += n_eff.eq(Mux(pad, total_len + F.OFF_IP, n))
        ip_len_bad = Signal()
        m.d.comb += ip_len_bad.eq((n_eff < MIN_FRAME) | (total_len + F.OFF_IP != n_eff)
                                  | (udp_len + F.OFF_UDP != n_eff))

        known, has_reth, has_imm, has_aeth, has_orig = Signal(), Signal(), Signal(), Signal(), Signal()
        has_atomic, has_masked = Signal(), Signal()
        with m.Switch(opcode):
            for op in sorted(self.opcodes):
                reth, imm, aeth, orig, atomic, masked = KNOWN_OPCODES[op]
                with m.Case(op):
                    m.d.comb += [known.eq(1), has_reth.eq(reth), has_imm.eq(imm), has_aeth.eq(aeth),
                                 has_orig.eq(orig), has_atomic.eq(atomic), has_masked.eq(masked)]
        padcnt = Signal(2)
        m.d.comb += padcnt.eq(flags[4:6])
        ext_len = Signal(range(EXT_BYTES + 1))
        m.d.comb += ext_len.eq(Mux(has_reth, F.RETH_LEN, 0) + Mux(has_imm, F.IMMDT_LEN, 0)
                               + Mux(has_aeth, F.AETH_LEN, 0) + Mux(has_orig, F.ATOMIC_ACK_ETH_LEN, 0)
                               + Mux(has_atomic, F.ATOMIC_ETH_LEN, 0) + Mux(has_masked, F.MASKED_ATOMIC_ETH_LEN, 0))
        need = Signal(range(MIN_FRAME + EXT_BYTES + 4))   # headers + ICRC + pad bytes
        m.d.comb += need.eq(MIN_FRAME + ext_len + padcnt)
        ext_bad = Signal()      # an ACK, READ REQUEST or atomic carries nothing after its headers (no payload)
        read_req, read_resp = Signal(), Signal()
        m.d.comb += [read_req.eq(known & (opcode == F.Op.READ_REQUEST)),
                     read_resp.eq(known & (opcode >= F.Op.READ_RESP_FIRST) & (opcode <= F.Op.READ_RESP_ONLY))]
        assert F.READ_RESPONSE_OPS == tuple(range(F.Op.READ_RESP_FIRST, F.Op.READ_RESP_ONLY + 1))
        m.d.comb += ext_bad.eq((n_eff < need) | (((has_aeth & ~read_resp) | has_atomic | has_masked | read_req)
                                                 & (n_eff != need)))

        with m.If(short):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Elif(eth_bad):
            m.d.comb += desc.drop.eq(RxDrop.NOT_ROCE)
        with m.Elif(csum_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_IP_CHECKSUM)
        with m.Elif(udp_bad):
            m.d.comb += desc.drop.eq(RxDrop.NOT_ROCE)
        with m.Elif((from_be(h.eth.dmac) != self.port_mac) | (from_be(h.ip.dip) != self.port_ip)):
            m.d.comb += desc.drop.eq(RxDrop.BAD_ADDRESS)
        with m.Elif(ip_len_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Elif(~self.icrc_ok):
            m.d.comb += desc.drop.eq(RxDrop.BAD_ICRC)
        with m.Elif(pkey != F.DEFAULT_PKEY):
            m.d.comb += desc.drop.eq(RxDrop.BAD_PKEY)
        with m.Elif(flags[0:4] != 0):
            m.d.comb += desc.drop.eq(RxDrop.BAD_VERSION)     # BTH TVer
        with m.Elif(~known):
            m.d.comb += desc.drop.eq(RxDrop.BAD_OPCODE)
        with m.Elif(ext_bad):
            m.d.comb += desc.drop.eq(RxDrop.BAD_LENGTH)
        with m.Else():
            m.d.comb += desc.drop.eq(RxDrop.NONE)

        # ---- descriptor fields ----------------------------------------------------------
        ext = h.ext.as_value()
        imm_bytes = Signal(8 * F.IMMDT_LEN)    # ImmDt follows the RETH when there is one
        m.d.comb += imm_bytes.eq(Mux(has_reth, ext[8 * F.RETH_LEN:8 * EXT_BYTES], ext[:8 * F.IMMDT_LEN]))
        payload_len = Signal(LEN_BITS)
        m.d.comb += payload_len.eq(n_eff - need)
        m.d.comb += [
            desc.opcode.eq(opcode), desc.se.eq(flags[7]), desc.padcnt.eq(padcnt),
            desc.dqpn.eq(from_be(h.bth.dqpn)), desc.ackreq.eq(h.bth.ackreq[0][7]), desc.psn.eq(from_be(h.bth.psn)),
            desc.has_reth.eq(has_reth), desc.has_imm.eq(has_imm), desc.has_aeth.eq(has_aeth),
            # an AtomicETH or MaskedAtomicETH starts with a VA and an R_Key too
            desc.reth.va.eq(Mux(has_reth | has_atomic | has_masked, from_be(ext[0:64]), 0)),
            desc.reth.rkey.eq(Mux(has_reth | has_atomic | has_masked, from_be(ext[64:96]), 0)),
            desc.reth.dma_len.eq(Mux(has_reth, from_be(ext[96:128]), 0)),
            desc.imm.eq(Mux(has_imm, from_be(imm_bytes), 0)),
            desc.aeth.syndrome.eq(Mux(has_aeth, ext[0:8], 0)),
            desc.aeth.msn.eq(Mux(has_aeth, from_be(ext[8:32]), 0)),
            desc.orig.eq(Mux(has_orig, from_be(ext[8 * F.AETH_LEN:8 * (F.AETH_LEN + F.ATOMIC_ACK_ETH_LEN)]), 0)),
            desc.has_atomic.eq(has_atomic | has_masked),
            desc.payload_offset.eq(F.OFF_EXT + ext_len),
            desc.payload_len.eq(Mux(desc.drop == RxDrop.NONE, payload_len[:16], 0)),
            desc.frame_len.eq(Mux(n > 0xFFFF, 0xFFFF, n[:16])),
            desc.smac.eq(from_be(h.eth.smac)), desc.sip.eq(from_be(h.ip.sip)),
        ]
        # The atomic's operands: IBTA's swap_add and compare (an 8-byte operand size), or
        # the MaskedAtomicETH's size and four operands (model.parse.parse_frame's ``atomic``).
        for k, (off, w) in enumerate(((12, 8), (20, 8))):
            with m.If(has_atomic):
                m.d.comb += desc.atomic.ops[k].eq(from_be(ext[8 * off:8 * (off + w)]))
        with m.If(has_atomic):
            m.d.comb += desc.atomic.log_size.eq(3)
        with m.If(has_masked):
            m.d.comb += desc.atomic.log_size.eq(ext[8 * 12:8 * 13])
            for k in range(4):
                m.d.comb += desc.atomic.ops[k].eq(from_be(ext[8 * (16 + 8 * k):8 * (24 + 8 * k)]))
        # A payload of 1..4 bytes behind a RETH (WRITE ONLY: 75..78-byte frames, up to
        # 1.01 a cycle) is in the header window already; it travels with the descriptor.
        va_lane = Signal(8)
        m.d.comb += va_lane.eq(from_be(ext[0:64])[:INLINE_LANE_BITS])
        m.d.comb += [
            desc.inline.eq((desc.drop == RxDrop.NONE) & has_reth & ~has_imm & (payload_len != 0)
                           & (payload_len <= INLINE_MAX) & (va_lane + payload_len <= 1 << INLINE_LANE_BITS)),
            desc.inline_data.eq(ext[8 * F.RETH_LEN:8 * (F.RETH_LEN + INLINE_MAX)]),
        ]
        return m


class RxHeaderParser(wiring.Component):
    """Checks each received frame's headers and describes it, one beat per cycle.

    Beats pass from ``i`` to ``o`` unchanged and combinationally (for the beat buffer).
    They are in the quarter format of ``rtl/common/rx_beat.py``: frames start at lane 0, 32, 64
    or 96, a quarter holds bytes of one frame at most, and a beat holds at most two frame
    starts and two frame ends, so the parser describes up to two frames per beat.

    Header capture: the first 102 bytes of a frame starting at quarter ``s`` are lanes
    ``32 s ..`` of the beat it starts in; for ``s`` = 1, 2 or 3 the beat holds only 96, 64
    or 32 of them and the rest (6, 38 or 70 bytes) come from lanes 0.. of the next beat. A
    frame that ends in the beat it starts in takes its header from that beat only (bytes
    past its end are don't-care: the length checks reject it before they matter). The
    header of the one frame that may run on into the next beat is kept in a register
    (completed there when it needs those bytes), with the count of its bytes so far.

    On a beat where frames end, the headers, lengths (bytes from the frame's start to
    its end, counted exactly up to 128 KiB and saturating beyond, where no IPv4 length
    can match) and ``icrc_ok`` bits of the one or two frames ending there are registered
    as a pair; the checks run on that register, twice (one copy of the check logic per
    frame), and the descriptor pair goes into a two-entry queue in front of ``packets``
    (two cycles after the beat).

    The checks and their order are those of ``model.parse.parse_frame``: shorter than 58
    bytes (BAD_LENGTH); EtherType not IPv4 or version/IHL byte not 0x45 (NOT_ROCE);
    IPv4 header checksum, the stored value against the one computed (BAD_IP_CHECKSUM);
    protocol not UDP, a fragment (MF or offset) or UDP destination port not 4791
    (NOT_ROCE); destination MAC or IPv4 address not ``port_mac``/``port_ip``
    (BAD_ADDRESS); IPv4 total length or UDP length not matching the frame,
    after removing Ethernet padding from a 60-byte frame whose IPv4 length is shorter
    (BAD_LENGTH); ``icrc_ok`` clear (BAD_ICRC); P_Key not 0xFFFF (BAD_PKEY); BTH TVer not 0 (BAD_VERSION); opcode not
    accepted (BAD_OPCODE); the opcode's extension headers and PadCnt not fitting, or an
    ACK with bytes after its AETH (BAD_LENGTH).

    ``icrc_ok`` must be the verdict on the frame as ``parse_frame`` checks it: for a
    60-byte frame padded behind a shorter IPv4 packet, the ICRC in front of the padding.

    Throughput: one beat per cycle, so two frame ends (two descriptors) per cycle, while
    ``packets`` and ``o`` are ready. Only a beat in which a frame ends needs a descriptor
    slot: it waits (so the input stalls) while the register and the queue hold three
    descriptor pairs; other beats pass. The slot count is registered, so no ready
    depends on ``packets.ready`` combinationally.

    Parameters
    ----------
    opcodes : iterable of int, or None
        BTH opcodes accepted (others are BAD_OPCODE), a subset of ``KNOWN_OPCODES``:
        RC RDMA WRITE FIRST/MIDDLE/LAST/LAST_IMM/ONLY/ONLY_IMM, SEND FIRST/MIDDLE/LAST/LAST_IMM/
        ONLY/ONLY_IMM, READ, atomics and the responses. None: all of them.

    Members
    -------
    i : In(stream.Signature(RxBeat()))
        Beats after the ICRC check (``icrc_ok[q]`` valid with ``eop[q]``).
    o : Out(stream.Signature(RxBeat()))
        The same beats, unchanged and in order.
    packets : Out(stream.Signature(RxPacketPair()))
        One transfer per beat in which at least one frame ends, after that beat has left
        on ``o``: the descriptors of the frames ending in it in frame order (``p[0]``,
        and ``p[1]`` with ``second`` when two ended).
    port_mac, port_ip : In(48), In(32)
        The port's MAC and IPv4 address (the control registers').
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
            raise ValueError(f"opcodes must be among {sorted(KNOWN_OPCODES)} (RC WRITE, READ REQUEST, ACK, ATOMIC ACK, atomics), "
                             f"not {bad!r}")
        if not opcodes:
            raise ValueError("opcodes must name at least one opcode")
        self.opcodes = frozenset(opcodes)
        super().__init__({
            "i": In(stream.Signature(RxBeat())),
            "o": Out(stream.Signature(RxBeat())),
            "packets": Out(stream.Signature(RxPacketPair())),
            "port_mac": In(48), "port_ip": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        beat = self.i.p
        sop, eop = beat.sop, beat.eop

        # ---- descriptor slots: the check register (s1) and a two-entry queue ------------
        s1_valid = Signal()
        s1_second = Signal()
        s1_hdr = [Signal(RxHeader, name=f"s1_hdr{k}") for k in range(2)]
        s1_len = [Signal(LEN_BITS, name=f"s1_len{k}") for k in range(2)]    # frame bytes
        s1_icrc = [Signal(name=f"s1_icrc{k}") for k in range(2)]
        q_level = Signal(range(3))
        q0 = Signal(RxPacketPair())     # head
        q1 = Signal(RxPacketPair())
        desc = Signal(RxPacketPair())   # s1's descriptors
        # Three slots keep one pair per cycle with a registered stall decision.
        room = Signal()
        m.d.comb += room.eq(s1_valid + q_level < 3)

        # ---- pass-through; only a beat with a frame end needs a slot --------------------
        ends = Signal()
        go = Signal()
        m.d.comb += [
            ends.eq(eop.any()),
            go.eq(~ends | room),
            self.o.p.eq(beat),
            self.o.valid.eq(self.i.valid & go),
            self.i.ready.eq(self.o.ready & go),
        ]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)

        # ---- where the frames ending in this beat start ----------------------------------
        # e[0]: quarter of the first end, e[1]: of the last (the second end, if any).
        # A frame ending in quarter e starts at the last start at or before e; with no
        # start there it is the frame carried over from earlier beats (only e[0] can be).
        e = [Signal(2, name="e0"), Signal(2, name="e1")]
        st = [Signal(name="st0"), Signal(name="st1")]            # it starts in this beat
        s = [Signal(2, name="start0"), Signal(2, name="start1")]  # at quarter s
        s_last = Signal(2)                                       # the last start
        second = Signal()
        for q in range(QUARTERS):
            with m.If(eop[QUARTERS - 1 - q]):
                m.d.comb += e[0].eq(QUARTERS - 1 - q)
            with m.If(eop[q]):
                m.d.comb += e[1].eq(q)
            with m.If(sop[q]):
                m.d.comb += s_last.eq(q)
            for k in range(2):
                with m.If(sop[q] & ((e[k] >= q) if q else 1)):       # (every end is at or after quarter 0)
                    m.d.comb += [st[k].eq(1), s[k].eq(q)]
        m.d.comb += second.eq((eop & (eop - 1))[:QUARTERS].any())
        # The frame that starts last runs on into the next beat.
        opens = Signal()
        m.d.comb += opens.eq(sop.any() & (~ends | (s_last > e[1])))

        # ---- headers ----------------------------------------------------------------------
        wide = Cat(beat.data, C(0, 8 * (QUARTER * (QUARTERS - 1) + HDR_BYTES - BEAT)))

        def header_at(start, name):
            """The header bytes of a frame starting at quarter ``start`` of this beat (from
            this beat only)."""
            v = Signal(8 * HDR_BYTES, name=name)
            with m.Switch(start):
                for q in range(QUARTERS):
                    with m.Case(q):
                        m.d.comb += v.eq(wide[8 * QUARTER * q:8 * (QUARTER * q + HDR_BYTES)])
            return v

        count = Signal(range(LEN_CAP + 1))  # bytes of the carried-over frame in earlier beats
        hdr_reg = Signal(8 * HDR_BYTES)     # its header as far as it arrived
        pend = Signal(2)                    # the quarter it started at, when that was in the last beat
        hdr_cont = Signal(8 * HDR_BYTES)    # its header with the bytes this beat adds
        m.d.comb += hdr_cont.eq(hdr_reg)
        for q in range(QUARTERS):
            kept = BEAT - QUARTER * q       # header bytes the start beat held
            if kept < HDR_BYTES:
                with m.If(pend == q):
                    m.d.comb += hdr_cont.eq(Cat(hdr_reg[:8 * kept], beat.data[:8 * (HDR_BYTES - kept)]))

        # ---- the frames ending here: header, length, ICRC verdict -------------------------
        hdr_end = [Signal(8 * HDR_BYTES, name=f"hdr_end{k}") for k in range(2)]
        len_end = [Signal(LEN_BITS, name=f"len_end{k}") for k in range(2)]
        icrc_end = [Signal(name=f"icrc_end{k}") for k in range(2)]
        for k in range(2):
            upto = Signal(range(BEAT + 1), name=f"upto{k}")      # lanes up to the frame's end
            m.d.comb += [
                upto.eq(QUARTER * e[k] + beat.ebytes[e[k]]),
                hdr_end[k].eq(Mux(st[k], header_at(s[k], f"hdr_start{k}"), hdr_cont)),
                len_end[k].eq(Mux(st[k], upto - QUARTER * s[k], count + upto)),
                icrc_end[k].eq(beat.icrc_ok.bit_select(e[k], 1)),
            ]

        # ---- the frame that runs on into the next beat -------------------------------------
        hdr_open = header_at(s_last, "hdr_open")
        count_next = Signal(range(LEN_CAP + BEAT + 1))
        m.d.comb += count_next.eq(count + BEAT)
        with m.If(take):
            with m.If(opens):
                m.d.sync += [count.eq(BEAT - QUARTER * s_last), hdr_reg.eq(hdr_open), pend.eq(s_last)]
            with m.Elif(~ends):
                m.d.sync += [count.eq(Mux(count_next > LEN_CAP, LEN_CAP, count_next)),
                             hdr_reg.eq(hdr_cont), pend.eq(0)]
            with m.If(ends):
                m.d.sync += s1_second.eq(second)
                for k in range(2):
                    m.d.sync += [s1_hdr[k].eq(hdr_end[k]), s1_len[k].eq(len_end[k]), s1_icrc[k].eq(icrc_end[k])]

        # ---- checks on s1, once per frame -------------------------------------------------
        for k in range(2):
            m.submodules[f"check{k}"] = ck = _FrameCheck(self.opcodes)
            m.d.comb += [ck.port_mac.eq(self.port_mac), ck.port_ip.eq(self.port_ip),
                         ck.hdr.eq(s1_hdr[k]), ck.length.eq(s1_len[k]), ck.icrc_ok.eq(s1_icrc[k]),
                         desc.p[k].eq(ck.desc)]
        m.d.comb += desc.second.eq(s1_second)

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
        with m.If(take & ends):
            m.d.sync += s1_valid.eq(1)
        return m
