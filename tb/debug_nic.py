import cocotb
from cocotb.triggers import ClockCycles
from tb.test_nic import env_with
from tb.env import NicEnv
from spec.formats import WqeOp
from tb.roce_check import check_frame

@cocotb.test()
async def dbg_error(dut):
    env, (a, b) = await env_with(dut, 2)
    a.post_nop(signaled=True)
    a.post_write(0x10, 1, inline=b"ok")
    a.post_write(0x20, 1, inline=b"bad", opcode=WqeOp.ATOMIC_FA)
    a.post_write(0x30, 1, inline=b"never")
    await a.ring_nvshmem()
    b.post_write(0x40, 2, inline=b"other QP goes on")
    await b.ring_nvshmem()
    await ClockCycles(dut.clk, 3000)
    for f in env.wire.frames:
        d = check_frame(f.data)
        dut._log.info("frame cyc %d-%d len %d op %x psn %x dqpn %x payload %s", f.first_cycle, f.last_cycle, len(f.data), d["opcode"], d["psn"], d["dqpn"], d["payload"])
    for w in a.posted:
        dut._log.info("posted %s", w.wqe.hex())

@cocotb.test()
async def dbg_many(dut):
    env = await NicEnv(dut).start()
    qps = []
    for q in range(64):
        cq = await env.cq(q, 2)
        qps.append(await env.qp(q, cq, log_depth=4))
        dut._log.info("created %d at %d", q, env.counter.now)
    for qp in qps:
        qp.post_write(0x2000 * qp.qpn + 64, qp.qpn, inline=bytes([qp.qpn]) * 8)
    async def mon():
        while True:
            await ClockCycles(dut.clk, 200)
            dut._log.info("c=%d qpt=%s wf=%s wp=%s pf=%s bld=%s cw=%s dbfifo_v=%s frames=%d", env.counter.now, dut.qp_table.fsm_state.value,
                dut.wqe_fetch.fsm_state.value, dut.wqe_parser.fsm_state.value, dut.payload_fetch.fsm_state.value, dut.builder.fsm_state.value,
                dut.cqe_writer.fsm_state.value, dut.db_fifo.o__valid.value, len(env.wire.frames))
            wp = dut.wqe_parser
            dut._log.info("need=%s got=%s left=%s wqebbs_v=%s job=%x wqe=%x", wp.need.value, wp.got.value, wp.left.value, wp.wqebbs__valid.value, wp.job.value.to_unsigned() & 0xffffffffffffffffffff, wp.wqe.value.to_unsigned() & ((1<<128)-1))
    cocotb.start_soon(mon())
    for qp in qps:
        await qp.ring_nvshmem()
        dut._log.info("rang %d", qp.qpn)
    await ClockCycles(dut.clk, 3000)
    dut._log.info("frames %d", len(env.wire.frames))
    dut._log.info("counters %s", await env.ctl.read_counters())

@cocotb.test()
async def dbg_trace(dut):
    from cocotb.triggers import RisingEdge, ReadOnly
    env, (a, b) = await env_with(dut, 2)
    a.post_nop(signaled=True)
    a.post_write(0x10, 1, inline=b"ok")
    a.post_write(0x20, 1, inline=b"bad", opcode=WqeOp.ATOMIC_FA)
    a.post_write(0x30, 1, inline=b"never")
    await a.ring_nvshmem()
    b.post_write(0x40, 2, inline=b"other QP goes on")
    await b.ring_nvshmem()
    for i in range(700):
        await RisingEdge(dut.clk)
        await ReadOnly()
        c = env.counter.now
        q = dut.qp_table
        if q.jobs__valid.value and q.jobs__ready.value:
            dut._log.info("c=%d JOB %s", c, hex(q.jobs__payload.value.to_unsigned() & ((1<<80)-1)))
        if q.updates__valid.value and q.updates__ready.value:
            dut._log.info("c=%d UPD %s", c, hex(q.updates__payload.value.to_unsigned()))
        bl = dut.builder
        if bl.messages__valid.value and bl.messages__ready.value:
            dut._log.info("c=%d BMSG %s", c, hex(bl.messages__payload.value.to_unsigned() & ((1<<400)-1)))
        wp = dut.wqe_parser
        if wp.messages__valid.value and wp.messages__ready.value:
            dut._log.info("c=%d PMSG %s", c, hex(wp.messages__payload.value.to_unsigned() & ((1<<400)-1)))
        if dut.m_axis_tx_tvalid.value and dut.m_axis_tx_tready.value:
            dut._log.info("c=%d TX", c)
        if q.wr__en.value:
            v = q.wr__data.value.to_unsigned()
            dut._log.info("c=%d RAMWR addr=%s rqpn=%x base=%x", c, q.wr__addr.value.to_unsigned(), (v >> 6+4+64) & 0xffffff, v & ((1<<64)-1))
        if q.rd__en.value:
            dut._log.info("c=%d RAMRD addr=%s", c, q.rd__addr.value.to_unsigned())
        if q.doorbells__valid.value and q.doorbells__ready.value:
            dut._log.info("c=%d DB %s", c, hex(q.doorbells__payload.value.to_unsigned()))

@cocotb.test()
async def dbg_commit(dut):
    from cocotb.triggers import RisingEdge, ReadOnly
    from tb.env import NicEnv
    import cocotb as c2
    env = NicEnv(dut)
    async def mon():
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            q = dut.qp_table
            if q.commit__valid.value and q.commit__ready.value:
                dut._log.info("COMMIT %s", hex(q.commit__payload.value.to_unsigned()))
            if dut.s_axil_awvalid.value and dut.s_axil_awready.value:
                dut._log.info("AXIL W %s %s", hex(dut.s_axil_awaddr.value.to_unsigned()), hex(dut.s_axil_wdata.value.to_unsigned()))
    await env.start()
    c2.start_soon(mon())
    cq = await env.cq(0, 2)
    await env.qp(0, cq)
    await env.qp(1, cq)
