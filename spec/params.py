"""Default build and test parameters (SPEC section 8)."""

CLOCK_MHZ = 500                    # core clock
CLOCK_PERIOD_NS = 1000 / CLOCK_MHZ # 2 ns
DATA_BYTES = 128                   # 1024-bit datapath (DMA read/write data, MAC TX)
SEGMENT_BYTES = 64                 # MAC TX: a frame starts at lane 0 or lane 64 of a beat
RX_START_BYTES = 32                # MAC RX: a frame starts at lane 0, 32, 64 or 96 of a beat
DB_DATA_BYTES = 8                  # doorbell/UAR AXI4 slave data width
CSR_DATA_BYTES = 4                 # AXI4-Lite control path
DMA_ADDR_WIDTH = 64
# AXI: no burst crosses a 4 KiB boundary (AXI_PAGE); every DMA block splits its bursts
# by axi_bursts() below (the gateware by rtl.common.axi.beats_to_page_end).
AXI_PAGE_SHIFT = 12
AXI_PAGE = 1 << AXI_PAGE_SHIFT     # 4096
DB_ADDR_WIDTH = 32
CSR_ADDR_WIDTH = 16
AXI_ID_WIDTH = 4
# AXI ids of the DMA blocks (docs/interfaces.md): reads of one id return in order, and the
# two writers on m_axi share it through AxiWriteArbiter, which routes B back by id.
AXI_ID_WQE_FETCH = 0               # ARID on m_axi_wqe
AXI_ID_PAYLOAD_FETCH = 1           # ARID on m_axi
AXI_ID_CQE_WRITE = 0               # AWID on m_axi
AXI_ID_RX_WRITE = 2                # AWID of the received payload writes (m_axi and m_axi_rx)
AXI_ID_RESULT_WRITE = 3            # AWID on m_axi: an atomic's original value written to local memory
AXI_ID_ATOMIC_READ = 2             # ARID on m_axi: the responder's atomic unit reads a word
AXI_ID_ATOMIC_WRITE = 4            # AWID on m_axi_rx: the atomic unit writes a word through
AXI_ID_READ_RESPONSE = 3           # ARID on m_axi: the responder reads a READ's payload
AXI_ID_RECV_QUEUE = 4              # ARID on m_axi: the receive queues' doorbell records and WQEs
AXI_ID_RECV_CQE_WRITE = 5          # AWID on m_axi_rx: receive CQEs (after their payload's writes landed)
# Receive queues (rtl/responder/recv_queue.py): data segments of a receive WQE the responder
# scatters into (the first RECV_MAX_SGE; rdma-core's max_recv_sge of a QP the engine serves),
# WQEs prefetched per QP, and reads in flight.
RECV_MAX_SGE = 4
RECV_PREFETCH = 256                # a QP's window: WQEs fetched ahead of the committed count at most
RECV_POOL = 4096                   # receive WQEs on chip, shared by the QPs (16 a chunk)
RECV_EMPTY_CACHE_AGE = 64          # cycles the receive gate serves a QP's packets from its last empty record
RECV_MAX_READS = 512
NUM_QPS = 1024                     # QP contexts in RAM (issue 3: 1024 and more)
# The array tops of the system tests (rtl/build.py): two engines (the pair) and four
# through a switch (the quad), each of ARRAY_NUM_QPS QPs: fewer than the default build keep
# the simulators' RAMs small (the logic is the same); 128, so that make bench's READ point
# has its 64 QPs (QPN 1..64).
ARRAY_NUM_QPS = 128
QUAD_COUNT = 4
NUM_CQS = NUM_QPS                  # one collapsed CQ per QP, as NVSHMEM creates them (issue 16)
DEFAULT_MTU = 4096
# Engine build defaults (rtl/top.py) that the cycle model must know too.
# Scheduler quantum: a QP of weight w gets up to w x QUANTUM_WQEBBS WQEBBs per turn.
QUANTUM_WQEBBS = 128
MAX_WEIGHT = 15
MAX_BURST_WQEBBS = QUANTUM_WQEBBS * MAX_WEIGHT
# A QP's first turn after its create is at most this many WQEBBs (its own; the usual read
# past them finishes the last WQE): twice the 16 slots of its READ/atomic ring, so a QP that
# posts READs fills its ring and parks within that turn instead of having a whole quantum
# fetched, of which all but 16 would be dropped at one WQEBB a cycle (64 new QPs x 128:
# 16 us of the parser), while a WRITE doorbell batch of 32 stays one turn (with 16 the
# 8-byte WRITE point fell from 471.7 to 386 M/s). A WRITE stream only splits its first turn.
FIRST_TURN_WQEBBS = 32
# A turn also ends once its WQEs carry TURN_BYTES of payload (a power of two): the WQE
# parser learns, per QP, how many WQEBBs that takes and the QP table cuts its next turns
# there (QpDynamic.byte_turn). Without it a QP whose ring is full of 14 KB tokens sends
# 128 of them (1.8 MB) to one peer in one turn, and senders' turns meet at a switch
# output queue (MoE combine 5% slower than spread senders; issue 17).
TURN_BYTES = 16384
# Byte-bound bursts (a QP's turns cut by TURN_BYTES) the QP table may schedule ahead of the
# parser; 0: no bound (the default). The WQE buffer lets the table commit up to 512 WQEBBs
# ahead: for 14 KB tokens 7 MB, 148 us of wire, in the order the doorbells came rather than
# in turns over every QP with work. A bound of 8 took a lined-up MoE combine from 257.4 to
# 238.4 us but slowed the IBGDA dispatch from 124.8 to 128.4 us: while the table waits, work
# piles up on QPs whose first turn (32 WQEBBs, no byte bound learnt yet) then sends 32
# tokens to one peer. Off until first turns are byte-bound too (issue 17, docs/results.md).
TURNS_AHEAD = 0
# WQEBB buffer = WQE reads in flight. At one WQEBB per cycle, 1 us of latency (500
# cycles) plus the pipeline needs about 510 reads in flight: 512 x 64 B = 32 KiB.
WQE_BUFFER_WQEBBS = 512
# Bursts handed from the WQE fetch to the parser: one per burst in flight, so as many as
# the WQEBB buffer can hold when every QP posts one WQE per doorbell.
BURST_QUEUE_DEPTH = 512
WQE_MAX_RUN = 32                   # WQEBBs per AXI burst of the WQE fetch (16 beats of 2 WQEBBs)
# Payload buffer: 1 us x 400 Gb/s = 50 KB must be in flight to keep the wire busy
# from GPU memory; 512 beats of 128 B = 64 KiB (512 Kbit of RAM).
PAYLOAD_BUFFER_BEATS = 512
PAYLOAD_MAX_BURST_BEATS = 32       # 4 KiB AXI bursts
# Messages parsed ahead of the builder: a message's payload is read when it enters
# this queue and packed when it leaves, so the queue must hold every message of one
# read round trip: 1 us x 471 M msg/s = 471 at the small-message rate.
MESSAGE_QUEUE_DEPTH = 512
# Pointer data segments the requester's WQE parser takes per data WQE (WRITE, WRITE with
# immediate, SEND, SEND with immediate): a gather list, the message being the segments'
# concatenation in order (an empty one adds nothing); a WQE with more is malformed
# (LOCAL_QP_OP_ERR), as ``model.frames.parse_wqe`` says with ``max_gather``. A WQE of two
# or more takes the parser a cycle more (its total summed), two during a go-back walk.
REQUESTER_GATHER = 4
INLINE_QUEUE_BEATS = 64           # inline WQE beats parsed ahead (64 x 128 B)
DMA_READ_LATENCY_NS = 1000         # PCIe-like read latency to GPU memory (1 us)
DMA_READ_LATENCY_CYCLES = int(DMA_READ_LATENCY_NS / CLOCK_PERIOD_NS)
DMA_BYTES_PER_CYCLE = 128          # memory model bandwidth: one full beat per cycle

