"""Response checker: a received ACK/NAK reaches the requester only when it belongs."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import params as P
from spec.formats import Aeth, PSN_BITS, QpState, RESPONSE_DROP_NAMES
from rtl.common.contexts import qp_bits
from rtl.common.records import AckRecord, PacketNote, ReadVerdict, Response
from rtl.common.stream import Pair, pack_pair
from rtl.requester.wqe_parser import RemoteOpNote

__all__ = ["ResponseChecker", "ResponseDrop", "CheckedResponse", "NAK_BAD_RESPONSE"]

# A response that fits nothing outstanding fails the QP with BAD_RESP_ERR: the checker
# hands it on as a NAK of this reserved code (the tracker maps an unknown code to BAD_RESP_ERR).
NAK_BAD_RESPONSE = (Aeth.KIND_NAK << 5) | 0x1F


def CheckedResponse(num_qps):
    """A response that belongs, as the checker hands it on: the ``AckRecord`` the requester
    acts on (an implied NAK already turned into one) and, for ``data`` (an ATOMIC
    ACKNOWLEDGE that completes the QP's oldest atomic), the original value and the
    atomic's slot (the QP's count of retired ops before it, mod 32); with ``read``, the
    last response of the QP's oldest READ: the READ completes once its payload has
    landed (``ResultWriter``)."""
    return data.StructLayout({"ack": AckRecord, "data": unsigned(1), "read": unsigned(1), "orig": unsigned(64),
                              "slot": unsigned(5)})


# READ verdicts queued at most (the checker cannot wait: it takes no pair while fewer than
# its pipeline's pairs and one more fit)
VERDICT_QUEUE = 16


class ResponseDrop:
    """Why a response is dropped: the index of its name in ``RESPONSE_DROP_NAMES`` (and of its
    counter ``resp_<name>``), in the order the checks run."""
    UNKNOWN_QP, NOT_RC, QP_STATE, WRONG_PEER, BAD_AETH, PSN_AHEAD, STALE, DUPLICATE_NAK = range(8)


assert len(RESPONSE_DROP_NAMES) == 8 and RESPONSE_DROP_NAMES[ResponseDrop.STALE] == "stale"


def _behind(a, b):
    """``a`` is at or before ``b`` in serial arithmetic mod 2^24 (less than 2^23 behind)."""
    return ~(b - a)[PSN_BITS - 1]


class ResponseChecker(wiring.Component):
    """Between the receive dispatch and the ACK mailbox: an ACK/NAK changes requester state
    only when it belongs to the QP it names; anything else is dropped and counted.

    The checks, in order (``spec.formats.RESPONSE_DROPS``, as
    ``model.requester.RcRequester.on_response``): the destination QPN names one of this
    NIC's QPs in all 24 bits; the QP is RC, in RTS (the state the control path last set)
    and has not failed; the frame comes from the QP's peer (source IPv4 and MAC address);
    the AETH is not of the reserved kind (syndrome bits 6:5 = 2, or bit 7 set); the PSN is
    not after the last PSN the QP has sent (``psn_ahead``) and not already acknowledged
    (``stale``); a PSN-sequence NAK is not the last one again with no progress in between
    (``duplicate_nak``).

    So every record passed on is one the requester would act on in arrival order, and
    the ACK mailbox may fold them (a later record that says more replaces an earlier one)
    without a forged or stale one ever replacing a good one. To know that, the checker
    keeps per QP what the responses so far did: the acknowledged PSN, the last sequence
    NAK and whether a fatal NAK failed the QP (a RAM, read when a pair is taken and
    written when it is decided; lane 1 decides on lane 0's result when both are of one
    QP). It also keeps the highest PSN the QP has sent (a RAM written from the packet
    builder's notes, one a cycle, only when the PSN is newer: a go-back-N resend does
    not lower it), and takes the QP's peer, service and state from every QP commit.
    A QP that fails by its retry count (the tracker's ``failed`` strobe) takes no more
    responses either.

    READs and atomics (IBTA 9.7.5.1.3: a responder answers in PSN order): the checker keeps
    each QP's outstanding ones in a ring (their PSNs in a row of ``MAX_RD_ATOMIC`` per QP,
    written by the parser's ``remote`` notes; the tail beside it, the head in the QP's
    state), the oldest being the *gap*. A response that would acknowledge past the gap
    without its answer says the answer was lost: an ACK (or a sequence NAK) beyond it is
    handed on as a sequence NAK at the gap (an implied NAK: go back to it; a repeat of it
    with no progress is a ``duplicate_nak``), a fatal NAK beyond it as that NAK at the gap.
    An ATOMIC ACKNOWLEDGE at the gap is ``data``: it acknowledges its PSN and retires the
    atomic; one beyond the gap is an implied NAK; one with no atomic at or before its PSN
    fits nothing and fails the QP (``NAK_BAD_RESPONSE``). As ``model.requester``.
    A READ takes one PSN per response: the gap is then its next response's PSN (the one
    after the last taken). A READ RESPONSE at the gap that fits (the oldest op is a READ,
    the opcode ends it exactly at its last PSN and begins one at its first, the length is
    the MTU or, at the last PSN, the rest) acknowledges its PSN, and its payload is
    written at the READ's local address plus a MTU per PSN before it (``read_verdicts``,
    one per READ RESPONSE, dropped ones included); its last retires the READ (``read``).
    One beyond the gap is an implied NAK, one that does not fit fails the QP.

    Two responses a cycle, in the dispatch's pairs (two 62-byte ACKs end in one beat at
    line rate); a pair is taken in cycle t, decided in t+1 and handed on, registered, in
    t+2. ``i.ready`` is constant 1, so the receive path never waits here: ``o`` must be
    taken whenever it is valid (the ACK mailbox's input is always ready). A QP commit is taken in any cycle;
    a response decided in that cycle for the same QP is dropped (``qp_state``: it was
    read before the commit).

    Parameters
    ----------
    num_qps : int
        QPs (a power of two >= 2).

    Members
    -------
    i : In(stream.Signature(Pair(Response)))
        ACK/NAK frames that passed the frame-level checks, one or two per transfer.
    o : Out(stream.Signature(Pair(CheckedResponse)))
        The ones that belong, in order, to the result writer (``o.ready`` must be 1).
    hold : In(1)
        Take no pair this cycle (the result writer's queue is nearly full).
    remote : In(RemoteOpNote)
        A READ or atomic registered by the parser (its PSN into the QP's ring).
    commit : In(stream.Signature(...))
        Every QP commit (create or modify): ``qpn``, the peer (``dmac``, ``dip``), ``uc``,
        ``state``; with ``create`` also ``start_psn`` (nothing sent or acknowledged yet).
        Always taken.
    packets : In(PacketNote)
        The PSN of each RC request packet sent.
    failed : In(data.StructLayout(valid, qpn))
        The tracker failed a QP (retries exceeded).
    dropped : Out(ArrayLayout(2, 8))
        Per reason of ``ResponseDrop``, responses dropped this cycle (0..2).
    read_verdicts : Out(stream.Signature(Pair(ReadVerdict)))
        Per pair with READ RESPONSEs, their payloads' fate, in order.
    """
    def __init__(self, *, num_qps):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        self.num_qps = num_qps
        qb = qp_bits(num_qps)
        super().__init__({
            "i": In(stream.Signature(Pair(Response))),
            "o": Out(stream.Signature(Pair(CheckedResponse(num_qps)))),
            "hold": In(1),
            "remote": In(RemoteOpNote(num_qps)),
            "commit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qb), "create": unsigned(1), "start_psn": unsigned(PSN_BITS),
                "dmac": unsigned(48), "dip": unsigned(32), "uc": unsigned(1), "state": unsigned(3)}))),
            "packets": In(PacketNote(num_qps)),
            "failed": In(data.StructLayout({"valid": unsigned(1), "qpn": unsigned(qb)})),
            "dropped": Out(data.ArrayLayout(unsigned(2), len(RESPONSE_DROP_NAMES))),
            "read_verdicts": Out(stream.Signature(Pair(ReadVerdict))),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        cfg_layout = data.StructLayout({"dmac": unsigned(48), "dip": unsigned(32), "uc": unsigned(1),
                                        "state": unsigned(3)})
        dyn_layout = data.StructLayout({"acked": unsigned(PSN_BITS), "nak_valid": unsigned(1),
                                        "nak_psn": unsigned(PSN_BITS), "failed": unsigned(1),
                                        "rhead": unsigned(5)})
        c = self.commit
        m.d.comb += c.ready.eq(1)
        take_c = Signal()
        create = Signal()
        m.d.comb += [take_c.eq(c.valid), create.eq(c.valid & c.p.create)]

        # Per-QP RAMs. Readers see the writes of the cycle they read in (transparent), so a
        # pair taken while the previous one is written reads the new values.
        m.submodules.cfg = cfg_ram = Memory(shape=cfg_layout, depth=self.num_qps, init=[])
        cfg_wr = cfg_ram.write_port()
        cfg_rd = [cfg_ram.read_port(transparent_for=(cfg_wr,)) for _ in range(2)]
        m.d.comb += [cfg_wr.en.eq(take_c), cfg_wr.addr.eq(c.p.qpn), cfg_wr.data.dmac.eq(c.p.dmac),
                     cfg_wr.data.dip.eq(c.p.dip), cfg_wr.data.uc.eq(c.p.uc), cfg_wr.data.state.eq(c.p.state)]

        m.submodules.dyn = dyn_ram = Memory(shape=dyn_layout, depth=self.num_qps, init=[])
        dyn_wr = [dyn_ram.write_port() for _ in range(2)]
        dyn_new = dyn_ram.write_port()
        dyn_rd = [dyn_ram.read_port(transparent_for=(*dyn_wr, dyn_new)) for _ in range(2)]
        m.d.comb += [dyn_new.en.eq(create), dyn_new.addr.eq(c.p.qpn), dyn_new.data.eq(0),
                     dyn_new.data.acked.eq(c.p.start_psn - 1)]

        # Failed by the tracker (a retry count run out): set by its strobe, cleared by a create.
        m.submodules.fail = fail_ram = Memory(shape=unsigned(1), depth=self.num_qps, init=[])
        fail_wr, fail_new = fail_ram.write_port(), fail_ram.write_port()
        fail_rd = [fail_ram.read_port(transparent_for=(fail_wr, fail_new)) for _ in range(2)]
        m.d.comb += [fail_wr.en.eq(self.failed.valid & ~(create & (c.p.qpn == self.failed.qpn))),
                     fail_wr.addr.eq(self.failed.qpn), fail_wr.data.eq(1),
                     fail_new.en.eq(create), fail_new.addr.eq(c.p.qpn), fail_new.data.eq(0)]

        # The highest PSN sent: read-modify-write of each note over two cycles (the read is
        # transparent for the write, so notes of one QP in consecutive cycles chain).
        m.submodules.hw = hw_ram = Memory(shape=unsigned(PSN_BITS), depth=self.num_qps, init=[])
        hw_wr, hw_new = hw_ram.write_port(), hw_ram.write_port()
        hw_rd_note = hw_ram.read_port(transparent_for=(hw_wr, hw_new))
        hw_rd = [hw_ram.read_port(transparent_for=(hw_wr, hw_new)) for _ in range(2)]
        note = Signal(PacketNote(self.num_qps))
        m.d.sync += note.eq(self.packets)
        m.d.comb += [
            hw_rd_note.addr.eq(self.packets.qpn),
            hw_new.en.eq(create), hw_new.addr.eq(c.p.qpn), hw_new.data.eq(c.p.start_psn - 1),
            hw_wr.addr.eq(note.qpn), hw_wr.data.eq(note.psn),
            hw_wr.en.eq(note.valid & ~_behind(note.psn, hw_rd_note.data) & ~(create & (c.p.qpn == note.qpn))),
        ]

        # Outstanding READs/atomics: a row of PSNs per QP (one slot written per note) and the
        # tail (a create sets 0); the head is in ``dyn``.
        nr = P.MAX_RD_ATOMIC
        rn = self.remote
        # (a RAM per slot, not one row with a write enable per slot: a part-word write of a
        # memory row is one construct every simulator and synthesis tool takes alike)
        # Per slot: the op's first PSN, and its last PSN and kind (a READ's last response
        # length: the rest after whole MTUs).
        info_layout = data.StructLayout({"last": unsigned(PSN_BITS), "read": unsigned(1), "mtu": unsigned(3),
                                         "tail": unsigned(13)})
        note_info = Signal(info_layout)
        m.d.comb += [note_info.last.eq(rn.last), note_info.read.eq(rn.read), note_info.mtu.eq(rn.mtu)]
        with m.Switch(rn.mtu):
            for code in range(1, 6):
                with m.Case(code):
                    sh = code + 7
                    m.d.comb += note_info.tail.eq(Mux(rn.length[:sh] != 0, rn.length[:sh], Mux(rn.length != 0, 1 << sh, 0)))
            with m.Default():
                m.d.comb += note_info.tail.eq(Mux(rn.length[:12] != 0, rn.length[:12], Mux(rn.length != 0, 1 << 12, 0)))
        ring_rd = [[], []]
        info_rd = [[], []]
        for j in range(nr):
            ram = Memory(shape=unsigned(PSN_BITS), depth=self.num_qps, init=[])
            m.submodules[f"ring{j}"] = ram
            wp = ram.write_port()
            m.d.comb += [wp.en.eq(rn.valid & (rn.slot[:4] == j)), wp.addr.eq(rn.qpn), wp.data.eq(rn.psn)]
            iram = Memory(shape=info_layout, depth=self.num_qps, init=[])
            m.submodules[f"info{j}"] = iram
            iwp = iram.write_port()
            m.d.comb += [iwp.en.eq(rn.valid & (rn.slot[:4] == j)), iwp.addr.eq(rn.qpn), iwp.data.eq(note_info)]
            for k in range(2):
                ring_rd[k].append(ram.read_port(transparent_for=(wp,)))
                info_rd[k].append(iram.read_port(transparent_for=(iwp,)))
        # Each READ's local address, by (QP, slot): read after the decision (stage 3)
        m.submodules.raddr = addr_ram = Memory(shape=unsigned(64), depth=self.num_qps * nr, init=[])
        addr_wr = addr_ram.write_port()
        addr_rd = [addr_ram.read_port(transparent_for=(addr_wr,)) for _ in range(2)]
        m.d.comb += [addr_wr.en.eq(rn.valid), addr_wr.addr.eq(Cat(rn.slot[:4], rn.qpn)), addr_wr.data.eq(rn.addr)]
        m.submodules.rtail = tail_ram = Memory(shape=unsigned(5), depth=self.num_qps, init=[])
        tail_wr, tail_new = tail_ram.write_port(), tail_ram.write_port()
        tail_rd = [tail_ram.read_port(transparent_for=(tail_wr, tail_new)) for _ in range(2)]
        m.d.comb += [tail_wr.en.eq(rn.valid & ~(create & (c.p.qpn == rn.qpn))), tail_wr.addr.eq(rn.qpn),
                     tail_wr.data.eq(rn.slot + 1),
                     tail_new.en.eq(create), tail_new.addr.eq(c.p.qpn), tail_new.data.eq(0)]

        # Stage 1: the pair taken, its QPs' reads.
        o = self.o
        s1_valid = Signal(2)
        s1 = Signal(Pair(Response))
        m.submodules.verdict_q = vq = SyncFIFOBuffered(width=Pair(ReadVerdict).size, depth=VERDICT_QUEUE)
        m.d.comb += [self.i.ready.eq(~self.hold & (vq.level < VERDICT_QUEUE - 4)),
                     self.read_verdicts.valid.eq(vq.r_rdy), self.read_verdicts.p.eq(vq.r_data),
                     vq.r_en.eq(self.read_verdicts.ready)]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)
        m.d.sync += [s1_valid.eq(Mux(take, Cat(1, self.i.p.second), 0)), s1.eq(self.i.p)]
        for k in range(2):
            a = self.i.p.p[k].qpn[:qb]
            m.d.comb += [cfg_rd[k].addr.eq(a), dyn_rd[k].addr.eq(a), fail_rd[k].addr.eq(a), hw_rd[k].addr.eq(a),
                         tail_rd[k].addr.eq(a), *(r.addr.eq(a) for r in ring_rd[k]),
                         *(r.addr.eq(a) for r in info_rd[k])]

        # Stage 2: decide, lane 1 on lane 0's result when both are of one QP.
        same = Signal()
        m.d.comb += same.eq(s1_valid[1] & (s1.p[0].qpn == s1.p[1].qpn))
        reasons, passes, new_dyn, outs, verdicts = [], [], [], [], []
        dyn_in = [Signal(dyn_layout, name=f"dyn_in{k}") for k in range(2)]
        m.d.comb += dyn_in[0].eq(dyn_rd[0].data)
        for k in range(2):
            r = s1.p[k]
            cfg = cfg_rd[k].data
            d = dyn_in[k]
            hw = hw_rd[k].data
            kind = r.syndrome[5:7]
            in_ack = kind == Aeth.KIND_ACK
            in_nak = kind == Aeth.KIND_NAK
            in_seq = r.syndrome == Aeth.NAK_PSN_SEQ
            # The gap: the oldest outstanding READ/atomic (its PSN), if any.
            gap_valid, gap = Signal(name=f"gap_valid{k}"), Signal(PSN_BITS, name=f"gap{k}")
            gap_first, ginfo = Signal(PSN_BITS, name=f"gap_first{k}"), Signal(info_layout, name=f"gap_info{k}")
            nxt = Signal(PSN_BITS, name=f"next_resp{k}")
            m.d.comb += [gap_valid.eq(d.rhead != tail_rd[k].data),
                         gap_first.eq(Array(r.data for r in ring_rd[k])[d.rhead[:4]]),
                         ginfo.eq(Array(r.data for r in info_rd[k])[d.rhead[:4]]),
                         nxt.eq(d.acked + 1),
                         # a READ partly answered: its next response's PSN
                         gap.eq(Mux(_behind(nxt, gap_first), gap_first, nxt))]
            at_first, at_last = Signal(name=f"at_first{k}"), Signal(name=f"at_last{k}")
            m.d.comb += [at_first.eq(r.psn == gap_first), at_last.eq(r.psn == ginfo.last)]
            # (rop: 0 FIRST, 1 MIDDLE, 2 LAST, 3 ONLY)
            ends, begins = r.rop[1], r.rop[0] == r.rop[1]
            fits = Signal(name=f"fits{k}")
            m.d.comb += fits.eq(ginfo.read & (ends == at_last) & (~at_first | begins)
                                & (r.length == Mux(at_last, ginfo.tail, Const(128, 13) << ginfo.mtu)))
            # What the response says once the gap is taken into account (r.psn and r.syndrome
            # unless an answer is missing before it): psn2 / syn2.
            psn2, syn2 = Signal(PSN_BITS, name=f"psn2_{k}"), Signal(8, name=f"syn2_{k}")
            is_data = Signal(name=f"data{k}")
            is_rdata = Signal(name=f"read_data{k}")     # a READ RESPONSE that is taken
            m.d.comb += [psn2.eq(r.psn), syn2.eq(r.syndrome)]
            with m.If(r.atomic | r.read):
                with m.If(~gap_valid | ~_behind(gap, r.psn)):
                    m.d.comb += [psn2.eq(d.acked + 1), syn2.eq(NAK_BAD_RESPONSE)]
                with m.Elif(r.psn != gap):
                    m.d.comb += [psn2.eq(gap), syn2.eq(Aeth.NAK_PSN_SEQ)]
                with m.Elif(Mux(r.read, ~fits, ginfo.read)):
                    m.d.comb += [psn2.eq(gap), syn2.eq(NAK_BAD_RESPONSE)]
                with m.Elif(r.read):
                    m.d.comb += [is_rdata.eq(1), syn2.eq(Aeth.ACK)]
                with m.Else():
                    m.d.comb += is_data.eq(1)
            with m.Elif(in_ack & gap_valid & _behind(gap, r.psn)):
                m.d.comb += [psn2.eq(gap), syn2.eq(Aeth.NAK_PSN_SEQ)]
            with m.Elif(in_nak & ((r.psn - 1)[:PSN_BITS] != d.acked) & gap_valid & _behind(gap, r.psn - 1)):
                m.d.comb += psn2.eq(gap)
            kind2 = syn2[5:7]
            is_ack = kind2 == Aeth.KIND_ACK
            is_nak = (kind2 == Aeth.KIND_NAK) | (kind2 == Aeth.KIND_RNR)   # (an RNR NAK acknowledges before it too)
            is_seq = syn2 == Aeth.NAK_PSN_SEQ
            no_progress = Signal(name=f"no_progress{k}")      # a NAK that acknowledges nothing new
            m.d.comb += no_progress.eq((psn2 - 1)[:PSN_BITS] == d.acked)
            checks = [
                r.qpn[qb:] != 0,
                cfg.uc,
                (cfg.state != QpState.RTS) | d.failed | fail_rd[k].data | (take_c & (c.p.qpn == r.qpn[:qb])),
                (r.sip != cfg.dip) | (r.smac != cfg.dmac),
                (kind == Aeth.KIND_RESERVED) | r.syndrome[7] | ((r.atomic | r.read) & ~in_ack),   # bit 7 is reserved too
                ~_behind(r.psn, hw),
                _behind(r.psn, d.acked),
                is_seq & no_progress & d.nak_valid & (d.nak_psn == psn2),
            ]
            reason = Signal(len(checks), name=f"reason{k}")     # one-hot: the first check failed
            ok = Signal(name=f"ok{k}")
            failing = Const(0, 1)
            for j, chk in enumerate(checks):
                m.d.comb += reason[j].eq(chk & ~failing)
                failing = failing | chk
            m.d.comb += ok.eq(~failing)
            nd = Signal(dyn_layout, name=f"new_dyn{k}")
            m.d.comb += nd.eq(d)
            with m.If(ok & is_ack):
                m.d.comb += [nd.acked.eq(psn2), nd.nak_valid.eq(0)]
            with m.If(ok & is_nak):
                with m.If(~no_progress):
                    m.d.comb += [nd.acked.eq(psn2 - 1), nd.nak_valid.eq(0)]
                with m.If(is_seq):
                    m.d.comb += [nd.nak_valid.eq(1), nd.nak_psn.eq(psn2)]
                with m.Elif(kind2 == Aeth.KIND_NAK):
                    m.d.comb += nd.failed.eq(1)       # (an RNR NAK fails the QP only when its retries
                                                      # are used up: the tracker's ``failed``)
            read_done = Signal(name=f"read_done{k}")
            m.d.comb += read_done.eq(is_rdata & at_last)
            with m.If(ok & (is_data | read_done)):
                m.d.comb += nd.rhead.eq(d.rhead + 1)
            rec = Signal(CheckedResponse(self.num_qps), name=f"rec{k}")
            m.d.comb += [rec.ack.qpn.eq(r.qpn), rec.ack.psn.eq(psn2), rec.ack.syndrome.eq(syn2),
                         rec.ack.msn.eq(r.msn), rec.data.eq(is_data | read_done), rec.read.eq(read_done),
                         rec.orig.eq(r.orig), rec.slot.eq(d.rhead)]
            # the payload's verdict, completed in stage 3 (the address read by slot)
            v = Signal(data.StructLayout({"valid": unsigned(1), "write": unsigned(1), "notify": unsigned(1),
                                          "delta": unsigned(PSN_BITS), "mtu": unsigned(3)}), name=f"s3_{k}")
            m.d.sync += [v.valid.eq(s1_valid[k] & r.read), v.write.eq(ok & is_rdata & (r.length != 0)),
                         v.notify.eq(ok & read_done), v.delta.eq(r.psn - gap_first), v.mtu.eq(ginfo.mtu)]
            m.d.comb += addr_rd[k].addr.eq(Cat(d.rhead[:4], r.qpn[:qb]))
            verdicts.append(v)
            outs.append(rec)
            reasons.append(reason)
            passes.append(ok)
            new_dyn.append(nd)
            if k == 0:
                m.d.comb += dyn_in[1].eq(Mux(same, nd, dyn_rd[1].data))
        present = [s1_valid[0] & passes[0], s1_valid[1] & passes[1]]
        # A lane that passes writes its QP's state back; of a pair of one QP only lane 1
        # writes, also lane 0's result when lane 1 is dropped. A dropped lane writes nothing
        # (its address may alias another QP: unknown_qp), and nothing is written over a
        # create of that QP in the same cycle.
        writes = [s1_valid[0] & ~same & passes[0], s1_valid[1] & (passes[1] | (same & passes[0]))]
        for k in range(2):
            m.d.comb += [dyn_wr[k].addr.eq(s1.p[k].qpn[:qb]), dyn_wr[k].data.eq(new_dyn[k]),
                         dyn_wr[k].en.eq(writes[k] & ~(create & (c.p.qpn == s1.p[k].qpn[:qb])))]
        for j in range(len(RESPONSE_DROP_NAMES)):
            m.d.comb += self.dropped[j].eq((s1_valid[0] & reasons[0][j]) + (s1_valid[1] & reasons[1][j]))

        # The output register.
        m.d.sync += [o.valid.eq(present[0] | present[1]), *pack_pair(o.p, present, outs)]

        # Stage 3: the READ RESPONSEs' verdicts, their addresses read (queued in order).
        vouts = []
        for k in range(2):
            v = verdicts[k]
            vo = Signal(ReadVerdict, name=f"verdict{k}")
            off = Signal(36, name=f"verdict_off{k}")
            m.d.comb += off.eq(v.delta << (v.mtu + 7))
            m.d.comb += [vo.write.eq(v.write), vo.notify.eq(v.notify), vo.addr.eq(addr_rd[k].data + off)]
            vouts.append(vo)
        vpair = Signal(Pair(ReadVerdict))
        m.d.comb += [*pack_pair(vpair, [verdicts[0].valid, verdicts[1].valid], vouts),
                     vq.w_data.eq(vpair), vq.w_en.eq(verdicts[0].valid | verdicts[1].valid)]
        return m
