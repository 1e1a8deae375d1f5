"""Responder side of atomics: executes each one exactly once, serialised per word, on an
on-chip word cache that writes through to GPU memory."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream, enum
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import params as P

from spec.formats import PSN_BITS
from rtl.common.contexts import qp_bits

__all__ = ["AtomicOp", "AtomicRequest", "AtomicResult", "AtomicWordWrite", "AtomicUnit"]


class AtomicOp(enum.Enum, shape=2):
    FETCH_ADD = 0            # IBTA FETCH_ADD (8 bytes): op0 = add
    COMPARE_SWAP = 1         # IBTA COMPARE_SWAP (8 bytes): op0 = swap, op1 = compare
    MASKED_FETCH_ADD = 2     # mlx5 masked fetch-add: op0 = add, op1 = field boundary
    MASKED_COMPARE_SWAP = 3  # mlx5 masked compare-swap: op0 swap, op1 compare, op2 swap_mask, op3 compare_mask


def AtomicRequest(num_qps):
    """An atomic the responder has accepted (key, rights, bounds, alignment checked):
    ``duplicate`` when its PSN is behind the QP's expected one (a retry after a lost
    ATOMIC ACK: it must be answered, never executed again). ``wide``: 8 bytes (else 4, the
    masked forms only); ``va`` aligned to the size. Operands as ``AtomicOp`` says, a
    4-byte one in the low half. ``msn``: the QP's MSN counting this atomic (its ATOMIC
    ACK's; a duplicate's is the one recorded)."""
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "psn": unsigned(PSN_BITS), "duplicate": unsigned(1),
        "msn": unsigned(24),
        "op": AtomicOp, "wide": unsigned(1), "va": unsigned(64),
        "op0": unsigned(64), "op1": unsigned(64), "op2": unsigned(64), "op3": unsigned(64),
    })


def AtomicResult(num_qps):
    """The ATOMIC ACK's content: the word before the atomic (a 4-byte one zero-extended);
    ``replayed``: a duplicate answered from the replay record; ``found`` 0: a duplicate
    whose record is gone (older than the last ``REPLAY_DEPTH`` atomics of its QP, or
    never executed): the responder drops it unanswered (as ``model.responder`` does: the
    requester's timer resends from the start) rather than execute it. ``msn``: the ATOMIC
    ACK's MSN (a replayed one's as first sent)."""
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "psn": unsigned(PSN_BITS), "orig": unsigned(64), "msn": unsigned(24),
        "replayed": unsigned(1), "found": unsigned(1),
    })


# A word write-through: the 8-byte-aligned word and the bytes the atomic owns (all 8, or
# the 4-byte atomic's half: the other half of the word is never written, so a GPU store
# or a region boundary beside a 4-byte counter is not touched).
AtomicWordWrite = data.StructLayout({"addr": unsigned(64), "data": unsigned(64), "strb": unsigned(8)})


def _one_hot_or(values, sel):
    """The value ``sel`` (at most one bit set) picks, as an OR of masked values."""
    out = 0
    for i, v in enumerate(values):
        out = out | (v & sel[i].replicate(len(v)))
    return out


def _first_set(v):
    """(any bit set, index of the lowest set bit) of ``v`` (a power-of-two width), as a
    tree of halves: log2 levels instead of a chain."""
    if len(v) == 1:
        return v[0], C(0, 0)
    h = len(v) // 2
    any_lo, lo = _first_set(v[:h])
    any_hi, hi = _first_set(v[h:])
    return any_lo | any_hi, Mux(any_lo, Cat(lo, C(0, 1)), Cat(hi, C(1, 1)))


def _swar_add(a, b, boundary):
    """Field-wise add: a set bit of ``boundary`` is a field's top bit, whose carry out is
    dropped (boundary 0: a plain add; all ones: XOR)."""
    return ((a & ~boundary) + (b & ~boundary))[:len(a)] ^ ((a ^ b) & boundary)


class AtomicUnit(wiring.Component):
    """Executes atomics in arrival order, each exactly once, on cached 8-byte words.

    Requests enter in order. A new (not duplicate) one is looked up in the word cache
    (``entries`` words, fully associative on the 8-byte-aligned address): a hit joins the
    word's entry; a miss takes a free entry and reads the word from GPU memory at once
    (``rd_req``), so misses to different words overlap their reads. An entry is free when
    no waiting atomic uses it and its last write-through has its response (so a word is
    never read again from memory before its newest value landed there); with none free
    the unit holds new requests back. A queue keeps every request in order; its head
    waits for its word, executes (the masked forms field- or bit-wise, a 4-byte one on its
    half of the word), updates the cached word, writes it through (``wr_req``, in order)
    and records the original value for the QP's PSN; so atomics to one word, from any QP,
    are serialised in arrival order and each sees the one before it, one a cycle. A
    duplicate is answered from its QP's replay record (the last ``REPLAY_DEPTH`` atomics,
    by PSN, in a RAM) and never touches memory; a QP create starts a new generation
    of its records (``commit``), so nothing of the QP's previous life is replayed.

    Parameters
    ----------
    num_qps : int
    entries : int
        Cached words (atomics in flight to different words; a power of two).
    depth : int
        Atomics waiting in order (a power of two).

    Members
    -------
    requests : In(stream.Signature(AtomicRequest))
    results : Out(stream.Signature(AtomicResult))
        In request order.
    rd_req : Out(stream.Signature(addr))
        8-byte-aligned word reads; ``rd_resp`` answers them in order.
    rd_resp : In(stream.Signature(64))
    wr_req : Out(stream.Signature(AtomicWordWrite))
        Word write-throughs (only the atomic's bytes strobed), in execution order;
        ``wr_done`` (a strobe) marks each one's write response, in order.
    wr_done : In(1)
    commit : In(stream.Signature(qpn))
        A QP is created: its replay records are void.
    landed : In(1)
        A strobe per request, in order: every write to GPU memory before it has landed
        (``RxWriteIssuer.fence_done``). A request is taken only after its strobe, so its
        read sees the writes before it (put-with-signal: the signal after its data).
    """
    REPLAY_DEPTH = P.MAX_DEST_RD_ATOMIC     # a record for every atomic a QP may have unanswered

    def __init__(self, *, num_qps, entries=64, depth=256):
        for name, v in (("num_qps", num_qps), ("entries", entries), ("depth", depth)):
            if not isinstance(v, int) or v < 2 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 2, not {v!r}")
        self.num_qps, self.entries, self.depth = num_qps, entries, depth
        super().__init__({
            "requests": In(stream.Signature(AtomicRequest(num_qps))),
            "results": Out(stream.Signature(AtomicResult(num_qps))),
            "rd_req": Out(stream.Signature(data.StructLayout({"addr": unsigned(64)}))),
            "rd_resp": In(stream.Signature(unsigned(64))),
            "wr_req": Out(stream.Signature(AtomicWordWrite)),
            "wr_done": In(1),
            "commit": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps))}))),
            "landed": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        N, qb = self.entries, qp_bits(self.num_qps)
        ib = (N - 1).bit_length()
        cnt = range(self.depth + 1)
        req = self.requests.p

        # ---- the word cache (registers: a lookup compares every entry's tag) --------------
        valid = Signal(N)
        tags = Array(Signal(61, name=f"tag{i}") for i in range(N))
        words = Array(Signal(64, name=f"word{i}") for i in range(N))
        filled = Signal(N)
        refs = Array(Signal(cnt, name=f"refs{i}") for i in range(N))        # queued atomics using it
        writes = Array(Signal(cnt, name=f"writes{i}") for i in range(N))    # write-throughs in flight

        tag = req.va[3:]
        hit = Signal(N)
        free = Signal(N)
        for i in range(N):
            m.d.comb += [hit[i].eq(valid[i] & (tags[i] == tag)),
                         free[i].eq((refs[i] == 0) & (writes[i] == 0))]
        hit_idx = Signal(ib)                    # tags are unique: an OR of the hit entries' numbers
        m.d.comb += hit_idx.eq(Cat(*[Cat(*[hit[i] for i in range(N) if i >> b & 1]).any() for b in range(ib)]))
        # A free entry is chosen a cycle ahead (off the lookup's path): the first free one
        # but the one this cycle's request takes.
        free_idx = Signal(ib)                   # registered: free now (chosen last cycle)
        free_ok = Signal()
        used_now = Signal(N)                    # entries this cycle's request may join or take
        cand = Signal(N)
        m.d.comb += cand.eq(free & ~used_now)
        any_free, nxt = _first_set(cand)
        m.d.sync += [free_idx.eq(nxt), free_ok.eq(any_free)]

        # ---- in-order queue; reads and writes in flight ----------------------------------
        q_layout = data.StructLayout({"req": AtomicRequest(self.num_qps), "idx": unsigned(ib)})
        m.submodules.queue = queue = SyncFIFOBuffered(width=q_layout.size, depth=self.depth)
        m.submodules.fills = fills = SyncFIFOBuffered(width=ib, depth=self.depth)   # entry of each read
        m.submodules.wbacks = wbacks = SyncFIFOBuffered(width=ib, depth=self.depth)  # entry of each write

        # Accept: a duplicate needs no word; a hit joins its entry; a miss needs a free
        # entry and the read port.
        is_hit = hit.any()
        miss = ~req.duplicate & ~is_hit
        # requests whose writes before them have landed
        landed = Signal(16)
        ordered = Signal()
        m.d.comb += ordered.eq(landed != 0)
        can = ordered & queue.w_rdy & (req.duplicate | is_hit | (free_ok & self.rd_req.ready & fills.w_rdy))
        take = Signal()
        m.d.sync += landed.eq(landed + self.landed - take)
        idx_in = Signal(ib)
        m.d.comb += [self.requests.ready.eq(can), take.eq(self.requests.valid & can),
                     idx_in.eq(Mux(is_hit, hit_idx, free_idx)),
                     queue.w_en.eq(take), queue.w_data.eq(Cat(req.as_value(), idx_in)),
                     self.rd_req.valid.eq(self.requests.valid & ordered & miss & queue.w_rdy & free_ok & fills.w_rdy),
                     self.rd_req.p.addr.eq(Cat(C(0, 3), tag)),
                     fills.w_en.eq(take & miss), fills.w_data.eq(free_idx)]
        inc = Signal(N)          # one more atomic uses entry i
        dec = Signal(N)          # the head is done with entry i
        winc, wdec = Signal(N), Signal(N)
        free_1h = Signal(N)
        m.d.comb += free_1h.eq(1 << free_idx)
        with m.If(take & ~req.duplicate):
            m.d.comb += inc.eq(Mux(is_hit, hit, free_1h))
        # Entry writes by a one-hot enable per entry, never ``array[index].eq()``: that is a
        # switch over every index in every entry's logic (quadratic: 256 entries made 115 MB
        # of Verilator C++).
        for i in range(N):
            with m.If(take & miss & free_1h[i]):
                m.d.sync += tags[i].eq(tag)       # (taken with ``valid``, below)
        # Off the lookup's path, so conservative: the next choice avoids the entry a request
        # hits and the one offered while a request waits (taken or not: with a single free
        # entry a waiting miss gets it every other cycle)
        m.d.comb += used_now.eq(hit | Mux(self.requests.valid, free_1h, 0))
        for i in range(N):
            m.d.sync += [refs[i].eq(refs[i] + inc[i] - dec[i]), writes[i].eq(writes[i] + winc[i] - wdec[i])]

        # Fills: read data in order of the reads.
        m.d.comb += [self.rd_resp.ready.eq(fills.r_rdy), fills.r_en.eq(self.rd_resp.valid)]
        # Write responses, in order of the writes.
        m.d.comb += wbacks.r_en.eq(self.wr_done)
        m.d.comb += wdec.eq(Mux(self.wr_done, 1 << wbacks.r_data, 0))

        # ---- replay records: per QP, its last REPLAY_DEPTH atomics by count ---------------
        # A row of REPLAY_DEPTH records per QP and a count of its atomics (mod the depth):
        # a new atomic takes the record after the last one, a retry compares all of them
        # (a QP's atomics are any PSNs apart: WRITEs come between them, so PSN slots would
        # collide and a retry find its record taken).
        D = self.REPLAY_DEPTH
        rb = (D - 1).bit_length()
        rec_layout = data.StructLayout({"valid": unsigned(1), "gen": unsigned(8), "psn": unsigned(PSN_BITS),
                                        "orig": unsigned(64), "msn": unsigned(24)})
        m.submodules.replay = replay = Memory(shape=data.ArrayLayout(rec_layout, D), depth=self.num_qps, init=[])
        m.submodules.counts = counts = Memory(shape=unsigned(rb), depth=self.num_qps, init=[])
        m.submodules.gens = gens = Memory(shape=unsigned(8), depth=self.num_qps, init=[])
        rp_wr = replay.write_port(granularity=1)                # one record of the row
        rp_rd = replay.read_port(transparent_for=(rp_wr,))     # a retry right behind its original
        cnt_wr = counts.write_port()
        cnt_rd = counts.read_port(transparent_for=(cnt_wr,))
        gen_wr = gens.write_port()
        gen_rd = gens.read_port(transparent_for=(gen_wr,))
        gen_rmw = gens.read_port(transparent_for=())

        # A create bumps the QP's generation (read-modify-write over two cycles; the
        # head's reads see it from the cycle after).
        commit_qpn = Signal(qb)
        commit_busy = Signal()
        m.d.comb += [self.commit.ready.eq(~commit_busy), gen_rmw.addr.eq(self.commit.p.qpn),
                     gen_rmw.en.eq(self.commit.valid & ~commit_busy)]
        with m.If(self.commit.valid & ~commit_busy):
            m.d.sync += [commit_busy.eq(1), commit_qpn.eq(self.commit.p.qpn)]
        with m.If(commit_busy):
            m.d.comb += [gen_wr.en.eq(1), gen_wr.addr.eq(commit_qpn), gen_wr.data.eq(gen_rmw.data + 1)]
            m.d.sync += commit_busy.eq(0)

        # ---- head: stage 1 reads the records, stage 2 executes ---------------------------
        h = Signal(q_layout)                     # the atomic in stage 2
        h_valid = Signal()
        q_head = Signal(q_layout)
        m.d.comb += q_head.eq(queue.r_data)
        advance = Signal()                       # stage 2 is done (or empty): take the next
        m.d.comb += [queue.r_en.eq(advance), rp_rd.en.eq(advance), gen_rd.en.eq(advance), cnt_rd.en.eq(advance),
                     rp_rd.addr.eq(q_head.req.qpn), gen_rd.addr.eq(q_head.req.qpn), cnt_rd.addr.eq(q_head.req.qpn)]
        with m.If(advance):
            m.d.sync += [h.eq(q_head), h_valid.eq(queue.r_rdy)]
        # The head's word is read from the cache as it enters stage 2 (the wide mux of the
        # cache off the ALU's path), with what this cycle writes to its entry forwarded:
        # the atomic in stage 2 executing on the same word, or the word's fill arriving;
        # a fill arriving while the head waits for it is taken too.
        word = Signal(64)                        # the head's word (registered)
        word_ok = Signal()                       # ... is there (filled)
        fill_now = Signal()
        m.d.comb += fill_now.eq(self.rd_resp.valid & fills.r_rdy)
        executing = Signal()                     # stage 2 executes this cycle (merged is its result)
        merged = Signal(64)
        with m.If(advance):
            with m.If(executing & (h.idx == q_head.idx)):
                m.d.sync += [word.eq(merged), word_ok.eq(1)]
            with m.Elif(fill_now & (fills.r_data == q_head.idx)):
                m.d.sync += [word.eq(self.rd_resp.p), word_ok.eq(1)]
            with m.Else():
                m.d.sync += [word.eq(words[q_head.idx]), word_ok.eq(filled.bit_select(q_head.idx, 1))]
        with m.Elif(fill_now & (fills.r_data == h.idx)):
            m.d.sync += [word.eq(self.rd_resp.p), word_ok.eq(1)]

        r = h.req
        rec = rp_rd.data
        half = Signal(32)
        m.d.comb += half.eq(Mux(r.va[2], word[32:], word[:32]))
        orig = Signal(64)
        m.d.comb += orig.eq(Mux(r.wide, word, half))
        # the operation on ``orig``: IBTA's forms as masked ones with full masks
        add, boundary = Signal(64), Signal(64)
        swap, compare, swap_mask, compare_mask = Signal(64), Signal(64), Signal(64), Signal(64)
        ones = Mux(r.wide, C(2 ** 64 - 1, 64), C(2 ** 32 - 1, 64))
        m.d.comb += [add.eq(r.op0 & ones), swap.eq(r.op0 & ones), compare.eq(r.op1 & ones),
                     boundary.eq(Mux(r.op == AtomicOp.MASKED_FETCH_ADD, r.op1, 0) & ones),
                     swap_mask.eq(Mux(r.op == AtomicOp.MASKED_COMPARE_SWAP, r.op2, ones) & ones),
                     compare_mask.eq(Mux(r.op == AtomicOp.MASKED_COMPARE_SWAP, r.op3, ones) & ones)]
        is_add = (r.op == AtomicOp.FETCH_ADD) | (r.op == AtomicOp.MASKED_FETCH_ADD)
        new = Signal(64)
        with m.If(is_add):
            m.d.comb += new.eq(_swar_add(orig, add, boundary) & ones)
        with m.Elif(((orig ^ compare) & compare_mask) == 0):
            m.d.comb += new.eq(((orig & ~swap_mask) | (swap & swap_mask)) & ones)
        with m.Else():
            m.d.comb += new.eq(orig)
        m.d.comb += merged.eq(Mux(r.wide, new, Mux(r.va[2], Cat(word[:32], new[:32]), Cat(new[:32], word[32:]))))

        # a retry's record: the one of this life of the QP with its PSN (at most one)
        match = Signal(D)
        for i in range(D):
            m.d.comb += match[i].eq(rec[i].valid & (rec[i].gen == gen_rd.data) & (rec[i].psn == r.psn))
        found = match.any()
        rec_orig, rec_msn = Signal(64), Signal(24)
        m.d.comb += [rec_orig.eq(_one_hot_or([rec[i].orig for i in range(D)], match)),
                     rec_msn.eq(_one_hot_or([rec[i].msn for i in range(D)], match))]
        ready_word = word_ok
        res = self.results
        out_free = ~res.valid | res.ready
        with m.If(res.valid & res.ready):
            m.d.sync += res.valid.eq(0)
        m.d.comb += advance.eq(~h_valid)
        with m.If(h_valid & r.duplicate & out_free):
            m.d.comb += advance.eq(1)
            m.d.sync += [res.valid.eq(1), res.p.qpn.eq(r.qpn), res.p.psn.eq(r.psn), res.p.orig.eq(rec_orig),
                         res.p.msn.eq(rec_msn), res.p.replayed.eq(1), res.p.found.eq(found)]
        with m.If(h_valid & ~r.duplicate & ready_word & out_free & self.wr_req.ready & wbacks.w_rdy):
            m.d.comb += [advance.eq(1), executing.eq(1),
                         self.wr_req.valid.eq(1), self.wr_req.p.addr.eq(Cat(C(0, 3), r.va[3:])),
                         self.wr_req.p.data.eq(merged), self.wr_req.p.strb.eq(Mux(r.wide, 0xFF, Mux(r.va[2], 0xF0, 0x0F))),
                         wbacks.w_en.eq(1), wbacks.w_data.eq(h.idx),
                         rp_wr.en.eq(1 << cnt_rd.data), rp_wr.addr.eq(r.qpn),
                         cnt_wr.en.eq(1), cnt_wr.addr.eq(r.qpn), cnt_wr.data.eq(cnt_rd.data + 1)]
            for i in range(D):       # every record of the row offered; the enable picks one
                m.d.comb += [rp_wr.data[i].valid.eq(1), rp_wr.data[i].gen.eq(gen_rd.data),
                             rp_wr.data[i].psn.eq(r.psn), rp_wr.data[i].orig.eq(orig), rp_wr.data[i].msn.eq(r.msn)]
            m.d.sync += [res.valid.eq(1), res.p.qpn.eq(r.qpn), res.p.psn.eq(r.psn), res.p.orig.eq(orig),
                         res.p.msn.eq(r.msn), res.p.replayed.eq(0), res.p.found.eq(1)]
        # a word is written by its fill or by the atomic executing on it (never both in one
        # cycle: an entry executes only once filled)
        # (one-hot vectors, not ``bit_select().eq()``, for the same reason)
        fill_1h, exec_1h, take_1h = Signal(N), Signal(N), Signal(N)
        m.d.comb += [fill_1h.eq(Mux(self.rd_resp.valid & fills.r_rdy, 1 << fills.r_data, 0)),
                     exec_1h.eq(Mux(executing, 1 << h.idx, 0)), take_1h.eq(Mux(take & miss, free_1h, 0)),
                     dec.eq(exec_1h), winc.eq(exec_1h)]
        # a taken entry is not being filled (a fill's entry has its atomic queued)
        m.d.sync += [valid.eq(valid | take_1h), filled.eq(filled & ~take_1h | fill_1h)]
        for i in range(N):
            with m.If(exec_1h[i]):
                m.d.sync += words[i].eq(merged)
            with m.Elif(fill_1h[i]):
                m.d.sync += words[i].eq(self.rd_resp.p)
        return m
