"""Cycle model of the whole transmit engine under any load.

A cycle-stepped transaction model: each stage of docs/architecture.md is a small
state machine exchanging work through queues whose depths and latencies are
those of the design (a two-stage FIFO shows an item two cycles after it is
written, a one-stage FIFO one cycle after). From the doorbells (cycle, QP,
producer limit) and the posted WQEs it predicts the cycle of every frame's first
and last beat on the MAC port, every frame's wire start, and every CQE write.
GPU memory answers each read ``dma_latency`` cycles after it is issued, one beat
per cycle per port, in issue order per port (the memory model of tb/memory.py); the
WQE fetch and the payload fetch have a read port each.

It covers RDMA WRITE, WRITE with immediate, SEND and SEND with immediate (inline, one
pointer segment or a gather list of up to ``REQUESTER_GATHER``) and NOP WQEs on QPs in RTS.
Tolerance: zero cycles for every event.
"""
import copy
from collections import deque
from dataclasses import dataclass, field

from spec import formats as F
from spec import params as P

BEAT = P.DATA_BYTES
SEG = P.SEGMENT_BYTES
INLINE_OFFSET = F.WQE_INLINE_OFFSET
# The WRITE-like WQEs (the parser's MessageKind.WRITE): packets of payload, the SEND ones
# without a RETH, the _IMM ones with an ImmDt on the last packet.
WRITE_LIKE = (F.WqeOp.RDMA_WRITE, F.WqeOp.RDMA_WRITE_IMM, F.WqeOp.SEND, F.WqeOp.SEND_IMM)
SENDS = (F.WqeOp.SEND, F.WqeOp.SEND_IMM)
WITH_IMM = (F.WqeOp.RDMA_WRITE_IMM, F.WqeOp.SEND_IMM)


def inline_offset(w):
    """Where a WRITE-like WQE's inline data starts in it: a SEND has no raddr segment."""
    return F.SEND_INLINE_OFFSET if w.opcode in SENDS else INLINE_OFFSET


def gather(w):
    """``(held, segments)`` of a WQE record as the parser hands it on: ``held``, a pointer
    data WQE of two or more segments (ds past the first; the parser holds it a cycle to
    sum them); ``segments``, its non-empty pointer segments ``[(addr, length)]`` in order
    (what the payload fetch reads and the builder packs). From the WQE's bytes (``wqe``)
    when the record has them, else its ``local_addr`` and ``length``."""
    if w.opcode not in WRITE_LIKE or w.inline:
        return False, []
    head = 1 if w.opcode in SENDS else 2
    raw, ds = getattr(w, "wqe", None), getattr(w, "ds", None)
    if raw is None or ds is None or ds <= head + 1:
        return False, [(w.local_addr, w.length)] if w.length else []
    from model.frames import parse_wqe
    segs = parse_wqe(raw, two_sided=True, max_gather=P.REQUESTER_GATHER).segments
    return True, [(a, n) for a, n, _ in segs if n]


class _Fifo:
    """A FIFO whose items show ``latency`` cycles after they are written."""
    def __init__(self, depth, latency):
        self.depth, self.latency = depth, latency
        self.items = deque()

    def can_push(self):
        return len(self.items) < self.depth

    def push(self, t, item):
        self.items.append((t + self.latency, item))

    def head(self, t):
        if self.items and self.items[0][0] <= t:
            return self.items[0][1]
        return None

    def pop(self):
        return self.items.popleft()[1]


@dataclass
class _Qp:
    mtu: int
    depth: int
    wqes: dict                     # WQEBB index (mod 2**16) -> WQE record
    weight: int = 1
    sq_base: int = 0
    reach: int = F.MAX_WQEBBS - 1   # WQEBBs read past a quantum's cut (QP_MAX_WQEBBS - 1)
    byte_turn: int = 0             # turns at most this many WQEBBs (the parser's TURN_BYTES bound)
    pi: int = 0                    # QP table: producer index, fetch index, in the active FIFO
    fi: int = 0
    queued: bool = False
    first: bool = True             # no turn yet since the create: at most FIRST_TURN_WQEBBS
    ci: int = 0                    # parser: consumer index


