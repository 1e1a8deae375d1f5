"""Host side of the UDP link to the rxe guest (qemu ``-netdev dgram``).

One UDP datagram on 127.0.0.1 is one Ethernet frame, without FCS and without a vnet header.
The bridge owns the host port; qemu owns the guest port and sends its frames to the host port.

    bridge = UdpBridge(pcap="run.pcap")          # host port and guest port picked free
    guest = RxeGuest(host_port=bridge.port, guest_port=bridge.guest_port, ...)
    bridge.send(frame)                           # one frame to the guest
    f = bridge.recv(timeout=0.1)                 # one frame from the guest, or None

Standard library only (the optional pcap writer imports scapy, present in the venv).
"""
import select
import socket
import time

__all__ = ["UdpBridge", "free_udp_port", "is_roce"]

ROCEV2_PORT = 4791


def free_udp_port(host="127.0.0.1"):
    """A UDP port on ``host`` that was free a moment ago (for qemu's side of the link)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_roce(frame):
    """True for an IPv4/UDP frame to port 4791 (RoCEv2); the guest also sends IPv6
    neighbour discovery and similar frames, which callers usually skip."""
    return (len(frame) >= 42 and frame[12:14] == b"\x08\x00" and frame[23] == 17
            and int.from_bytes(frame[36:38], "big") == ROCEV2_PORT)


class UdpBridge:
    """A non-blocking UDP socket bound to ``host:port`` that exchanges frames with qemu
    listening on ``host:guest_port``.

    Parameters:
        port: host port to bind (0: any free one; read it back from ``.port``).
        guest_port: qemu's local port (None: a free one is picked).
        pcap: path of a pcap file that records every frame both ways (None: none).
        host: the loopback address both sides use.
    """

    def __init__(self, port=0, guest_port=None, pcap=None, host="127.0.0.1"):
        self.host = host
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((host, port))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.guest_port = guest_port or free_udp_port(host)
        self.sent = 0
        self.received = 0
        self._pcap = None
        if pcap is not None:
            from scapy.utils import PcapWriter
            self._pcap = PcapWriter(str(pcap), linktype=1, sync=True)    # DLT_EN10MB

    def _record(self, frame):
        if self._pcap is not None:
            self._pcap.write(frame)

    def send(self, frame):
        """Send one frame (bytes) to the guest as one datagram."""
        frame = bytes(frame)
        self.sock.sendto(frame, (self.host, self.guest_port))
        self.sent += 1
        self._record(frame)

    def recv(self, timeout=0.0):
        """One frame from the guest, waiting at most ``timeout`` seconds (0: no wait);
        None when none came. Datagrams from other sources than qemu's port are ignored."""
        while True:
            try:
                data, addr = self.sock.recvfrom(65536)
            except BlockingIOError:
                if timeout <= 0:
                    return None
                r, _, _ = select.select([self.sock], [], [], timeout)
                if not r:
                    return None
                timeout = 0
                continue
            if addr[1] != self.guest_port:
                continue
            self.received += 1
            self._record(data)
            return data

    def recv_roce(self, timeout=0.0):
        """The next RoCEv2 frame (others are read and dropped), bounded by ``timeout``
        seconds in all; None when none came."""
        end = time.monotonic() + timeout
        while True:
            f = self.recv(max(0.0, end - time.monotonic()))
            if f is None or is_roce(f):
                return f

    def drain(self):
        """Every frame waiting now (a list, possibly empty)."""
        out = []
        while (f := self.recv(0)) is not None:
            out.append(f)
        return out

    def close(self):
        self.sock.close()
        if self._pcap is not None:
            self._pcap.close()
            self._pcap = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