# ---- wire arithmetic (SPEC section 6) ----------------------------------------------
WIRE_GBPS = 400
PREAMBLE_SFD, IFG = 8, 12
WIRE_OVERHEAD = PREAMBLE_SFD + 4 + IFG          # + FCS: bytes a frame costs beyond its capture length
WIRE_BYTES_PER_CYCLE = WIRE_GBPS * 1e9 / 8 / (CLOCK_MHZ * 1e6)   # 100 bytes per cycle at 500 MHz


def wire_bytes(frame_len):
    """Wire bytes a frame of ``frame_len`` captured bytes (no FCS) occupies."""
    return frame_len + WIRE_OVERHEAD


def axi_bursts(addr, nbytes, beat, max_beats):
    """The INCR bursts that read or write ``[addr, addr + nbytes)`` in ``beat``-byte beats.

    Returns ``[(start, beats), ...]``: the first burst starts at ``addr`` rounded down
    to the beat, each burst starts where the previous one ended, has at most
    ``max_beats`` beats and ends at the latest at the next ``AXI_PAGE`` boundary. No
    bursts for ``nbytes`` = 0. ``beat`` is a power of two no larger than ``AXI_PAGE``.
    """
    if nbytes == 0:
        return []
    start = addr & ~(beat - 1)
    left = (addr + nbytes - 1) // beat - addr // beat + 1
    out = []
    while left:
        n = min(left, max_beats, (AXI_PAGE - start % AXI_PAGE) // beat)
        out.append((start, n))
        start += n * beat
        left -= n
    return out

# ---- receive side (responder) ----------------------------------------------------------
NUM_MRS = 1024                  # memory regions in the key table (key index = key >> 8)
PD_BITS = 24                    # protection-domain number width
RX_MAX_FRAME = 9216             # MAC RX: longest frame the MAC hands over (jumbo; it cuts longer ones)
# received beats held until their frame's verdict: a whole frame of RX_MAX_FRAME bytes
# (72 beats) and the beats that pass while its verdict is made
RX_BEAT_BUFFER = 80
# Signaled RC WQEs waiting for their ACK, all QPs together (a shared pool; a full pool
# stalls MAC TX): 4096 cover 8.7 us of ACK round trip at 471.7 M signaled WQEs/s (the
# 8-byte WRITE rate); one QP may take all of it (min(SQ depth, pool) per QP)
RC_COMPLETION_POOL = 4096
# READs and atomics a QP has outstanding at most (the requester's ring of them per QP, and
# the responder resources a peer is assumed to have: IBTA's max_rd_atomic, 16 as mlx5)
MAX_RD_ATOMIC = 16
# READs and atomics a QP's receive side answers at once at most (its responder resources,
# IBTA's max_dest_rd_atomic): one beyond them is NAKed invalid request. The atomic unit
# keeps as many replay records per QP, so every atomic a requester may retry has one.
MAX_DEST_RD_ATOMIC = 16
