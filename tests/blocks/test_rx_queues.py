"""The receive path's descriptor queues against its beat buffer, in Amaranth's simulator.

The port's beat buffer (``RX_BEAT_BUFFER`` beats) lets the payload side (resegmenter,
payload writer) fall that far behind MAC RX: a long frame's first beat waits for the
frame's verdict at its end, and behind it small frames come at about one a cycle (a
WRITE of 8 bytes is 82 bytes, 1.06 cycles at line rate, and the writer takes one a
cycle). Each beat in the buffer in which frames end has a keep pair waiting in the
dispatch, and the payload commands of its WRITE requests wait between the responder and
the payload writer (the writer takes a command only when it reaches the frame). So both
queues must hold at least what the beat buffer holds; with 32 keep pairs and 16 command
pairs they filled first and stopped the parser, and MAC RX, with the buffer half empty
(``fuzz_receive`` at FUZZ_SEED=7: MAC RX waited 516 cycles with ``qp_not_ready`` frames,
5 with ``response`` frames)."""
from amaranth.hdl import Elaboratable
from amaranth.sim import Simulator

from spec import params as P
from rtl.common.rx_packet import RxDrop
from rtl.port.path import PortRx
from rtl.responder.path import ResponderPath, SEGMENT_QUEUE

# input beats downstream of the beat buffer whose frames may still wait for their keep
# bits or commands: the resegmenter's beat, the segment queue and the output register
# (each output beat holds at most two frame starts), the payload writer's beat
DOWNSTREAM = 1 + 2 * (SEGMENT_QUEUE + 1) + 1


def _block(level, name):
    """Block ``name`` of the wiring level ``level``; the others, never elaborated here,
    are marked used (no UnusedElaboratable warnings)."""
    seen = set()

    def mark(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Elaboratable):
            obj._MustUse__used = True
            for v in vars(obj).values():
                mark(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                mark(v)
        elif isinstance(obj, dict):
            for v in obj.values():
                mark(v)
    mark(level)
    return level._blocks[name]


def _accepted(dut, stream, fill, stop, cycles):
    """Transfers ``stream`` of ``dut`` takes in ``cycles`` cycles with nothing taken out
    (``stop``: the output readies held low; ``fill``: sets one transfer's payload)."""
    taken = 0

    async def bench(ctx):
        nonlocal taken
        for sig in stop:
            ctx.set(sig, 0)
        fill(ctx)
        ctx.set(stream.valid, 1)
        for _ in range(cycles):
            await ctx.delay(1e-12)
            if ctx.get(stream.ready):
                taken += 1
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    return taken


def test_keep_queue_holds_the_beat_buffer():
    """The dispatch inside PortRx takes a keep pair for every buffered beat (and the
    ones downstream) while the resegmenter takes none: dropped frames, two per pair, so
    nothing but the keep queue fills."""
    dispatch = _block(PortRx(), "rx_dispatch")

    def fill(ctx):
        p = dispatch.packets.p
        ctx.set(p.second, 1)
        for k in range(2):
            ctx.set(p.p[k].drop, RxDrop.NOT_ROCE)

    need = P.RX_BEAT_BUFFER + DOWNSTREAM
    taken = _accepted(dispatch, dispatch.packets, fill,
                      [dispatch.keep.ready, dispatch.requests.ready, dispatch.acks.ready], need + 20)
    assert taken >= need, f"the keep queue holds {taken} pairs, the beat buffer {P.RX_BEAT_BUFFER} beats"


def test_command_queue_holds_the_beat_buffer():
    """The queue of payload command pairs between the responder and the sorter holds one
    pair for every buffered beat and the beats downstream, with the sorter taking none."""
    fifo = _block(ResponderPath(num_qps=4, num_cqs=2), "rx_cmd_fifo")

    def fill(ctx):
        ctx.set(fifo.i.p.second, 1)
        for k in range(2):
            ctx.set(fifo.i.p.p[k].write, 1)
            ctx.set(fifo.i.p.p[k].length, 8)

    need = P.RX_BEAT_BUFFER + DOWNSTREAM
    taken = _accepted(fifo, fifo.i, fill, [fifo.o.ready], need + 20)
    assert taken >= need, f"the command queue holds {taken} pairs, the beat buffer {P.RX_BEAT_BUFFER} beats"
