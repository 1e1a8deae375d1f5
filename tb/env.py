"""System testbench environment: the NIC with its GPU, memory and wire around it.

``NicEnv`` starts the clock, resets the DUT, attaches the models (GPU memory on
``m_axi``, ``m_axi_wqe`` and ``m_axi_rx``, the 400G wire on ``m_axis_tx``, the CPU on ``s_axil``, the GPU's
doorbells on ``s_axi_db``) and checks a run against the golden model: every frame
(bytes, parsed by scapy with checksum and ICRC recomputed), every CQE, the
counters, and the cycle of each doorbell-to-wire and doorbell-to-CQE event.
"""
import json
import logging
import os
from pathlib import Path

from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from model.cqe import CqContext
from model.cycle_model import isolated_write
from model.engine import EngineModel
from model.frames import Port, QpContext
from spec import params as P
from spec.formats import (BTH, CQE_SIZE, CTRL_SEG, MAX_WQEBBS, OFF_BTH, mtu_code, unpack, CQE64, doorbell_limit, read_field,
                          QpModify, QpState, qp_modify_action)
from tb.clock import ClockCycles, CycleCounter
from tb.control import NicControl
from tb.gpu import GpuModel
from tb.memory import DmaMemory
from tb.roce_check import check_frame, diff_cqe, diff_frames
from tb.mac_rx import MacRx400G
from tb.wire import Wire400G

# The verbs the engine's requester executes, as the golden model is told them: SEND,
# SEND_IMM and WRITE_IMM besides WRITE, with at most spec.params.REQUESTER_GATHER pointer
# segments per WQE.
ENGINE_VERBS = dict(two_sided=True, max_gather=P.REQUESTER_GATHER)


PORT_MAC = 0x02_00_00_00_00_01
PORT_IP = 0xC0A8_0001            # 192.168.0.1


def _input_ports(prefix=""):
    """The engine's inputs but its clock and reset, by name (without ``prefix``). Read
    from the list tb/runner.py writes beside the model (``IBGDA_INPUTS``): the engine's
    signature would cost each simulation the import of Amaranth and rtl/ (half a second
    of every test)."""
    path = os.environ.get("IBGDA_INPUTS")
    if path:
        names = json.loads(Path(path).read_text())
    else:
        from amaranth.lib import wiring
        from rtl.top import IbgdaNic
        names = [n for n, m in IbgdaNic().signature.members.items() if m.flow == wiring.In]
    return [n[len(prefix):] for n in names if n.startswith(prefix) and n[len(prefix):] not in ("clk", "rst")]


def peer_mac(qpn):
    return 0x02_00_00_01_00_00 | qpn


def peer_ip(qpn):
    return 0xC0A8_0100 | (qpn & 0xFF)


