"""The Ethernet port, wired: ``PortRx`` (MAC RX to descriptors and beats) and ``PortTx``
(data and ACK frames to MAC TX).

    MAC RX -> MacRxAdapter -> IcrcChecker -> RxHeaderParser -> beat buffer -> beats
                                                   `-> RxDispatch -> requests, ACKs, keep bits
    data frames, ACK frames -> TxMux -> IcrcInserter -> MAC TX (completions on the side)
"""
from amaranth.hdl import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import Out

from spec import params as P
from rtl.common.axi import AxiStreamSignature
from rtl.common.passthrough import WiringLevel, forward, members
from rtl.common.records import Completion
from rtl.common.rx_beat import RxBeat
from rtl.common.stream import StreamFifo
from rtl.common.tx_beat import SEGMENT as SEG
from rtl.port.dispatch import RxDispatch
from rtl.port.header_parser import RxHeaderParser
from rtl.port.icrc_checker import IcrcChecker
from rtl.port.icrc_inserter import IcrcInserter
from rtl.port.rx_adapter import MacRxAdapter
from rtl.port.tx_mux import TxMux

__all__ = ["PortRx", "PortTx"]

KEEP_QUEUE = P.RX_BEAT_BUFFER + 16      # keep pairs in the dispatch: one per buffered beat, and some


class PortRx(WiringLevel):
    """MAC RX to checked descriptors and buffered beats (pure wiring).

    Frames pass the ICRC check and the header parser; their beats wait in a buffer while
    the dispatch counts the frames dropped at frame level, passes ACK/NAKs to the
    requester and requests to the responder, and says which frames' beats carry payload.

    Members
    -------
    rx : In(AxiStreamSignature(data_width=1024, user_width=8))
        MAC RX (top-level ``s_axis_rx``).
    port_mac, port_ip : In
        The port's own addresses (frames for others are dropped).
    beats : Out(stream.Signature(RxBeat))
        Every received frame's beats, from the beat buffer.
    requests, acks, keep : Out(stream.Signature(...))
        The dispatch's outputs (``RxDispatch``).
    dropped, acks_received : Out
        Frame-level drop and ACK counts (up to two a cycle).
    """
    def __init__(self):
        self._blocks = {
            "mac_rx": MacRxAdapter(), "icrc_check": IcrcChecker(), "rx_parser": RxHeaderParser(),
            "rx_beat_fifo": StreamFifo(RxBeat(), P.RX_BEAT_BUFFER),
            # keep bits wait until the resegmenter reaches their beats: a pair per beat with
            # frame ends, so as many as the beat buffer holds (and the parser's latency)
            "rx_dispatch": RxDispatch(keep_depth=KEEP_QUEUE),
        }
        b = self._blocks
        self._ports = [
            (b["mac_rx"], {"rx": "i"}),
            (b["rx_parser"], {"port_mac": "port_mac", "port_ip": "port_ip"}),
            (b["rx_beat_fifo"], {"beats": "o"}),
            (b["rx_dispatch"], {"requests": "requests", "acks": "acks", "keep": "keep", "dropped": "dropped",
                                "acks_received": "acks_received"}),
        ]
        super().__init__(self._blocks, self._ports)

    def elaborate(self, platform):
        m = self.wire()
        b = self._blocks
        wiring.connect(m, b["mac_rx"].o, b["icrc_check"].i)
        wiring.connect(m, b["icrc_check"].o, b["rx_parser"].i)
        wiring.connect(m, b["rx_parser"].o, b["rx_beat_fifo"].i)
        wiring.connect(m, b["rx_parser"].packets, b["rx_dispatch"].packets)
        return m


class PortTx(wiring.Component):
    """Data and ACK frames to MAC TX, the ICRC inserted (wiring, and the MAC TX port's
    handshake).

    Marker beats (``frame`` = 0) are absorbed here. The last beat of a completing message
    hands its completion on, so a CQE is written only once the message's last packet has
    left; MAC TX waits while the completion cannot be taken.

    Parameters
    ----------
    num_qps, num_cqs : int
        As :class:`~rtl.top.IbgdaNic`.

    Members
    -------
    data, acks : In(stream.Signature(TxBeat))
        Data frames (requester) and ACK/NAK frames (responder).
    tx : Out(AxiStreamSignature(data_width=1024, user_width=2))
        MAC TX (top-level ``m_axis_tx``).
    completions : Out(stream.Signature(Completion))
        Completions of messages whose last beat has left.
    """
    def __init__(self, *, num_qps, num_cqs):
        self._mux = TxMux(num_qps=num_qps, num_cqs=num_cqs)
        self._icrc = IcrcInserter(num_qps=num_qps, num_cqs=num_cqs)
        super().__init__(members(self._mux, ["data", "acks"]) | {
            "tx": Out(AxiStreamSignature(data_width=8 * P.DATA_BYTES, user_width=2)),
            "completions": Out(stream.Signature(Completion(num_qps, num_cqs))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx_mux = txm = self._mux
        m.submodules.icrc = icrc = self._icrc
        forward(m, self, txm, ["data", "acks"])
        wiring.connect(m, txm.o, icrc.i)

        beat = icrc.o.p
        wants_cpl = Signal()
        m.d.comb += wants_cpl.eq(beat.last & beat.cpl_valid)
        ready = Signal()
        hi_lanes = Signal(range(SEG + 1))   # on a last beat: the lanes from 64 of the frame starting there
        m.d.comb += hi_lanes.eq(Mux(beat.sop_hi, Mux(beat.end_hi, beat.flen_hi[:7], SEG), 0))
        m.d.comb += [
            ready.eq((~beat.frame | self.tx.tready) & (~wants_cpl | self.completions.ready)),
            icrc.o.ready.eq(ready),
            self.tx.tvalid.eq(icrc.o.valid & beat.frame & (~wants_cpl | self.completions.ready)),
            self.tx.tdata.eq(beat.data),
            self.tx.tkeep.eq(Mux(beat.last,
                                 (Const((1 << P.DATA_BYTES) - 1, P.DATA_BYTES)
                                  >> (P.DATA_BYTES - beat.nbytes).as_unsigned())
                                 | ((Const((1 << SEG) - 1, P.DATA_BYTES)
                                     >> (SEG - hi_lanes).as_unsigned()) << SEG)[:P.DATA_BYTES],
                                 Const((1 << P.DATA_BYTES) - 1, P.DATA_BYTES))),
            self.tx.tlast.eq(beat.last),
            self.tx.tuser.eq(Cat(beat.sop_hi, beat.sop_hi & beat.end_hi)),
            self.completions.valid.eq(icrc.o.valid & ready & wants_cpl),
            self.completions.p.eq(beat.cpl),
        ]
        return m