@dataclass
class Prediction:
    frames: list = field(default_factory=list)   # (qpn, wqe index, first beat, last beat, wire start, length)
    cqes: dict = field(default_factory=dict)     # (qpn, wqe index) -> cycle of the CQE write
    first_beat: dict = field(default_factory=dict)  # (qpn, wqe index) -> cycle of its first frame's first beat


class EngineCycleModel:
    """Predicts when every frame and CQE of a run leaves the engine.

    Parameters
    ----------
    qps : {qpn: (mtu_bytes, sq_depth_wqebbs, [posted WQE records][, weight[, sq_base[, max_wqebbs]]])}; a record has
        ``index``, ``nwqebbs``, ``inline`` (bool), ``length``, ``local_addr``,
        ``signaled`` and ``opcode``.
    doorbells : [(cycle of the (last) W handshake, qpn, producer limit[, BlueFlame])], in order.
    dma_latency : GPU memory read latency in cycles.
    """
    def __init__(self, qps, doorbells, *, dma_latency=P.DMA_READ_LATENCY_CYCLES):
        self.qps = {}
        for qpn, (mtu, depth, posted, *rest) in qps.items():
            wqes = {}
            for w in posted:
                if w.opcode not in WRITE_LIKE + (F.WqeOp.NOP,):
                    raise ValueError(f"the cycle model covers RDMA WRITE (with immediate), SEND and NOP, not opcode {w.opcode:#x}")
                wqes[w.index & 0xFFFF] = w
            weight = min(max(rest[0] if rest else 1, 1), P.MAX_WEIGHT)
            size = rest[2] if len(rest) > 2 else F.MAX_WQEBBS
            self.qps[qpn] = _Qp(mtu, depth, wqes, weight=weight, sq_base=rest[1] if len(rest) > 1 else 0,
                                reach=(size if 1 <= size <= F.MAX_WQEBBS else F.MAX_WQEBBS) - 1)
        self.doorbells = deque(sorted(doorbells))
        self.latency = dma_latency

    # ------------------------------------------------------------------------------------
    def run(self, max_cycles=2_000_000):
        L = self.latency
        db_fifo = _Fifo(16, 2)
        active = _Fifo(P.NUM_QPS, 2)
        job_fifo = _Fifo(4, 2)
        burst_fifo = _Fifo(P.BURST_QUEUE_DEPTH, 2)
        bf_fifo = _Fifo(4, 2)
        wqebb_buf = _Fifo(P.WQE_BUFFER_WQEBBS, 2)
        inline_fifo = _Fifo(P.INLINE_QUEUE_BEATS, 2)
        msg_fifo = _Fifo(P.MESSAGE_QUEUE_DEPTH, 2)
        payload_buf = _Fifo(P.PAYLOAD_BUFFER_BEATS, 2)
        cpl_fifo = _Fifo(16, 2)
        trk_out = _Fifo(1, 1)                 # the completion tracker's output register (UC: passes)
        reads = {"wqe": deque(), "payload": deque()}   # per port: (cycle of the beat, item)
        last_beat = {"wqe": -1, "payload": -1}   # last R beat of each read port

        qpt_state, qpt_op = "IDLE", None
        wf_job, wf_left, wf_index, wf_credits = None, 0, 0, 0
        ps = {"state": "IDLE"}
        pf_bursts, pf_credits, pf_msg = deque(), 0, None
        builder = _StreamBuilder()
        cw_state, cw_item = "IDLE", None
        out = Prediction()

        def read(t, dest, beats):
            for i in range(beats):
                c = max(t + L + i, last_beat[dest] + 1)
                last_beat[dest] = c
                reads[dest].append((c, i))

        # byte-bound bursts ahead of the parser (QpTable.turns_ahead, 0: no bound): registers
        ahead = {"n": 0, "full": False, "out_q": False, "taken_q": False, "out": False, "taken": False}
        self._ahead = ahead
        t = self.doorbells[0][0] if self.doorbells else 0
        while t < max_cycles:
            # --- start-of-cycle views -----------------------------------------------------
            wqe_pops = payload_pops = 0
            # doorbell decoder: the W handshake pushes the event in the same cycle
            while self.doorbells and self.doorbells[0][0] == t:
                _, qpn, limit, *bf = self.doorbells.popleft()
                db_fifo.push(t, (qpn, limit, bool(bf and bf[0])))
            # read data arriving this cycle
            rq = reads["wqe"]
            while rq and rq[0][0] == t:
                for bb in rq.popleft()[1]:           # one or two WQEBBs per beat
                    wqebb_buf.push(t, bb)
            rq = reads["payload"]
            while rq and rq[0][0] == t:
                payload_buf.push(t, rq.popleft()[1])

            # --- QP table ------------------------------------------------------------------
            update_taken = turn_taken = False
            if qpt_state == "EXEC":
                kind, arg = qpt_op
                q = self.qps[arg[0]]
                if kind == "turn":               # the parser's bound on the QP's turns
                    q.byte_turn = arg[1]
                elif kind == "update":           # a cut WQE: fetch again from it once more is posted
                    _, ci, end = arg
                    q.fi = ci
                    if not q.queued and q.pi != ci and q.pi != end:
                        active.push(t, arg[0])
                        q.queued = True
                elif kind == "doorbell" and arg[2] and not q.queued and q.pi == q.fi \
                        and arg[1] == (q.fi + 1) & 0xFFFF and job_fifo.can_push() and bf_fifo.can_push():
                    # BlueFlame: the WQE is the QP's only work, it goes at once without a read
                    job_fifo.push(t, (arg[0], q.fi, 1, 1, True, q.byte_turn))
                    ahead["out"] = bool(q.byte_turn)
                    bf_fifo.push(t, (arg[0], q.fi))
                    q.pi = q.fi = arg[1]
                elif kind == "doorbell":
                    q.pi = arg[1]
                    if not q.queued and arg[1] != q.fi:
                        active.push(t, arg[0])
                        q.queued = True
                else:
                    pending = (q.pi - q.fi) & 0xFFFF
                    quantum = q.weight * P.QUANTUM_WQEBBS
                    if q.first:
                        quantum = min(quantum, P.FIRST_TURN_WQEBBS)
                    if q.byte_turn:
                        quantum = min(quantum, q.byte_turn)
                    if pending:
                        q.first = False
                        own = min(pending, quantum)
                        over = min(pending - quantum, q.reach) if pending > quantum else 0
                        job_fifo.push(t, (arg[0], q.fi, own + over, own, False, q.byte_turn))
                        ahead["out"] = bool(q.byte_turn)
                        q.fi = (q.fi + own) & 0xFFFF
                        if pending > quantum:
                            active.push(t, arg[0])
                        else:
                            q.queued = False
                    else:
                        q.queued = False
                qpt_state = "IDLE"
            elif qpt_state == "IDLE":
                if ps["state"] == "END" and ps.get("report"):
                    qpt_op, update_taken = ("update", ps["report"]), True
                    qpt_state = "EXEC"
                elif ps.get("turn") is not None:
                    qpt_op, turn_taken = ("turn", ps["turn"]), True
                    qpt_state = "EXEC"
                elif db_fifo.head(t) is not None:
                    qpt_op, qpt_state = ("doorbell", db_fifo.pop()), "EXEC"
                elif active.head(t) is not None and job_fifo.can_push() and not ahead["full"]:
                    qpt_op, qpt_state = ("schedule", (active.pop(),)), "EXEC"

            # --- WQE fetch -------------------------------------------------------------------
            wqe_issued = 0
            if wf_left > 0:
                q = self.qps[wf_job[0]]
                slot = wf_index & (q.depth - 1)
                addr = q.sq_base + slot * F.WQEBB
                run = min(wf_left, q.depth - slot, (4096 - addr % 4096) // F.WQEBB, P.WQE_MAX_RUN)
                if wf_credits + run <= P.WQE_BUFFER_WQEBBS:
                    lane = (addr >> 6) & 1
                    beats = (lane + run + 1) // 2
                    rq = reads["wqe"]
                    start = len(rq)
                    read(t, "wqe", beats)
                    tags = [(wf_job[0], (wf_index + i) & 0xFFFF) for i in range(run)]
                    for k in range(start, len(rq)):
                        n = 2 - lane if k == start else 2
                        rq[k] = (rq[k][0], tags[:n])
                        tags = tags[n:]
                    wqe_issued = run
                    wf_left -= run
                    wf_index += run
            if wf_left == 0:                     # idle, or the last read went this cycle
                job = job_fifo.head(t)
                if job is not None and burst_fifo.can_push():
                    job_fifo.pop()
                    burst_fifo.push(t, job)
                    if not job[4]:                   # BlueFlame: nothing to read
                        wf_job, wf_left, wf_index = job, job[2], job[1]

            # --- WQE parser ------------------------------------------------------------------
            # the payload fetch passes a message on when it is free or frees up this cycle
            pf_fire = bool(pf_bursts) and pf_credits + pf_bursts[0] <= P.PAYLOAD_BUFFER_BEATS
            msg_ready = msg_fifo.can_push() and (not pf_bursts or (len(pf_bursts) == 1 and pf_fire))
            before = len(wqebb_buf.items)
            src = bf_fifo if ps.get("bf") else wqebb_buf
            self._turn_step(ps, turn_taken)
            emitted = self._parser_step(t, ps, burst_fifo, src, inline_fifo, msg_ready, update_taken)
            wqe_pops = before - len(wqebb_buf.items)
            # --- payload fetch ---------------------------------------------------------------
            issued = 0
            free = not pf_bursts
            if pf_fire:
                n = pf_bursts.popleft()
                rq = reads["payload"]
                start = len(rq)
                read(t, "payload", n)
                for k in range(start, len(rq)):
                    rq[k] = (rq[k][0], (id(pf_msg["wqe"]), k - start))
                issued = n
                free = not pf_bursts
            if isinstance(emitted, dict):
                assert free
                msg_fifo.push(t, emitted)
                w = emitted["wqe"]
                if w.opcode in WRITE_LIKE and not w.inline and w.length:
                    pf_bursts = deque(n for a, k in gather(w)[1]          # segment after segment
                                      for _, n in P.axi_bursts(a, k, BEAT, P.PAYLOAD_MAX_BURST_BEATS))
                    pf_msg = emitted

            # --- builder, ICRC stage, MAC port -------------------------------------------------
            payload_pops = builder.step(t, msg_fifo, payload_buf, inline_fifo, cpl_fifo, out)

            # --- CQE writer ---------------------------------------------------------------------
            if cw_state == "WRITE":
                out.cqes[cw_item] = t
                cw_state = "IDLE"
            elif cw_state == "IDLE" and trk_out.head(t) is not None:
                cw_item, cw_state = trk_out.pop(), "WRITE"
            # --- completion tracker: a UC QP's completion passes through its output register
            if trk_out.can_push() and cpl_fifo.head(t) is not None:
                trk_out.push(t, cpl_fifo.pop())

            n = ahead["n"] + ahead["out_q"] - ahead["taken_q"]
            ahead.update(n=n, full=bool(P.TURNS_AHEAD) and n >= P.TURNS_AHEAD, out_q=ahead["out"], taken_q=ahead["taken"], out=False,
                         taken=False)
            wf_credits += wqe_issued - wqe_pops
            pf_credits += issued - payload_pops
            if self._done(qpt_state, wf_left, ps, pf_bursts, builder, cw_state, reads, db_fifo, active,
                          job_fifo, burst_fifo, bf_fifo, wqebb_buf, msg_fifo, cpl_fifo, trk_out):
                return out
            t += 1
        raise RuntimeError(f"the cycle model did not finish in {max_cycles} cycles")

    def _done(self, qpt_state, wf_left, ps, pf_bursts, builder, cw_state, reads, *fifos):
        return (not self.doorbells and qpt_state == "IDLE" and wf_left == 0 and ps["state"] == "IDLE"
                and not pf_bursts and builder.idle() and cw_state == "IDLE" and not any(reads.values())
                and all(not f.items for f in fifos))

    # ------------------------------------------------------------------------------------
    @staticmethod
    def _turn_step(ps, taken):
        """The parser's byte-bound turns: the take noted last cycle counted (``ps["tk"]``),
        its bound (``ps["turn"]``, for the QP table) set when the register is free or taken."""
        tk, ps["tk"] = ps.get("tk"), None
        report = None
        if tk is not None:
            was = ps.get("reached", False) and not tk["first"]
            total = (0 if tk["first"] else ps.get("acc", 0)) + tk["len"]
            full = total >= tk["goal"]
            value = tk["end"] if tk["end"] < 256 else 0
            if not was and full and value != tk["bound"]:
                report = (tk["qpn"], value)
            elif tk["last"] and not was and not full and tk["bounded"]:
                report = (tk["qpn"], 0 if tk["bound"] >= 128 else 2 * tk["bound"])   # the bound doubles
            ps["acc"], ps["reached"] = total % (16 * P.TURN_BYTES), was or full   # (the RTL's acc: total's low bits)
        if report is not None and (ps.get("turn") is None or taken):
            ps["turn"] = report
        elif taken:
            ps["turn"] = None

    def _parser_step(self, t, ps, bursts, wqebbs, inline_fifo, msg_ready, update_taken):
        """One cycle of the WQE parser; returns the message dict it hands on, if any."""
        st = ps["state"]

        def start_burst():
            job = bursts.head(t)
            if job is not None:
                bursts.pop()
                if job[5]:
                    self._ahead["taken"] = True
                ps.update(state="RUN", qpn=job[0], start=job[1], index=job[1], left=job[2], count=job[2], bf=job[4],
                          bound=job[5],
                          own=job[3], end=(job[1] + job[2]) & 0xFFFF, fresh=True, cut=False, stale=False,
                          report=None, got=0, gsum=False)
            else:
                ps["state"] = "IDLE"

        def drop_then(n, then_run=False):
            if n == 0:
                ps["state"] = "RUN" if then_run else "END"
            else:
                ps.update(drop=n, after=then_run, state="DROP")

        def end_state():
            ps["state"] = "END"
            if ps["cut"] and not ps["stale"]:
                ps["report"] = (ps["qpn"], ps["index"], ps["end"])

        if st == "IDLE":
            start_burst()
            return None
        if st == "RUN":
            q = self.qps[ps["qpn"]]
            skip = (q.ci - ps["start"]) & 0xFFFF
            if ps["fresh"] and skip > ps["count"]:
                ps.update(stale=True, drop=ps["left"], after=False, state="DROP")
                return None
            if ps["fresh"] and skip and ps["index"] != q.ci:
                ps["index"] = q.ci
                ps["left"] -= skip
                drop_then(skip, True)
                return None
            if ps["left"] == 0:
                end_state()
                return None
            if ps["got"] == 0 and (ps["index"] - ps["start"]) & 0xFFFF >= ps["own"]:
                drop_then(ps["left"])
                return None
            if wqebbs.head(t) is None:
                return None
            w = q.wqes[ps["index"] & 0xFFFF]
            if ps["got"] == 0 and w.nwqebbs > ps["left"]:
                ps["cut"] = True
                drop_then(ps["left"])
                return None
            if ps["got"] + 1 < w.nwqebbs:
                wqebbs.pop()
                ps["got"] += 1
                ps["left"] -= 1
                return None
            if gather(w)[0] and not ps["gsum"]:
                ps["gsum"] = True               # a gather list: summed this cycle, taken in the next
                return None
            send_inline = w.opcode in WRITE_LIKE and w.inline and w.length
            if not msg_ready or (send_inline and not inline_fifo.can_push()):
                return None
            wqebbs.pop()
            rel = (ps["index"] - ps["start"]) & 0xFFFF
            length = w.length if w.opcode in WRITE_LIKE and not getattr(w, "error", None) else 0
            ps["tk"] = {"first": ps["fresh"], "last": rel + w.nwqebbs >= ps["own"], "end": rel + w.nwqebbs,
                        "len": min(length, 16 * P.TURN_BYTES), "goal": q.weight * P.TURN_BYTES,
                        "qpn": ps["qpn"], "bound": ps["bound"],
                        "bounded": ps["bound"] != 0 and ps["own"] == ps["bound"]}
            msg = {"qpn": ps["qpn"], "wqe": w, "mtu": q.mtu}
            if send_inline:
                inline_fifo.push(t, (id(w), 0))
            ps["index"] = (ps["index"] + w.nwqebbs) & 0xFFFF
            ps["left"] -= 1
            ps["got"] = 0
            ps["gsum"] = False
            ps["fresh"] = False
            q.ci = ps["index"]                  # the parser's own copy (the RTL writes it at END)
            if send_inline and inline_offset(w) + w.length > BEAT:
                ps["state"] = "INLINE1"
                ps["wqe"] = w
            elif ps["left"] == 0:
                start_burst()                   # the last WQE ends the burst: no END cycle
            return msg
        if st == "INLINE1":
            if inline_fifo.can_push():
                inline_fifo.push(t, (id(ps["wqe"]), 1))
                ps["state"] = "END" if ps["left"] == 0 else "RUN"
            return None
        if st == "DROP":
            if wqebbs.head(t) is not None:
                wqebbs.pop()
                ps["drop"] -= 1
                if ps["drop"] == 0:
                    if ps["after"]:
                        ps["state"] = "RUN"
                    elif not ps["cut"]:
                        start_burst()           # nothing to report: the burst ends here
                    else:
                        end_state()
                return None
            return None
        if st == "END":
            if ps.get("report") and not update_taken:
                return None
            start_burst()
            return None
        raise AssertionError(st)


def isolated_write(posted, qp, *, dma_latency, blueflame=False):
    """Predicted ``db_to_first_beat`` and ``db_to_cqe`` cycles of a WRITE that meets an idle engine.

    The engine's cycle model run on this WQE alone, its doorbell at cycle 0.

    Parameters
    ----------
    posted : a posted WQE record (``nwqebbs``, ``inline``, ``local_addr``, ``length``, ...).
    qp : its QP (``mtu`` in bytes).
    dma_latency : GPU-memory read latency in cycles.
    blueflame : the WQE comes in a BlueFlame store (cycle 0 = its last beat), not by a read.
    """
    w = copy.copy(posted)
    w.index, w.signaled = 0, True
    pred = EngineCycleModel({posted.qpn: (qp.mtu, 1 << 15, [w])}, [(0, posted.qpn, w.nwqebbs, blueflame)],
                            dma_latency=dma_latency).run()
    return {"db_to_first_beat": pred.first_beat[(posted.qpn, 0)], "db_to_cqe": pred.cqes[(posted.qpn, 0)]}


class _StreamBuilder:
    """Packet builder + ICRC stage + MAC port + completion hand-off, cycle by cycle.

    The builder is followed byte count by byte count, as rtl/requester/packet_builder.py
    packs: one chunk per cycle (a chunk ends at a raw-beat, segment or packet boundary), 4
    ICRC bytes at each packet's end, a last beat of at most 64 bytes held and
    merged with the next packet's first beat (which then starts at lane 64) when
    that chunk is there in the next cycle and fills the beat.
    """
    PER = int(P.WIRE_BYTES_PER_CYCLE)

    def __init__(self):
        self.state = "MESSAGE"
        self.msg = None
        self.reg = None                # ICRC stage register: the beat in it
        self.held = None               # held last beat of a packet
        self.wire_end = 0              # wire end of the last frame that started
        self.done_end = 0              # wire end of the last frame that ended
        self.open = {}                 # frame key -> index in out.frames

    def idle(self):
        return self.state == "MESSAGE" and self.reg is None and self.held is None

    # ---- message and packet bookkeeping ------------------------------------------------
    def _take(self, t, msg_fifo):
        """Take the next descriptor (in MESSAGE, or as a message's last beat leaves)."""
        self.state = "MESSAGE"
        m = msg_fifo.head(t)
        if m is None:
            return
        msg_fifo.pop()
        self.msg = m
        w = m["wqe"]
        if w.opcode in WRITE_LIKE:
            self.msg_left = w.length
            self.rest = w.length
            self.pkt_first = True
            segs = [(inline_offset(w), w.length)] if w.inline else gather(w)[1] or [(w.local_addr or 0, 0)]
            self.pos = segs[0][0] % BEAT
            self.seg_left, self.seg_q = segs[0][1], segs[1:]     # the current segment, the ones after
            self.psn_k = 0
            self._start_packet()
            self.state = "PACKET"
        elif w.signaled:
            self.state = "MARKER"

    def _start_packet(self):
        mtu = self.msg["mtu"]
        self.pkt_len = min(self.rest, mtu)
        self.rest -= self.pkt_len
        self.pkt_left = self.pkt_len
        self.is_last = self.rest == 0
        self.pkt_start = True
        self.emitted = 0               # beats of this packet handed on
        w = self.msg["wqe"]
        reth = self.pkt_first and w.opcode not in SENDS
        hlen = (F.HDR_LEN_RETH if reth else F.HDR_LEN_NO_RETH) + (F.IMMDT_LEN if self.is_last and w.opcode in WITH_IMM else 0)
        self.hlen = hlen
        self.tail = F.ICRC_LEN + F.pad_count(self.pkt_len)     # the IBTA pad, then the ICRC
        self.flen = hlen + self.pkt_len + self.tail
        self.key = (self.msg["qpn"], self.msg["wqe"].index & 0xFFFF, self.psn_k)

    def _next_packet(self, t, msg_fifo):
        if self.is_last:
            self._take(t, msg_fifo)
        else:
            self.pkt_first = False
            self.psn_k += 1
            self._start_packet()
            self.state = "PACKET"

    def _cpl(self):
        w = self.msg["wqe"]
        return (self.msg["qpn"], w.index & 0xFFFF) if w.signaled else None

    def _frame(self):
        return {"key": self.key, "qpn": self.msg["qpn"], "index": self.msg["wqe"].index & 0xFFFF,
                "len": self.flen}

    def _beat(self, *, last, cpl=None, hi=None):
        """A beat of the current packet (``hi``: a frame that starts at lane 64)."""
        b = {"frame": True, "start": self._frame() if self.emitted == 0 else None, "end": None,
             "cpl": None, "hi": hi}
        if last:
            b["end"] = self.key
            b["cpl"] = self._cpl() if self.is_last else None
        self.emitted += 1
        return b

    def _hold(self, nbytes):
        self.held = {"start": self._frame() if self.emitted == 0 else None, "end": self.key,
                     "cpl": self._cpl() if self.is_last else None, "n": nbytes}

    def _held_beat(self, hi=None):
        h, self.held = self.held, None
        return {"frame": True, "start": h["start"], "end": h["end"], "cpl": h["cpl"], "hi": hi}

    # ---- one cycle -----------------------------------------------------------------------
    def step(self, t, msg_fifo, payload_buf, inline_fifo, cpl_fifo, out):
        pops = 0
        # MAC side first: does the ICRC register's beat leave this cycle?
        reg_leaves = False
        if self.reg is not None:
            beat = self.reg
            ok = beat["cpl"] is None or cpl_fifo.can_push()
            if beat["frame"] and not self.done_end <= self.PER * (t + 1):
                ok = False
            reg_leaves = ok
        can_take = self.reg is None or reg_leaves
        new_beat = None

        if self.state == "MESSAGE":
            if self.held is not None and can_take:
                new_beat = self._held_beat()
            self._take(t, msg_fifo)
        elif self.state == "MARKER":
            if self.held is not None:
                if can_take:
                    new_beat = self._held_beat()
            elif can_take:
                new_beat = {"frame": False, "start": None, "end": None, "cpl": self._cpl(), "hi": None}
                self._take(t, msg_fifo)
        elif self.state == "PACKET":
            src = inline_fifo if self.msg["wqe"].inline else payload_buf
            need_raw = self.pkt_left != 0
            has = (not need_raw) or src.head(t) is not None
            n = min(self.pkt_left, BEAT - self.pos, self.seg_left)
            chunk_last = n == self.pkt_left
            seg_end = n == self.seg_left
            icrc = self.tail if chunk_last else 0
            merge = (self.held is not None and self.pkt_start and has and self.flen > SEG + F.ICRC_LEN
                     and SEG + self.hlen + n + icrc >= BEAT)
            if self.held is not None and self.pkt_start and not merge:
                if can_take:
                    new_beat = self._held_beat()
            else:
                if not self.pkt_start:
                    base = self.rcount
                else:
                    base = SEG + self.hlen if merge else self.hlen
                total = base + n + icrc
                emit = total >= BEAT
                hold_now = chunk_last and total <= SEG
                fires = emit or (chunk_last and not hold_now)
                if has and (not fires or can_take):
                    if fires:
                        if merge:
                            new_beat = self._held_beat(hi=self._frame())
                            self.emitted += 1
                        else:
                            new_beat = self._beat(last=chunk_last and total <= BEAT)
                    if need_raw and (self.pos + n == BEAT or seg_end):
                        src.pop()
                        if src is payload_buf:
                            pops += 1
                    if seg_end and self.seg_q:        # the next segment, from its first beat's offset
                        addr, self.seg_left = self.seg_q.pop(0)
                        self.pos = addr % BEAT
                    else:
                        self.pos = (self.pos + n) % BEAT
                        self.seg_left -= n
                    self.msg_left -= n
                    self.pkt_left -= n
                    self.pkt_start = False
                    self.rcount = total - BEAT if emit else total
                    if chunk_last:
                        if total > BEAT + SEG:
                            self.flush_left = total - BEAT
                            self.state = "FLUSH"
                        elif total > BEAT:
                            self._hold(total - BEAT)
                            self._next_packet(t, msg_fifo)
                        else:
                            if hold_now:
                                self._hold(total)
                            self._next_packet(t, msg_fifo)
        elif self.state == "FLUSH":
            final = self.flush_left <= BEAT
            hold_now = final and self.flush_left <= SEG
            if hold_now or can_take:
                if hold_now:
                    self._hold(self.flush_left)
                else:
                    new_beat = self._beat(last=final)
                self.flush_left -= BEAT
                if final:
                    self._next_packet(t, msg_fifo)

        if reg_leaves:
            beat = self.reg
            if beat["frame"]:
                if beat["start"] is not None:
                    self._open(t, beat["start"], out)
                if beat["end"] is not None:
                    k = self.open.pop(beat["end"])
                    out.frames[k][3] = t
                    self.done_end = out.frames[k][4] + P.wire_bytes(out.frames[k][5])
                if beat["hi"] is not None:
                    self._open(t, beat["hi"], out)
            if beat["cpl"] is not None:
                cpl_fifo.push(t, beat["cpl"])
            self.reg = None
        if new_beat is not None:
            self.reg = new_beat
        return pops

    def _open(self, t, f, out):
        start = max(self.PER * t, self.wire_end)
        self.wire_end = start + P.wire_bytes(f["len"])
        self.open[f["key"]] = len(out.frames)
        out.frames.append([f["qpn"], f["index"], t, None, start, f["len"]])
        out.first_beat.setdefault((f["qpn"], f["index"]), t)