class NicEnv:
    """The NIC under test and everything around it.

    Parameters
    ----------
    dut : the cocotb handle of ``ibgda_nic``.
    dma_latency : int
        GPU memory read latency in cycles (default: SPEC, 1 us = 500 cycles).
    dma_bytes_per_cycle : int
        GPU memory read bandwidth.
    b_latency, visible_at_b : as ``tb.memory.DmaMemory`` (write-response latency, a
        write landing only at its B).
    """
    def __init__(self, dut, *, dma_latency=P.DMA_READ_LATENCY_CYCLES, dma_bytes_per_cycle=P.DMA_BYTES_PER_CYCLE,
                 poll_interval=16, prefix="", port_mac=PORT_MAC, port_ip=PORT_IP, num_qps=P.NUM_QPS,
                 b_latency=1, visible_at_b=False):
        self.b_latency, self.visible_at_b = b_latency, visible_at_b
        self.dut = dut
        self.dma_latency = dma_latency
        self.dma_bytes_per_cycle = dma_bytes_per_cycle
        self.poll_interval = poll_interval
        self.prefix = prefix                 # "n<i>_" for NIC i of an ``ibgda_nic_pair``
        self.port_mac, self.port_ip = port_mac, port_ip
        self.num_qps = num_qps
        self.log = dut._log

    def attach(self, counter):
        """Attach the models to this NIC's ports (the clock runs, reset is asserted)."""
        dut, pre = self.dut, self.prefix
        for name in _input_ports(pre):       # no X into the design before the models drive
            getattr(dut, pre + name).value = 0
        for name in ("s_axil", "s_axi_db", "m_axi", "m_axi_wqe", "m_axi_rx", "m_axis_tx", "s_axis_rx"):
            logging.getLogger(f"cocotb.{dut._name}.{pre}{name}").setLevel(logging.WARNING)
        self.counter = counter
        self.mem = DmaMemory(dut, counter, read_latency=self.dma_latency, prefix=pre + "m_axi",
                             read_bytes_per_cycle=self.dma_bytes_per_cycle, read_prefixes=(pre + "m_axi_wqe",),
                             write_prefixes=(pre + "m_axi_rx",), b_latency=self.b_latency,
                             visible_at_b=self.visible_at_b)
        self.wire = Wire400G(dut, counter, prefix=pre + "m_axis_tx")
        self.rx = MacRx400G(dut, counter, prefix=pre + "s_axis_rx")
        self.ctl = NicControl(dut, prefix=pre + "s_axil", num_qps=self.num_qps, num_cqs=self.num_qps)
        self.gpu = GpuModel(dut, self.mem, self.ctl, counter, poll_interval=self.poll_interval, prefix=pre + "s_axi_db")
        self.qps, self.cqs = {}, {}

    async def configure(self):
        """After reset: the port's addresses."""
        await self.ctl.set_port(self.port_mac, self.port_ip)
        return self

    async def start(self):
        """Clock, reset and models for a design with this one NIC."""
        dut = self.dut
        Clock(dut.clk, P.CLOCK_PERIOD_NS, unit="ns").start()
        dut.rst.value = 1
        self.attach(CycleCounter(dut.clk))
        await ClockCycles(dut.clk, 8)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        return await self.configure()

    async def cq(self, cqn, log_depth=6, collapsed=False):
        cq = await self.gpu.create_cq(cqn, log_depth, collapsed)
        self.cqs[cqn] = cq
        return cq

    async def qp(self, qpn, cq, *, log_depth=8, mtu=P.DEFAULT_MTU, start_psn=None, weight=1,
                 remote_qpn=None, uc=True, dmac=None, dip=None, **receive):
        """Create QP ``qpn`` whose peer is QP ``remote_qpn`` (default 0x1000 + qpn) at
        ``dmac``/``dip`` (default ``peer_mac/peer_ip(qpn)``); ``receive``: rq_psn, pd,
        ack_every of its receive side.

        One NIC alone has no responder to acknowledge its packets, so its QPs are UC by
        default (a WQE completes when sent); the two-NIC regressions use RC."""
        start_psn = (0x100 * qpn + 7) & 0xFFFFFF if start_psn is None else start_psn
        remote_qpn = 0x1000 + qpn if remote_qpn is None else remote_qpn
        dmac = peer_mac(qpn) if dmac is None else dmac
        dip = peer_ip(qpn) if dip is None else dip
        qp = await self.gpu.create_qp(qpn, log_depth, cq, remote_qpn=remote_qpn, dmac=dmac,
                                      dip=dip, start_psn=start_psn, mtu_code=mtu_code(mtu),
                                      weight=weight, uc=uc, **receive)
        qp.mtu, qp.start_psn, qp.remote_qpn, qp.dmac, qp.dip = mtu, start_psn, remote_qpn, dmac, dip
        qp.ctl_state = qp.created_state = receive.get("state", QpState.RTS)
        self.qps[qpn] = qp
        return qp

    async def modify_qp(self, qp, state, *, start_psn=None, rq_psn=None):
        """QP_MODIFY of ``qp`` to ``state`` (``spec.formats.qp_modify_action``): True when
        the NIC took it (recorded for the model; a send-side reset restarts the ring),
        False when it answered SLVERR."""
        ok = await self.ctl.modify_qp(qp.qpn, state=state, start_psn=start_psn, rq_psn=rq_psn)
        if ok:
            action = qp_modify_action(qp.ctl_state, state)
            qp.modifies.append((len(qp.posted), state, start_psn))
            qp.ctl_state = state
            if action in (QpModify.CREATE, QpModify.SEND_RESET):
                qp.restart()
        return ok

    async def set_weight(self, qp, weight):
        """Change a QP's scheduler weight through the control path (QP_MODIFY)."""
        await self.ctl.modify_qp(qp.qpn, weight=weight)
        qp.weight = weight

    def payload(self, length, align=128, offset=0, seed=0):
        """Allocate a payload buffer in GPU memory filled with a known pattern."""
        addr = self.gpu.alloc(length + offset + 1, align) + offset
        data = bytes((seed * 31 + i * 7 + (i >> 8)) & 0xFF for i in range(length))
        self.gpu.write(addr, data)
        return addr, data

    # ---- waiting --------------------------------------------------------------------
    async def wait_for(self, predicate, timeout_cycles, what):
        for _ in range(timeout_cycles // 16):
            if predicate():
                return
            await ClockCycles(self.dut.clk, 16)
        raise TimeoutError(f"timed out after {timeout_cycles} cycles waiting for {what() if callable(what) else what}")

    async def drain(self, timeout_cycles=200_000):
        """Wait until the model's frames and CQEs have all appeared, then a little more."""
        pred = self.predict()
        want_frames = pred.totals.packets
        want_cqes = pred.totals.cqes
        await self.wait_for(lambda: len(self.wire.frames) >= want_frames
                            and len(self.cqe_writes()) >= want_cqes,
                            timeout_cycles, lambda: f"{want_frames} frames and {want_cqes} CQEs "
                            f"(got {len(self.wire.frames)} and {len(self.cqe_writes())})")
        await ClockCycles(self.dut.clk, 2 * self.dma_latency + 200)   # nothing extra may follow
        return pred

    # ---- golden model ------------------------------------------------------------------
    def model(self):
        qps = {q: QpContext(qpn=q, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                            sq_base=qp.sq_base, log_depth=qp.log_depth, cqn=qp.cq.cqn,
                            start_psn=qp.start_psn, mtu=qp.mtu, user_index=qp.user_index,
                            state=getattr(qp, "created_state", QpState.RTS))
               for q, qp in self.qps.items()}
        cqs = {c: CqContext(cqn=c, log_depth=cq.log_depth, base=cq.base, collapsed=cq.collapsed)
               for c, cq in self.cqs.items()}
        return EngineModel(Port(self.port_mac, self.port_ip), qps, cqs, self.mem.read, **ENGINE_VERBS)

    def predict(self):
        engine = self.model()
        for qpn, qp in self.qps.items():
            mods = list(qp.modifies)
            for i, w in enumerate(qp.posted + [None]):
                while mods and mods[0][0] == i:
                    _, state, psn = mods.pop(0)
                    engine.modify(qpn, state, psn)
                if w is not None:
                    engine.post(qpn, w.wqe)
        self.engine = engine
        return engine.result()

    def cqe_writes(self):
        """(cqn, slot, 64 bytes, cycle) of every CQE write seen on the DMA bus, in order."""
        out = []
        for w in self.mem.writes:
            if w.end_cycle is None or w.data is None:     # (visible_at_b: not landed yet)
                continue
            for cqn, cq in self.cqs.items():
                if cq.base <= w.addr < cq.base + cq.depth * CQE_SIZE:
                    off = w.addr - cq.base
                    out.append((cqn, off // CQE_SIZE, bytes(w.data[:CQE_SIZE]), w.end_cycle))
        return out

    # ---- checks ----------------------------------------------------------------------
    def check(self, pred=None, frames=None):
        """Hold the run to the golden model: frames, CQEs, counters. Returns the prediction.

        ``frames``: the MAC TX frames to hold to the model (default all; a NIC that is
        also a responder passes its request frames, without its ACKs)."""
        pred = pred or self.predict()
        frames = self.wire.frames if frames is None else frames
        assert self.wire.protocol_errors == 0, "AXI-Stream protocol errors on the MAC port"
        by_qp = {}
        by_remote = {qp.remote_qpn: q for q, qp in self.qps.items()}
        for i, f in enumerate(frames):
            try:
                fields = check_frame(f.data)               # scapy: headers, checksum, ICRC
            except AssertionError as e:
                guess = self._closest(pred, f.data)
                raise AssertionError(f"wire frame {i}: {e}\n" + (diff_frames(f.data, guess) if guess else "")) from None
            assert fields["dqpn"] in by_remote, f"frame for unknown destination QP {fields['dqpn']:#x}"
            qpn = by_remote[fields["dqpn"]]
            by_qp.setdefault(qpn, []).append(f.data)
        for qpn in self.qps:
            want = [r.frame for r in pred.frames.get(qpn, [])]
            got = by_qp.get(qpn, [])
            for i, (g, w) in enumerate(zip(got, want)):
                assert g == w, f"QP {qpn} frame {i}: {diff_frames(g, w)}"
            assert len(got) == len(want), f"QP {qpn}: {len(got)} frames on the wire, model predicts {len(want)}"
        self.check_cqes()
        return pred

    def check_cqes(self):
        """Every CQE written, per CQ in the order written, against the model replayed in that order."""
        writes = self.cqe_writes()
        for cqn, cq in self.cqs.items():
            mine = [(slot, raw) for c, slot, raw, _ in writes if c == cqn]
            order = [unpack(CQE64, raw)["sop_drop_qpn"] & 0xFFFFFF for _, raw in mine]
            expect = self.engine.cq_for_order(cqn, order)
            assert len(mine) == len(expect.records), \
                f"CQ {cqn}: {len(mine)} CQEs written, model predicts {len(expect.records)}"
            for k, ((slot, raw), rec) in enumerate(zip(mine, expect.records)):
                assert slot == expect.slot_of(k), f"CQ {cqn} CQE {k}: slot {slot}, expected {expect.slot_of(k)}"
                assert raw == rec.cqe, f"CQ {cqn} CQE {k}: {diff_cqe(raw, rec.cqe)}"
            depth = 1 if cq.collapsed else cq.depth
            assert self.mem.read(cq.base, depth * CQE_SIZE) == expect.buffer()[:depth * CQE_SIZE], \
                f"CQ {cqn}: buffer differs from the model"

    @staticmethod
    def _closest(pred, data):
        best, score = None, -1
        for f in pred.all_frames():
            f = getattr(f, "frame", f)
            same = sum(a == b for a, b in zip(f, data))
            if same > score:
                best, score = f, same
        return best

    async def check_counters(self, pred):
        c = await self.ctl.read_counters()
        t = pred.totals
        assert c["packets"] == t.packets == len(self.wire.frames), c
        assert c["cqes"] == t.cqes, c
        assert c["error_cqes"] == t.error_cqes, c
        return c

    def check_cycles(self):
        """Every frame (first and last beat, wire start) and every CQE at the cycle of the engine's cycle model."""
        from model.cycle_model import EngineCycleModel
        doorbells = []
        for d in self.gpu.doorbells:
            index = (read_field(CTRL_SEG, "opmod_idx_opcode", d.data) >> 8) & 0xFFFF
            ds = read_field(CTRL_SEG, "qpn_ds", d.data) & 0x3F
            doorbells.append((d.cycle, d.qpn, doorbell_limit(index, ds), d.bf))
        qps = {q: (qp.mtu, qp.depth if hasattr(qp, "depth") else 1 << qp.log_depth, qp.posted, qp.weight, qp.sq_base,
                   getattr(qp, "max_wqebbs", MAX_WQEBBS))
               for q, qp in self.qps.items()}
        pred = EngineCycleModel(qps, doorbells, dma_latency=self.dma_latency).run()
        got = self.wire.frames
        assert len(got) == len(pred.frames), f"{len(got)} frames, the cycle model has {len(pred.frames)}"
        for k, (f, (qpn, index, c0, c1, start, length)) in enumerate(zip(got, pred.frames)):
            where = f"frame {k} (QP {qpn} WQE {index}, {length} B)"
            assert read_field(BTH, "dqpn", f.data, OFF_BTH) == self.qps[qpn].remote_qpn, \
                f"{where}: the RTL sent another QP's frame"
            assert (f.first_cycle, f.last_cycle, f.start_bytes) == (c0, c1, start), \
                f"{where}: RTL first/last beat {f.first_cycle}/{f.last_cycle}, wire start {f.start_bytes}; " \
                f"cycle model {c0}/{c1}, {start}"
        written = {}
        for _, _, raw, cyc in self.cqe_writes():
            written[(read_field(CQE64, "sop_drop_qpn", raw) & 0xFFFFFF, read_field(CQE64, "wqe_counter", raw))] = cyc
        assert set(written) == set(pred.cqes), "CQEs differ from the cycle model's"
        for key, cyc in pred.cqes.items():
            assert written[key] == cyc, f"CQE of QP {key[0]} WQE {key[1]}: RTL cycle {written[key]}, model {cyc}"
        return pred

    def check_timing(self, posted):
        """Doorbell-to-first-byte and doorbell-to-CQE cycles of isolated WQEs against the model."""
        rows = []
        for w in posted:
            pred = isolated_write(w, self.gpu.qps[w.qpn], dma_latency=self.dma_latency)
            first = next(f for f in self.wire.frames
                         if f.first_cycle >= w.db_cycle and check_frame(f.data)["dqpn"] == 0x1000 + w.qpn)
            cqe_cycle = next(cyc for c, slot, raw, cyc in self.cqe_writes() if cyc >= w.db_cycle
                             and unpack(CQE64, raw)["wqe_counter"] == w.index)
            got = {"db_to_first_beat": first.first_cycle - w.db_cycle, "db_to_cqe": cqe_cycle - w.db_cycle}
            for key, want in pred.items():
                assert got[key] == want, f"{key}: RTL {got[key]} cycles, model {want} (WQE {w.index}, QP {w.qpn})"
            rows.append(got)
        return rows
