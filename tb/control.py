"""CPU control path driver: CSR writes/reads over the DUT's ``s_axil`` slave.

Register map: docs/interfaces.md ("CSR map").
"""

import logging

from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiResp

from spec import csr
from spec.csr import ID_VALUE  # noqa: F401  (re-exported: tb.control.ID_VALUE)
from spec.formats import MAX_WQEBBS, Access, QpState, mtu_bytes
from spec.params import MAX_WEIGHT, NUM_CQS, NUM_MRS, NUM_QPS, PD_BITS

# Register addresses: spec/csr.py (ADDR: name -> address); counters as (name, address).
ADDR = csr.ADDR
COUNTERS = tuple((c.name, c.addr) for c in csr.COUNTERS)
MAX_LOG_DEPTH = 15
DEFAULT_TIMEOUT_CYCLES = 1 << 20   # about 2 ms at 500 MHz (IB's local ACK timeout codes are 4.096 us x 2^n)


def _check(name, value, lo, hi):
    """Raise ValueError unless lo <= value <= hi (value an int)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo:#x}, {hi:#x}], not {value!r}")


def _check_base(name, addr):
    _check(name, addr, 0, 2**64 - 1)
    if addr % 64:
        raise ValueError(f"{name} {addr:#x} must be 64-byte aligned")


def mac_split(mac):
    """(LO, HI) register values of a 48-bit MAC (LO = bytes 2..5, HI = bytes 0..1)."""
    return mac & 0xFFFF_FFFF, mac >> 32


class NicControl:
    """CSR access to the NIC over AXI4-Lite.

    Parameters:
        dut: DUT handle with ``s_axil_*``, ``clk``, ``rst``.
        num_qps, num_cqs: sizes used to validate QP/CQ numbers (build defaults).
        prefix: AXI4-Lite signal prefix.
    """

    def __init__(self, dut, *, num_qps=NUM_QPS, num_cqs=NUM_CQS, prefix="s_axil"):
        self.dut = dut
        self.num_qps = num_qps
        self.num_cqs = num_cqs
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, prefix), dut.clk, dut.rst)
        for side in (self.axil.write_if, self.axil.read_if):
            side.log.setLevel(logging.WARNING)      # cocotbext logs every access at INFO
        self._qp_regs = {}                          # qpn -> staged context registers, for modify_qp

    async def write_reg(self, addr, value, *, may_fail=False):
        """Write a 32-bit CSR: ``addr`` an address or a register name of spec/csr.py.
        Returns True when the NIC answered OKAY; an error response (SLVERR) raises
        RuntimeError unless ``may_fail`` (then False is returned)."""
        _check("CSR value", value, 0, 2**32 - 1)
        a = ADDR.get(addr, addr)
        resp = await self.axil.write(a, int(value).to_bytes(4, "little"))
        if resp.resp != AxiResp.OKAY:
            if not may_fail:
                raise RuntimeError(f"CSR write of {value:#x} to {addr!r} ({a:#x}) answered {resp.resp.name}")
            return False
        return True

    async def read_reg(self, addr):
        """Read a 32-bit CSR: ``addr`` an address or a register name of spec/csr.py."""
        return await self.axil.read_dword(ADDR.get(addr, addr))

    async def read_id(self):
        """The ID register (spec.csr.ID_VALUE, "IBGA", on a working NIC)."""
        return await self.read_reg("ID")

    async def read_params(self):
        """(number of QPs, number of CQs) from the PARAMS register."""
        v = await self.read_reg("PARAMS")
        return v & 0xFFFF, v >> 16

    async def set_port(self, mac, ip):
        """Set the source MAC (48-bit int, 0xAABBCCDDEEFF) and IPv4 address (32-bit int)."""
        _check("mac", mac, 0, 2**48 - 1)
        _check("ip", ip, 0, 2**32 - 1)
        lo, hi = mac_split(mac)
        await self.write_reg("PORT_MAC_LO", lo)
        await self.write_reg("PORT_MAC_HI", hi)
        await self.write_reg("PORT_IP", ip)

    async def create_qp(self, qpn, sq_base, log_depth, cqn, remote_qpn, start_psn, dmac, dip,
                        mtu_code, state=QpState.RTS, weight=1, rq_psn=0, pd=0, ack_every=1, uc=False,
                        timeout=DEFAULT_TIMEOUT_CYCLES, retry_cnt=7, user_index=0, max_rd_atomic=16,
                        max_dest_rd_atomic=16, max_wqebbs=16, rnr_retry=7, rq=None, rcqn=0,
                        min_rnr_timer=0):
        """Stage a QP context and commit it to ``qpn`` (indices reset to 0, PSN to start_psn).

        Parameters:
            qpn: QP number, < num_qps. sq_base: 64-byte aligned SQ address.
            log_depth: log2 SQ depth in WQEBBs (0..15). cqn: send CQ (< num_cqs).
            remote_qpn, start_psn: 24-bit. dmac: 48-bit. dip: IPv4 (32-bit).
            mtu_code: ibv_mtu 1..5. state: ibv_qp_state 0..6 (only RTS sends).
            weight: scheduler weight 1..15 (weight x 128 WQEBBs per turn).
            rq_psn: receive side's first expected PSN (the peer's start PSN).
            pd: protection domain of the QP (memory keys must belong to it).
            ack_every: ACK coalescing count 1..255.
            uc: an Unreliable Connection QP: its WQEs complete when sent; else (RC) when
                the responder has acknowledged them.
            timeout: ACK timeout in core cycles; retry_cnt: retransmissions on timeout
                before the QP gives up (0..7).
            user_index: 24-bit user index the QP's CQEs carry (srqn_uidx).
            max_rd_atomic: READs and atomics in flight at most (the peer's responder
                resources); max_dest_rd_atomic: this QP's responder resources (1..16).
            rnr_retry: resends after RNR NAKs before the WQE fails (0..7; 7: no limit).
            rq: the QP's receive queue (``model.recv_queue.RecvQueue``: ring base, log_size,
                log_stride 4..9, doorbell record); None: no receive queue.
            rcqn: CQ of its receive completions; min_rnr_timer: its RNR NAK timer code (0..31).
        """
        _check("qpn", qpn, 0, self.num_qps - 1)
        _check_base("sq_base", sq_base)
        _check("log_depth", log_depth, 0, MAX_LOG_DEPTH)
        _check("cqn", cqn, 0, self.num_cqs - 1)
        _check("remote_qpn", remote_qpn, 0, 2**24 - 1)
        _check("start_psn", start_psn, 0, 2**24 - 1)
        _check("dmac", dmac, 0, 2**48 - 1)
        _check("dip", dip, 0, 2**32 - 1)
        mtu_bytes(mtu_code)             # raises ValueError on a bad code
        _check("state", state, QpState.RESET, QpState.ERR)
        _check("weight", weight, 1, MAX_WEIGHT)
        _check("rq_psn", rq_psn, 0, 2**24 - 1)
        _check("pd", pd, 0, 2**PD_BITS - 1)
        _check("ack_every", ack_every, 1, 255)
        _check("timeout", timeout, 1, 2**32 - 1)
        _check("retry_cnt", retry_cnt, 0, 7)
        _check("user_index", user_index, 0, 2**24 - 1)
        _check("max_rd_atomic", max_rd_atomic, 1, 16)
        _check("max_dest_rd_atomic", max_dest_rd_atomic, 1, 16)
        _check("max_wqebbs", max_wqebbs, 1, MAX_WQEBBS)
        _check("rnr_retry", rnr_retry, 0, 7)
        _check("rcqn", rcqn, 0, self.num_cqs - 1)
        _check("min_rnr_timer", min_rnr_timer, 0, 31)
        if rq is not None and not 4 <= rq.log_stride <= 9:
            raise ValueError(f"the engine takes receive WQEs of 16..512 bytes (log_stride 4..9), not {rq.log_stride}")
        lo, hi = mac_split(dmac)
        regs = {"QP_NUM": qpn, "QP_SQ_BASE_LO": sq_base & 0xFFFF_FFFF, "QP_SQ_BASE_HI": sq_base >> 32,
                "QP_SQ_LOG_DEPTH": log_depth, "QP_CQN": cqn, "QP_REMOTE_QPN": remote_qpn, "QP_START_PSN": start_psn,
                "QP_DMAC_LO": lo, "QP_DMAC_HI": hi, "QP_DIP": dip, "QP_MTU": mtu_code, "QP_STATE": state,
                "QP_WEIGHT": weight, "QP_RQ_PSN": rq_psn, "QP_PD": pd, "QP_ACK_EVERY": ack_every, "QP_SERVICE": int(uc),
                "QP_TIMEOUT": timeout, "QP_RETRY": retry_cnt, "QP_USER_INDEX": user_index,
                "QP_MAX_RD_ATOMIC": max_rd_atomic, "QP_MAX_DEST_RD_ATOMIC": max_dest_rd_atomic,
                "QP_MAX_WQEBBS": max_wqebbs, "QP_RNR_RETRY": rnr_retry,
                "QP_RQ_BASE_LO": 0 if rq is None else rq.base & 0xFFFF_FFFF, "QP_RQ_BASE_HI": 0 if rq is None else rq.base >> 32,
                "QP_RQ_LOG_SIZE": 0 if rq is None else rq.log_size,
                "QP_RQ_LOG_STRIDE": 0 if rq is None else rq.log_stride,
                "QP_DBR_LO": 0 if rq is None else rq.dbr & 0xFFFF_FFFF, "QP_DBR_HI": 0 if rq is None else rq.dbr >> 32,
                "QP_RCQN": rcqn, "QP_MIN_RNR_TIMER": min_rnr_timer}
        for addr, value in regs.items():
            await self.write_reg(addr, value)
        await self.write_reg("QP_COMMIT", 1)
        self._qp_regs[qpn] = regs

    async def modify_qp(self, qpn, *, weight=None, state=None, start_psn=None, rq_psn=None):
        """QP_MODIFY: move a created QP to ``state`` and/or change its weight
        (``spec.formats.qp_modify_action`` says what each transition does; ``start_psn`` and
        ``rq_psn`` are staged for the transitions that take them). Returns True when the
        NIC took it, False when it refused (SLVERR: not a transition verbs allows; the
        QP is unchanged)."""
        if qpn not in self._qp_regs:
            raise ValueError(f"QP {qpn} was not created through this driver")
        regs = dict(self._qp_regs[qpn])
        if weight is not None:
            _check("weight", weight, 1, MAX_WEIGHT)
            regs["QP_WEIGHT"] = weight
        if state is not None:
            _check("state", state, QpState.RESET, QpState.ERR)
            regs["QP_STATE"] = state
        if start_psn is not None:
            _check("start_psn", start_psn, 0, 2**24 - 1)
            regs["QP_START_PSN"] = start_psn
        if rq_psn is not None:
            _check("rq_psn", rq_psn, 0, 2**24 - 1)
            regs["QP_RQ_PSN"] = rq_psn
        for addr, value in regs.items():
            await self.write_reg(addr, value)
        ok = await self.write_reg("QP_MODIFY", 1, may_fail=True)
        if ok:
            self._qp_regs[qpn] = regs
        return ok

    async def create_cq(self, cqn, base, log_depth, collapsed=False):
        """Stage a CQ context and commit it to ``cqn`` (producer count reset to 0).

        Parameters:
            cqn: CQ number (< num_cqs). base: 64-byte aligned buffer address.
            log_depth: log2 number of CQEs (0..15). collapsed: every CQE in slot 0.
        """
        _check("cqn", cqn, 0, self.num_cqs - 1)
        _check_base("base", base)
        _check("log_depth", log_depth, 0, MAX_LOG_DEPTH)
        for addr, value in (("CQ_NUM", cqn), ("CQ_BASE_LO", base & 0xFFFF_FFFF), ("CQ_BASE_HI", base >> 32),
                            ("CQ_LOG_DEPTH", log_depth), ("CQ_FLAGS", int(bool(collapsed))), ("CQ_COMMIT", 1)):
            await self.write_reg(addr, value)

    async def register_mr(self, key, base, length, access, pd):
        """Register a memory region under ``key`` (its slot is ``key >> 8``, as mlx5 keys).

        Parameters:
            key: 32-bit memory key (index << 8 | variant byte), index < the table size.
            base, length: the region's bytes (64-bit each).
            access: ``spec.formats.Access`` bits. pd: protection domain.
        """
        _check("key", key, 0, 2**32 - 1)
        _check("key index", key >> 8, 0, NUM_MRS - 1)
        _check("base", base, 0, 2**64 - 1)
        _check("length", length, 0, 2**64 - 1)
        _check("access", access, 0, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
               | Access.REMOTE_ATOMIC)
        _check("pd", pd, 0, 2**PD_BITS - 1)
        for addr, value in (("MR_INDEX", key >> 8), ("MR_KEY", key), ("MR_BASE_LO", base & 0xFFFF_FFFF),
                            ("MR_BASE_HI", base >> 32), ("MR_LEN_LO", length & 0xFFFF_FFFF), ("MR_LEN_HI", length >> 32),
                            ("MR_ACCESS", access), ("MR_PD", pd), ("MR_COMMIT", 1)):
            await self.write_reg(addr, value)

    async def deregister_mr(self, key):
        """Remove the region in ``key``'s slot."""
        _check("key index", key >> 8, 0, NUM_MRS - 1)
        await self.write_reg("MR_INDEX", key >> 8)
        await self.write_reg("MR_DEREG", 1)

    async def read_counters(self):
        """Dict of the statistics counters by spec/csr.py name (doorbells, ..., error_cqes, rx_*, acks_sent, ...)."""
        return {name: await self.read_reg(addr) for name, addr in COUNTERS}
