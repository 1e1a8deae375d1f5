"""Packet builder: messages -> RoCEv2 RDMA WRITE frames (ICRC left as zeros)."""
from amaranth.hdl import *
from amaranth.lib import data, wiring, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common.headers import RoceWriteHeader, be, drive_roce_headers
from rtl.common.records import Completion, PacketNote
from rtl.requester.message import GATHER_MORE, Message, MessageKind, first_segment_length
from rtl.common.tx_beat import TxBeat, SEGMENT as SEG
from spec.params import DATA_BYTES

__all__ = ["PacketBuilder", "MAX_PACKET_BEATS"]

BEAT = DATA_BYTES
# raw payload beats one packet can take: a 4096-byte MTU from an unaligned address
MAX_PACKET_BEATS = 4096 // BEAT + 1


class PacketBuilder(wiring.Component):
    """Splits each WRITE (or SEND) at the path MTU and builds its frames.

    Packets: ONLY (length <= MTU) or FIRST, MIDDLE..., LAST, one PSN each, the RETH
    on a WRITE's FIRST/ONLY (a SEND has none), the ImmDt (``imm``) on the LAST/ONLY of a
    message with ``has_imm`` (the _IMM opcodes), AckReq on LAST/ONLY. The payload comes from the payload fetch
    (raw beats, the data starting at ``addr % 128``) or from the WQE (inline beats,
    the data starting at ``addr``, its offset in the WQE: 36, more when resumed). An aligner cuts the raw beats into chunks at packet
    and segment boundaries and a packer shifts each chunk behind the header, so every frame
    leaves as full 128-byte beats and a partial last beat; behind the payload the IBTA pad
    (PadCnt zero bytes up to a multiple of 4, in the BTH) and 4 zero bytes for the ICRC,
    which the next block fills in.

    A gather list (``nseg`` segments after the first) arrives segment after segment, each
    segment's first raw beat holding its data from its ``addr % 128``: each chunk is
    ``min(packet left, beat left, segment left)``; at a segment's end its last raw beat is
    popped and the next segment starts at its offset (a packet may span segments, a
    segment packets). The aligner keeps ``lim``, the bytes to the nearer boundary, and the
    segment's bytes past the packet's (``seg_over``, fixed within both), so that the chunk
    is cut as for one segment.

    A READ message is one header-only READ REQUEST (RETH: ``raddr``, ``rkey``, ``length``),
    AckReq set; its completion and its ``sent`` note carry the PSN of its last response
    (``psn`` + ceil(``length`` / MTU) - 1), which the ACK timer and the response checker wait for.

    An ATOMIC message is one header-only packet: BTH opcode ``wire_op`` with the IBTA
    AtomicETH (FETCH_ADD / COMPARE_SWAP) or this engine's MaskedAtomicETH (the masked and
    4-byte forms, docs/interfaces.md), its operands taken from the WQE's first beat on
    ``inline`` (a cycle of its own), AckReq set.

    A READ_RESPONSE message (the responder's answer to a READ REQUEST) is split and packed
    as a WRITE is, its payload fetched from ``addr``, as READ RESPONSE FIRST/MIDDLE/LAST/ONLY
    packets whose FIRST, LAST and ONLY carry an AETH (ACK, MSN ``rkey``) where a WRITE has its
    RETH, AckReq clear (``model.read_atomic.build_read_responses``).

    NOP and ERROR messages produce a marker beat (``frame = 0``) that carries their
    completion through the same ordered path, so CQEs never overtake packets.

    Parameters
    ----------
    num_qps, num_cqs : int
    merge_messages : bool
        Whether a message's first packet may start at lane 64 behind the previous message's
        last frame. The responder's instance does not: each READ's responses then begin a
        beat of their own, so its frames can be put in order among the ACKs per READ.
    back_to_back : bool
        Whether every frame, once its first beat has left, sends its other beats in the
        cycles right after (MAC TX would underrun on a gap inside a frame). Two rules do it:
        a packet starts only when the payload buffer holds every raw beat it takes
        (``payload_level`` >= ceil((offset + length) / 128)), as bursts of one message may
        arrive with other reads' beats between them; and a last beat of at most 64 bytes is
        held for the next packet's lane 64 only when no beat of its frame has left yet
        (else it leaves in the cycle it is packed: held, it would follow a cycle late). For
        messages of one segment from the payload buffer (the responder's READ responses).
        Without it (the requester's instance, as ``model.cycle_model`` follows it) a frame
        goes on as its payload arrives.
    buffer_beats : int
        With ``back_to_back``: the payload buffer's depth, at least ``MAX_PACKET_BEATS``
        (a whole packet must fit).

    Members
    -------
    messages : In(stream.Signature(Message))
    payload, inline : In(stream.Signature(1024))
    payload_level : In(range(buffer_beats + 1))
        With ``back_to_back`` only: the beats in the payload buffer (``PayloadFetch.level``).
    port_mac, port_ip : In
    frames : Out(stream.Signature(TxBeat))
    sent : Out(PacketNote)
        Strobe when an RC QP's packet has been packed (its last bytes out or held), with
        its PSN: for the completion tracker's ACK timer.
    """
    def __init__(self, *, num_qps, num_cqs, merge_messages=True, back_to_back=False, buffer_beats=0):
        self.num_qps, self.num_cqs, self.merge_messages = num_qps, num_cqs, bool(merge_messages)
        self.back_to_back = bool(back_to_back)
        if self.back_to_back and (not isinstance(buffer_beats, int) or buffer_beats < MAX_PACKET_BEATS):
            raise ValueError(f"back_to_back needs a payload buffer of at least {MAX_PACKET_BEATS} beats "
                             f"(a whole packet), not {buffer_beats!r}")
        members = {
            "messages": In(stream.Signature(Message(num_qps, num_cqs))),
            "payload": In(stream.Signature(8 * BEAT)),
            "inline": In(stream.Signature(8 * BEAT)),
            "port_mac": In(48), "port_ip": In(32),
            "frames": Out(stream.Signature(TxBeat(num_qps, num_cqs))),
            "sent": Out(PacketNote(num_qps)),
        }
        if self.back_to_back:
            members["payload_level"] = In(range(buffer_beats + 1))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        msg = Signal.like(self.messages.p)
        out = self.frames

        mtu = Signal(13)
        m.d.comb += mtu.eq(128 << msg.cfg.mtu)
        msg_left = Signal(32)        # payload bytes of the message not yet packed
        pkt_left = Signal(13)        # payload bytes of the current packet not yet packed
        pkt_len = Signal(13)
        pkt_first = Signal()         # first packet of the message
        pkt_start = Signal()         # no byte of the current packet packed yet
        opened = Signal()            # back_to_back: a beat of the current packet has left
        psn = Signal(24)
        pos = Signal(range(BEAT))    # read position in the current raw beat
        # Segments: the current one's bytes past the packet's end (negative: it ends first),
        # the bytes to the nearer end (the chunk's limit), which ends there; the segments after
        lim = Signal(13)
        lim_pkt, lim_seg = Signal(), Signal()
        seg_over = Signal(signed(33))
        seg_q = Signal(data.ArrayLayout(data.StructLayout({"off": unsigned(7), "len": unsigned(31)}), GATHER_MORE))
        seg_qn = Signal(2)

        def set_limits(pkt_bytes, seg_bytes):
            # a packet or a segment (or both) starts: ``pkt_bytes`` of the packet, ``seg_bytes`` of the segment
            over = Signal(signed(33))
            m.d.comb += over.eq(seg_bytes - pkt_bytes)
            m.d.sync += [seg_over.eq(over), lim.eq(Mux(over < 0, seg_bytes, pkt_bytes)),
                         lim_pkt.eq(over >= 0), lim_seg.eq(over <= 0)]

        def next_segment():
            m.d.sync += [seg_qn.eq(seg_qn - 1), *[seg_q[i].eq(seg_q[i + 1]) for i in range(GATHER_MORE - 1)]]

        # ---- header of the current packet --------------------------------------------
        is_last_pkt = Signal()       # registered at each packet's start
        rest = Signal(32)            # message bytes after the current packet
        opcode = Signal(8)
        atomic = Signal()
        m.d.comb += atomic.eq(msg.kind == MessageKind.ATOMIC)
        masked = Signal()
        m.d.comb += masked.eq((msg.wire_op == F.Op.MASKED_FETCH_ADD) | (msg.wire_op == F.Op.MASKED_COMPARE_SWAP))
        rresp = Signal()             # a READ RESPONSE packet (the responder's instance)
        m.d.comb += rresp.eq(msg.kind == MessageKind.READ_RESPONSE)
        read = Signal()              # a READ REQUEST
        m.d.comb += read.eq(msg.kind == MessageKind.READ)
        read_last = Signal(24)       # a READ's last response PSN (its completion's, and the sent note's)
        middle = Signal()
        m.d.comb += middle.eq(~pkt_first & ~is_last_pkt)
        with m.If(atomic):
            m.d.comb += opcode.eq(msg.wire_op)
        with m.Elif(read):
            m.d.comb += opcode.eq(F.Op.READ_REQUEST)
        with m.Elif(rresp):
            m.d.comb += opcode.eq(Mux(pkt_first, Mux(is_last_pkt, F.Op.READ_RESP_ONLY, F.Op.READ_RESP_FIRST),
                                      Mux(is_last_pkt, F.Op.READ_RESP_LAST, F.Op.READ_RESP_MIDDLE)))
        # WRITE, WRITE with immediate, SEND: the SEND opcodes are the WRITE ones less 6
        # (IBTA: FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM in both rows), the _IMM one
        # the plain one plus 1
        imm_here = Signal()          # this packet carries the ImmDt (a message's last)
        m.d.comb += imm_here.eq(msg.has_imm & is_last_pkt)
        assert F.Op.WRITE_FIRST - F.Op.SEND_FIRST == 6 and F.Op.WRITE_ONLY_IMM - F.Op.SEND_ONLY_IMM == 6
        assert F.Op.WRITE_LAST_IMM == F.Op.WRITE_LAST + 1 and F.Op.WRITE_ONLY_IMM == F.Op.WRITE_ONLY + 1
        write_op = Signal(8)
        with m.If(pkt_first & is_last_pkt):
            m.d.comb += write_op.eq(F.Op.WRITE_ONLY)
        with m.Elif(pkt_first):
            m.d.comb += write_op.eq(F.Op.WRITE_FIRST)
        with m.Elif(is_last_pkt):
            m.d.comb += write_op.eq(F.Op.WRITE_LAST)
        with m.Else():
            m.d.comb += write_op.eq(F.Op.WRITE_MIDDLE)
        with m.If(~atomic & ~read & ~rresp):
            m.d.comb += opcode.eq(write_op + imm_here - Mux(msg.send, 6, 0))
        reth = Signal()              # the packet carries a RETH
        m.d.comb += reth.eq(read | (pkt_first & ~msg.send))
        hlen = Signal(8)
        m.d.comb += hlen.eq(Mux(atomic, F.OFF_EXT + Mux(masked, F.MASKED_ATOMIC_ETH_LEN, F.ATOMIC_ETH_LEN),
                                Mux(rresp, F.OFF_EXT + Mux(middle, 0, F.AETH_LEN),
                                    Mux(reth, F.HDR_LEN_RETH, F.HDR_LEN_NO_RETH) + Mux(imm_here, F.IMMDT_LEN, 0))))
        # The IBTA pad: a packet's payload is followed by PadCnt zero bytes up to a multiple
        # of 4 (only a message's last packet can need it: the others are an MTU long). The
        # packer reserves them behind the payload with the ICRC's 4, as zeros.
        pad = Signal(2)
        m.d.comb += pad.eq(-pkt_len)
        tail = Signal(range(F.ICRC_LEN + 4))        # zero bytes after a packet's last chunk
        m.d.comb += tail.eq(F.ICRC_LEN + pad)
        flen = Signal(16)
        m.d.comb += flen.eq(hlen + pkt_len + tail)

        hdr = Signal(RoceWriteHeader)
        drive_roce_headers(m, hdr, dmac=msg.cfg.dmac, smac=self.port_mac, sip=self.port_ip, dip=msg.cfg.dip,
                           flen=flen, src_qpn=msg.qpn, opcode=opcode, dqpn=msg.cfg.remote_qpn,
                           ackreq=Mux(is_last_pkt & ~rresp, 0x80, 0), psn=psn,
                           flags=(pad << F.BTH_PADCNT_SHIFT)
                           | Mux(msg.se & is_last_pkt & (msg.send | msg.has_imm) & ~atomic & ~read & ~rresp, F.BTH_SE, 0))
        m.d.comb += [
            hdr.reth.va.eq(be(msg.raddr, 8)), hdr.reth.rkey.eq(be(msg.rkey, 4)),
            hdr.reth.dma_len.eq(be(msg.length, 4)),
        ]
        # The atomic's extension header from the WQE's operand bytes (32.. of the WQE, all
        # big-endian there and on the wire): IBTA swap_add, compare (0 for FETCH_ADD); masked
        # log_size, 3 reserved bytes, four 8-byte operands (a 4-byte one in the low half,
        # the ones a form does not have 0)
        aops = Signal(8 * 32)                    # WQE bytes 32..63
        ext = Signal(8 * F.MASKED_ATOMIC_ETH_LEN)
        ibta_ext = Cat(be(msg.raddr, 8), be(msg.rkey, 4), aops[:64],
                       Mux(msg.wire_op == F.Op.COMPARE_SWAP, aops[64:128], 0))
        n_ops = Mux(msg.wire_op == F.Op.MASKED_COMPARE_SWAP, 4, 2)
        ops = []
        for i in range(4):
            op = Mux(msg.size8, aops[64 * i:64 * (i + 1)] if i < 4 else 0, Cat(Const(0, 32), aops[32 * i:32 * (i + 1)]))
            ops.append(Mux(i < n_ops, op, 0))
        masked_ext = Cat(be(msg.raddr, 8), be(msg.rkey, 4), be(Mux(msg.size8, 3, 2), 1), Const(0, 24), *ops)
        m.d.comb += ext.eq(Mux(masked, masked_ext, ibta_ext))
        hdr_bytes = Signal(8 * BEAT)
        aeth = Cat(Const(F.Aeth.ACK, 8), be(msg.rkey[:24], 3))      # a READ RESPONSE's: ACK, the MSN
        with m.If(atomic):
            m.d.comb += hdr_bytes.eq(Cat(hdr.as_value()[:8 * F.OFF_EXT], ext))
        with m.Elif(rresp & ~middle):
            m.d.comb += hdr_bytes.eq(Cat(hdr.as_value()[:8 * F.OFF_EXT], aeth))
        with m.Elif(rresp):
            m.d.comb += hdr_bytes.eq(hdr.as_value()[:8 * F.HDR_LEN_NO_RETH])
        with m.Elif(reth):           # (a resumed READ asks again with a RETH)
            m.d.comb += hdr_bytes.eq(Cat(hdr.as_value(), Mux(imm_here, msg.imm, 0)))
        with m.Else():
            m.d.comb += hdr_bytes.eq(Cat(hdr.as_value()[:8 * F.HDR_LEN_NO_RETH], Mux(imm_here, msg.imm, 0)))

        # ---- aligner: next chunk of the current packet ---------------------------------
        raw_valid = Signal()
        raw_data = Signal(8 * BEAT)
        raw_ready = Signal()
        with m.If(msg.inline):
            m.d.comb += [raw_valid.eq(self.inline.valid), raw_data.eq(self.inline.p),
                         self.inline.ready.eq(raw_ready)]
        with m.Else():
            m.d.comb += [raw_valid.eq(self.payload.valid), raw_data.eq(self.payload.p),
                         self.payload.ready.eq(raw_ready)]
        avail = Signal(range(BEAT + 1))
        m.d.comb += avail.eq(BEAT - pos)
        n = Signal(range(BEAT + 1))
        m.d.comb += n.eq(Mux(lim < avail, lim, avail))
        chunk = Signal(8 * BEAT)
        ones = Const((1 << (8 * BEAT)) - 1, 8 * BEAT)
        m.d.comb += chunk.eq((raw_data >> (pos * 8)) & (ones >> ((BEAT - n) * 8).as_unsigned()))
        at_lim = Signal()            # the chunk reaches the nearer end ...
        m.d.comb += at_lim.eq(n == lim)
        chunk_last = Signal()        # ... the packet's
        m.d.comb += chunk_last.eq(at_lim & lim_pkt)
        seg_end = Signal()           # ... the segment's (at the message's end too)
        m.d.comb += seg_end.eq(at_lim & lim_seg)

        # ---- held tail -------------------------------------------------------------------
        # A packet whose last beat has at most 64 bytes leaves that beat in ``hold``; the
        # next packet's header is packed behind it at lane 64 when its first chunk is
        # there in the next cycle and fills the beat, else the tail goes out alone.
        held = Signal()
        hold = Signal(8 * SEG)
        hold_n = Signal(range(SEG + 1))
        hold_flen = Signal(16)
        hold_cpl_valid = Signal()
        hold_cpl = Signal(Completion(self.num_qps, self.num_cqs))

        # ---- packer ---------------------------------------------------------------------------
        has = Signal()               # the current chunk's data is here (or none is needed)
        need_raw = pkt_left != 0
        if self.back_to_back:
            # a packet's first chunk waits until the buffer holds all the raw beats the packet
            # takes (from the head beat, read from ``pos``): then its beats follow back to back
            whole = Signal()
            m.d.comb += [whole.eq(self.payload_level >= ((pos + pkt_left + (BEAT - 1)) >> (BEAT - 1).bit_length())),
                         has.eq(~need_raw | (raw_valid & (~pkt_start | whole)))]
        else:
            m.d.comb += has.eq(~need_raw | raw_valid)
        merge = Signal()             # this cycle packs the packet's first chunk behind the held tail
        m.d.comb += merge.eq(held & pkt_start & has & (flen > SEG + F.ICRC_LEN)
                             & (~pkt_first if not self.merge_messages else 1)
                             & (SEG + hlen + n + Mux(chunk_last, tail, 0) >= BEAT))
        # A packet started at lane 64 carries up to 64 + 70 header bytes ahead of its
        # payload, so the residual may exceed a beat (at most 138 bytes, steady).
        residual = Signal(16 * BEAT)
        rcount = Signal(range(2 * BEAT))
        base = Signal(16 * BEAT)
        base_count = Signal(range(2 * BEAT))
        with m.If(~pkt_start):
            m.d.comb += [base.eq(residual), base_count.eq(rcount)]
        with m.Elif(merge):
            m.d.comb += [base.eq(hold | (hdr_bytes << (8 * SEG))), base_count.eq(SEG + hlen)]
        with m.Else():
            m.d.comb += [base.eq(hdr_bytes), base_count.eq(hlen)]
        combined = Signal(24 * BEAT)
        m.d.comb += combined.eq(base | (chunk << (base_count * 8)))
        total = Signal(range(3 * BEAT + F.ICRC_LEN + 4))
        m.d.comb += total.eq(base_count + n + Mux(chunk_last, tail, 0))

        # Flush: bytes of a finished packet still to send.
        flush = Signal(16 * BEAT)
        flush_left = Signal(range(2 * BEAT + F.ICRC_LEN + 4))

        cur_cpl = Signal(Completion(self.num_qps, self.num_cqs))
        m.d.comb += [
            cur_cpl.qpn.eq(msg.qpn), cur_cpl.cqn.eq(msg.cfg.cqn), cur_cpl.index.eq(msg.index),
            cur_cpl.byte_cnt.eq(Mux((msg.kind == MessageKind.WRITE) | atomic | read, msg.length, 0)),
            cur_cpl.error.eq(msg.kind == MessageKind.ERROR),
            cur_cpl.psn.eq(Mux(read, read_last, Mux((msg.kind == MessageKind.WRITE) | atomic, psn, psn - 1))),
            cur_cpl.uc.eq(msg.cfg.uc),
            cur_cpl.next_index.eq(msg.next_index), cur_cpl.syndrome.eq(msg.syndrome), cur_cpl.opcode.eq(msg.opcode),
            out.p.cpl.eq(cur_cpl), out.p.flen.eq(flen),
        ]
        msg_cpl = Signal()
        m.d.comb += msg_cpl.eq(msg.signaled | (msg.kind == MessageKind.ERROR))

        def hold_tail(data, count):
            m.d.sync += [held.eq(1), hold.eq(data[:8 * SEG]), hold_n.eq(count), hold_flen.eq(flen),
                         hold_cpl_valid.eq(msg_cpl & is_last_pkt), hold_cpl.eq(cur_cpl)]

        def emit_held():
            # the held tail alone, as its frame's last beat
            m.d.comb += [out.valid.eq(1), out.p.frame.eq(1), out.p.data.eq(hold), out.p.last.eq(1),
                         out.p.nbytes.eq(hold_n), out.p.flen.eq(hold_flen),
                         out.p.cpl_valid.eq(hold_cpl_valid), out.p.cpl.eq(hold_cpl)]
            with m.If(out.ready):
                m.d.sync += held.eq(0)

        def take_message():
            # Load the next descriptor; called in MESSAGE and in the cycle a message's
            # last beat leaves, so back-to-back one-beat frames leave one per cycle.
            m.d.comb += self.messages.ready.eq(1)
            m.next = "MESSAGE"
            with m.If(self.messages.valid):
                p = self.messages.p
                first_len = Mux(p.length <= (128 << p.cfg.mtu), p.length, 128 << p.cfg.mtu)
                set_limits(first_len, first_segment_length(p))
                m.d.sync += [seg_q.eq(Cat(*[Cat(s.addr[:7], s.len) for s in p.segs])), seg_qn.eq(p.nseg)]
                m.d.sync += [
                    msg.eq(p), msg_left.eq(p.length), pkt_len.eq(first_len), pkt_left.eq(first_len),
                    rest.eq(p.length - first_len), is_last_pkt.eq(p.length == first_len),
                    pkt_first.eq(~p.resume), pkt_start.eq(1), psn.eq(p.psn),
                    pos.eq(p.addr[:7]),          # inline: the data's offset in the WQE (parser)
                ]
                if self.back_to_back:
                    m.d.sync += opened.eq(0)
                with m.If((p.kind == MessageKind.WRITE) | (p.kind == MessageKind.READ_RESPONSE)):
                    m.next = "PACKET"
                with m.Elif(p.kind == MessageKind.ATOMIC):
                    # one packet without payload (length is the operand size, for the CQE)
                    m.d.sync += [msg_left.eq(0), pkt_len.eq(0), pkt_left.eq(0), rest.eq(0), is_last_pkt.eq(1)]
                    set_limits(0, 0)
                    m.next = "ATOMIC"
                with m.Elif(p.kind == MessageKind.READ):
                    # one READ REQUEST without payload (length is the READ's, in its RETH and
                    # CQE); its responses take a PSN each, ceil(length / MTU), at least one
                    m.d.sync += [msg_left.eq(0), pkt_len.eq(0), pkt_left.eq(0), rest.eq(0), is_last_pkt.eq(1),
                                 read_last.eq(p.psn)]
                    set_limits(0, 0)
                    with m.Switch(p.cfg.mtu):
                        for code in range(1, 6):
                            with m.Case(code):
                                m.d.sync += read_last.eq(p.psn + ((p.length - 1) >> (code + 7))[:24])
                        with m.Default():
                            m.d.sync += read_last.eq(p.psn + ((p.length - 1) >> 12)[:24])
                    with m.If(p.length == 0):
                        m.d.sync += read_last.eq(p.psn)
                    m.next = "PACKET"
                with m.Elif((p.kind == MessageKind.DUMP) & (p.length != 0)):
                    m.next = "DUMP"
                with m.Elif(p.signaled | (p.kind == MessageKind.ERROR)):
                    m.next = "MARKER"

        def next_packet():
            # after the last chunk of a packet has been packed
            m.d.comb += [self.sent.valid.eq(~msg.cfg.uc), self.sent.qpn.eq(msg.qpn),
                         self.sent.psn.eq(Mux(read, read_last, psn))]
            with m.If(is_last_pkt):
                take_message()
            with m.Else():
                nxt = Mux(rest <= mtu, rest, mtu)
                # the segment goes on past the packet, or (both ended) the next one starts
                set_limits(nxt, Mux(lim_seg, seg_q[0].len, seg_over))
                with m.If(lim_seg):
                    next_segment()
                m.d.sync += [pkt_first.eq(0), psn.eq(psn + 1), pkt_start.eq(1),
                             pkt_len.eq(nxt), pkt_left.eq(nxt), rest.eq(rest - nxt),
                             is_last_pkt.eq(rest - nxt == 0)]
                if self.back_to_back:
                    m.d.sync += opened.eq(0)
                m.next = "PACKET"

        with m.FSM():
            with m.State("MESSAGE"):
                with m.If(held):
                    emit_held()
                take_message()
            with m.State("MARKER"):
                # completions stay in order: a held tail goes first
                with m.If(held):
                    emit_held()
                with m.Else():
                    m.d.comb += [out.valid.eq(1), out.p.frame.eq(0), out.p.last.eq(1), out.p.cpl_valid.eq(1)]
                    with m.If(out.ready):
                        take_message()
            with m.State("ATOMIC"):
                # the operands: the WQE's first beat, from the inline queue
                with m.If(held):
                    emit_held()
                m.d.comb += self.inline.ready.eq(1)
                with m.If(self.inline.valid):
                    m.d.sync += aops.eq(self.inline.p[8 * 32:8 * 64])
                    m.next = "PACKET"
            with m.State("DUMP"):
                # NVSHMEM's consistency point: its local read's beats arrive (in order with
                # every payload read before it) and are dropped; then its CQE, if signaled
                m.d.comb += self.payload.ready.eq(1)
                with m.If(self.payload.valid):
                    m.d.sync += [pos.eq(0), msg_left.eq(msg_left - Mux(msg_left < avail, msg_left, avail))]
                    with m.If(msg_left <= avail):
                        with m.If(msg.signaled):
                            m.next = "MARKER"
                        with m.Else():
                            take_message()
            with m.State("PACKET"):
                with m.If(held & pkt_start & ~merge):
                    emit_held()
                with m.Else():
                    emit = Signal()
                    m.d.comb += emit.eq(total >= BEAT)
                    hold_now = Signal()
                    if self.back_to_back:
                        # held with its frame's earlier beats gone, the tail would leave a
                        # cycle after them: MAC TX underruns; it goes now, as the last beat
                        m.d.comb += hold_now.eq(chunk_last & (total <= SEG) & ~opened)
                    else:
                        m.d.comb += hold_now.eq(chunk_last & (total <= SEG))
                    fires = Signal()
                    m.d.comb += fires.eq(emit | (chunk_last & ~hold_now))
                    m.d.comb += [out.p.frame.eq(1), out.p.data.eq(combined[:8 * BEAT])]
                    with m.If(has):
                        m.d.comb += out.valid.eq(fires)
                        with m.If(merge):
                            # the held tail ends its frame in lanes 0..63, this packet starts at 64
                            m.d.comb += [out.p.last.eq(1), out.p.nbytes.eq(hold_n), out.p.flen.eq(hold_flen),
                                         out.p.sop_hi.eq(1), out.p.flen_hi.eq(flen),
                                         # by definition; 0 here, as only packets over 68 bytes merge
                                         out.p.end_hi.eq(flen <= SEG),
                                         out.p.cpl_valid.eq(hold_cpl_valid), out.p.cpl.eq(hold_cpl)]
                        with m.Elif(chunk_last & (total <= BEAT)):
                            m.d.comb += [out.p.last.eq(1), out.p.nbytes.eq(total),
                                         out.p.cpl_valid.eq(msg_cpl & is_last_pkt)]
                        with m.Else():
                            m.d.comb += out.p.nbytes.eq(BEAT)
                    with m.If(has & (~fires | out.ready)):
                        # take the chunk
                        with m.If(need_raw & ((pos + n == BEAT) | seg_end)):
                            m.d.comb += raw_ready.eq(1)
                        m.d.sync += [pos.eq(Mux(seg_end, seg_q[0].off, pos + n)), msg_left.eq(msg_left - n),
                                     pkt_left.eq(pkt_left - n), lim.eq(lim - n), pkt_start.eq(0)]
                        with m.If(seg_end & ~chunk_last):
                            # the segment ends inside the packet: the next one goes on with it
                            set_limits(-seg_over, seg_q[0].len)
                            next_segment()
                        with m.If(merge):
                            m.d.sync += held.eq(0)
                        if self.back_to_back:
                            with m.If(fires):
                                m.d.sync += opened.eq(1)
                        with m.If(emit):
                            m.d.sync += [residual.eq(combined[8 * BEAT:]), rcount.eq(total - BEAT)]
                        with m.Else():
                            m.d.sync += [residual.eq(combined[:16 * BEAT]), rcount.eq(total)]
                        with m.If(chunk_last):
                            with m.If(total > BEAT + SEG):
                                m.d.sync += [flush.eq(combined[8 * BEAT:]), flush_left.eq(total - BEAT)]
                                m.next = "FLUSH"
                            with m.Elif(total > BEAT):
                                # the beat goes out, the last <= 64 bytes are held at once
                                hold_tail(combined[8 * BEAT:], total - BEAT)
                                next_packet()
                            with m.Else():
                                with m.If(hold_now):
                                    hold_tail(combined, total)
                                next_packet()
            with m.State("FLUSH"):
                final = flush_left <= BEAT
                # back_to_back: the frame is open (a beat of it left in the cycle before), so
                # its last <= 64 bytes leave now as its last beat, never held a cycle
                hold_now = C(0) if self.back_to_back else final & (flush_left <= SEG)
                m.d.comb += [out.valid.eq(~hold_now), out.p.frame.eq(1), out.p.data.eq(flush[:8 * BEAT])]
                with m.If(final):
                    m.d.comb += [out.p.last.eq(1), out.p.nbytes.eq(flush_left),
                                 out.p.cpl_valid.eq(msg_cpl & is_last_pkt)]
                with m.Else():
                    m.d.comb += out.p.nbytes.eq(BEAT)
                with m.If(hold_now | out.ready):
                    m.d.sync += [flush.eq(flush >> (8 * BEAT)), flush_left.eq(flush_left - BEAT)]
                    with m.If(hold_now):
                        hold_tail(flush, flush_left)
                    with m.If(final):
                        next_packet()
        return m
