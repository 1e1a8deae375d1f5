"""Linux Soft-RoCE (rdma_rxe) in a qemu guest, scripted through its verbs program.

The guest (built by ``interop/guest/build_guest.sh``) boots Debian's kernel under TCG with a
busybox initramfs, brings up eth0 and rxe0 and runs ``verbs_peer``, which reads one command
per line on the serial console and answers one line (``ok key=value ...`` or ``err ...``);
see the command grammar at the top of ``interop/guest/verbs_peer.c``.

Synchronous use (a plain test)::

    with UdpBridge() as br, RxeGuest(host_port=br.port, guest_port=br.guest_port) as g:
        qp = g.create_qp(0, mtu=4096)          # {'qp': 0, 'qpn': 17, 'psn': 0}
        mr = g.reg_mr(0, 4096)                 # {'addr': ..., 'rkey': ..., ...}

Non-blocking use (e.g. from a cocotb coroutine that must keep the clock running):
``g.send_command(line)`` then ``g.try_reply()`` (None until the reply is in).

Standard library only. Every RxeGuest kills its qemu on ``close()``, at interpreter exit,
and when garbage-collected.
"""
import atexit
import collections
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import weakref
from pathlib import Path

__all__ = ["RxeGuest", "GuestError", "find_image", "parse_reply"]

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "interop" / "guest" / "build_guest.sh"


class GuestError(RuntimeError):
    """The guest could not be started or a command failed; the message says why."""


def parse_reply(line):
    """``ok a=1 b=0x2 c=text`` -> {'a': 1, 'b': 2, 'c': 'text'} (numbers decoded, the
    hex dump of ``rmem`` as bytes under 'data'); ``ok empty`` -> {'empty': True}."""
    out = {}
    for tok in line.split()[1:]:
        k, eq, v = tok.partition("=")
        if not eq:
            out[k] = True
        elif k == "hex":
            out["data"] = bytes.fromhex(v)
        else:
            try:
                out[k] = int(v, 0)
            except ValueError:
                out[k] = v
    return out


def find_image(image_dir=None):
    """The folder holding vmlinux and initramfs.cpio.gz: ``image_dir``, else $IBGDA_RXE_GUEST,
    else the one ``build_guest.sh --path`` names. Raises GuestError when it is not built."""
    d = image_dir or os.environ.get("IBGDA_RXE_GUEST")
    if not d:
        if not BUILD_SCRIPT.exists():
            raise GuestError(f"{BUILD_SCRIPT} is missing")
        r = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True)
        if r.returncode not in (0, 3) or not r.stdout.strip():
            raise GuestError(f"{BUILD_SCRIPT} --path failed: {(r.stderr or r.stdout).strip()}")
        d = r.stdout.strip().splitlines()[-1]
    d = Path(d)
    missing = [n for n in ("vmlinux", "initramfs.cpio.gz", "stamp") if not (d / n).exists()]
    if missing:
        raise GuestError(f"rxe guest image not built ({', '.join(missing)} missing in {d}): "
                         f"run {BUILD_SCRIPT.relative_to(ROOT)}")
    return d


def _die_with_parent():
    """In the child before exec: SIGKILL when the thread that started qemu dies, so that
    a killed test run leaves no qemu behind (start the guest from a long-lived thread)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except Exception:
        pass


_live = weakref.WeakSet()


@atexit.register
def _kill_all():
    for g in list(_live):
        g.close(quiet=True)


class RxeGuest:
    """One qemu guest running rdma_rxe and verbs_peer.

    Parameters:
        host_port: host UDP port qemu sends the guest's frames to (``UdpBridge.port``).
        guest_port: qemu's own UDP port (``UdpBridge.guest_port``).
        mac, ip: the guest's eth0 MAC and IPv4 address/prefix.
        mtu: eth0's MTU (9000: path MTU 4096 possible; 1500: 1024 at most).
        peer_ip, peer_mac: optional permanent neighbour entry set at boot.
        image_dir: the built guest (default: see ``find_image``).
        accel: "tcg" (default; this host's /dev/kvm is PVM, where Debian's kernel fails)
            or "kvm".
        memory_mb, boot_timeout (s, bounded wait for the ready line), log_path (a copy
            of the whole serial console), extra_append (more kernel command line).
        start: boot in the constructor (default) or leave it to ``start()``.
    """

    def __init__(self, host_port, guest_port, *, mac="02:00:00:00:00:02", ip="10.0.0.2/24",
                 mtu=9000, peer_ip=None, peer_mac=None, image_dir=None, accel="tcg",
                 memory_mb=384, boot_timeout=120.0, log_path=None, extra_append="",
                 qemu="qemu-system-x86_64", start=True):
        self.host_port, self.guest_port = host_port, guest_port
        self.mac, self.ip, self.mtu = mac, ip, mtu
        self.peer_ip, self.peer_mac = peer_ip, peer_mac
        self.image_dir, self.accel, self.memory_mb = image_dir, accel, memory_mb
        self.boot_timeout, self.log_path, self.extra_append, self.qemu = boot_timeout, log_path, extra_append, qemu
        self.proc = None
        self.ready = None          # the parsed ready line: gid, gid_index, ip, mac, port_mtu
        self.boot_seconds = None   # wall time from qemu start to the ready line
        self.tail = collections.deque(maxlen=60)
        self._replies = queue.Queue()
        self._pending = 0
        self._reader = None
        self._log = None
        if start:
            self.start()

    # ---- life cycle -----------------------------------------------------------------
    def command_line(self):
        img = find_image(self.image_dir)
        append = ["console=ttyS0", "quiet", "loglevel=3", "panic=-1", f"ibgda_ip={self.ip}",
                  f"ibgda_mac={self.mac}", f"ibgda_mtu={self.mtu}"]
        if self.peer_ip and self.peer_mac:
            append += [f"ibgda_peer_ip={self.peer_ip}", f"ibgda_peer_mac={self.peer_mac}"]
        if self.extra_append:
            append.append(self.extra_append)
        net = (f"dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={self.guest_port},"
               f"remote.type=inet,remote.host=127.0.0.1,remote.port={self.host_port}")
        cpu = ["-accel", "tcg", "-cpu", "max"] if self.accel == "tcg" else ["-accel", "kvm", "-cpu", "host"]
        return [self.qemu, *cpu, "-m", str(self.memory_mb), "-smp", "1", "-nodefaults", "-no-reboot",
                "-display", "none", "-monitor", "none", "-serial", "stdio",
                "-kernel", str(img / "vmlinux"), "-initrd", str(img / "initramfs.cpio.gz"),
                "-append", " ".join(append), "-netdev", net,
                "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile="]

    def start(self):
        """Boot and wait (at most ``boot_timeout`` s) for verbs_peer's ready line."""
        if self.proc is not None:
            raise GuestError("guest already started")
        if shutil.which(self.qemu) is None:
            raise GuestError(f"{self.qemu} not found: apt-get install qemu-system-x86 "
                             f"(or run {BUILD_SCRIPT.relative_to(ROOT)})")
        cmd = self.command_line()
        if self.log_path:
            self._log = open(self.log_path, "w", buffering=1)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        _live.add(self)
        self._reader = threading.Thread(target=self._read, daemon=True, name="rxe-guest-console")
        self._reader.start()
        try:
            line = self._next(self.boot_timeout, booting=True)
        except GuestError:
            self.close(quiet=True)
            raise
        if not line.startswith("ready"):
            self.close(quiet=True)
            raise GuestError(f"guest failed to start: {line}\n--- console tail ---\n{self.console_tail()}")
        self.ready = parse_reply(line)
        self.boot_seconds = time.monotonic() - t0

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").replace("\r", "").rstrip("\n")
            line = line.lstrip("\x1bc")      # SeaBIOS' terminal reset
            self.tail.append(line)
            if self._log:
                self._log.write(line + "\n")
            word = line.split(" ", 1)[0]
            if word in ("ok", "err", "ready", "fatal"):
                self._replies.put(line)
        self._replies.put(None)              # EOF: qemu exited

    def _next(self, timeout, booting=False):
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            what = "boot (no ready line)" if booting else "reply"
            raise GuestError(f"timeout after {timeout} s waiting for {what}\n"
                             f"--- console tail ---\n{self.console_tail()}") from None
        if line is None:
            self._replies.put(None)
            rc = self.proc.wait(timeout=5) if self.proc else None
            raise GuestError(f"qemu exited (rc={rc})\n--- console tail ---\n{self.console_tail()}")
        return line

    def console_tail(self, n=40):
        return "\n".join(list(self.tail)[-n:])

    def close(self, quiet=False):
        """Quit verbs_peer, let the guest reboot (qemu exits with -no-reboot), else kill."""
        p, self.proc = self.proc, None
        if p is None:
            return
        _live.discard(self)
        try:
            if p.poll() is None and self.ready is not None:      # verbs_peer is running
                try:
                    p.stdin.write(b"quit\n")
                    p.stdin.flush()
                    p.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        finally:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            if self._reader:
                self._reader.join(timeout=5)
            if self._log:
                self._log.close()
                self._log = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "proc", None) is not None:
            self.close(quiet=True)

    # ---- commands -------------------------------------------------------------------
    def send_command(self, line):
        """Non-blocking: send one command line; its reply comes from ``try_reply``/``reply``."""
        if self.proc is None or self.proc.poll() is not None:
            raise GuestError(f"guest is not running\n--- console tail ---\n{self.console_tail()}")
        if "\n" in line or len(line) > 4000:
            raise GuestError("a command is one line of at most 4000 characters (tty limit)")
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        self._pending += 1

    def try_reply(self):
        """Non-blocking: the next reply as a raw line, or None if none is in yet."""
        try:
            line = self._replies.get_nowait()
        except queue.Empty:
            return None
        if line is None:
            self._replies.put(None)
            raise GuestError(f"qemu exited\n--- console tail ---\n{self.console_tail()}")
        self._pending -= 1
        return line

    def reply(self, timeout=30.0):
        """Blocking (bounded): the next reply as a raw line."""
        line = self._next(timeout)
        self._pending -= 1
        return line

    def cmd(self, line, timeout=30.0, check=True):
        """Send ``line`` and return its reply parsed (``parse_reply``); an ``err`` reply
        raises GuestError when ``check``, else comes back as {'err': message}."""
        if self._pending:
            raise GuestError(f"{self._pending} replies still pending: read them first")
        self.send_command(line)
        r = self.reply(timeout)
        if r.startswith("err"):
            if check:
                raise GuestError(f"{line!r} -> {r}")
            return {"err": r[4:]}
        return parse_reply(r)

    @staticmethod
    def _args(**kw):
        return " ".join(f"{k}={v:#x}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}"
                        for k, v in kw.items() if v is not None)

    def info(self):
        return self.cmd("info")

    def create_qp(self, qp, mtu=1024, psn=0, sq=64, rq=64, cqe=256, sge=8):
        """An RC QP with its own CQ, left in INIT; ``sge``: most SGEs a send or receive WQE has."""
        return self.cmd(f"qp id={qp} mtu={mtu} " + self._args(psn=psn, sq=sq, rq=rq, cqe=cqe, sge=sge))

    def reg_mr(self, mr, size):
        return self.cmd(f"mr id={mr} size={size}")

    def connect(self, qp, rqpn, rpsn, ip, mac=None, mtu=None, timeout=0, retry=7, rnr_retry=7, min_rnr=1):
        """INIT->RTR->RTS towards (ip, rqpn); ``mac`` adds a permanent neighbour entry.
        ``min_rnr``: the IBTA RNR timer code this QP's RNR NAKs carry (1: 0.01 ms ... 0:
        655.36 ms); ``rnr_retry``: how often it resends after an RNR NAK (7: forever).
        The reply holds what ``ibv_query_qp`` reads back afterwards: state, mtu, timeout,
        retry, rnr_retry, min_rnr (so a test can check they reached the QP)."""
        return self.cmd(f"connect qp={qp} ip={ip} " + self._args(
            rqpn=rqpn, rpsn=rpsn, mac=mac, mtu=mtu, timeout=timeout, retry=retry,
            rnr_retry=rnr_retry, min_rnr=min_rnr))

    @staticmethod
    def _sge(sges):
        """[(off, len), ...] -> 'OFF:LEN,...' (the gather/scatter list on one MR)."""
        return ",".join(f"{o:#x}:{n}" for o, n in sges)

    def _post(self, verb, qp, mr, off, length, sges, **kw):
        if sges is not None:
            return self.cmd(f"{verb} qp={qp} mr={mr} sge={self._sge(sges)} " + self._args(**kw))
        return self.cmd(f"{verb} qp={qp} mr={mr} " + self._args(off=off, len=length, **kw))

    def write(self, qp, mr, off, length, raddr, rkey, imm=None, wr=0, sges=None):
        """RDMA WRITE (with immediate when ``imm`` is given); ``sges``: a gather list
        [(off, len), ...] on ``mr`` instead of (off, length)."""
        return self._post("write", qp, mr, off, length, sges, raddr=raddr, rkey=rkey, imm=imm, wr=wr)

    def write_imm(self, qp, mr, off, length, raddr, rkey, imm, wr=0, sges=None):
        """RDMA WRITE with immediate (``imm``: host order; on the wire big-endian)."""
        return self._post("write_imm", qp, mr, off, length, sges, raddr=raddr, rkey=rkey, imm=imm, wr=wr)

    def read(self, qp, mr, off, length, raddr, rkey, wr=0):
        return self.cmd(f"read qp={qp} mr={mr} " + self._args(off=off, len=length, raddr=raddr, rkey=rkey, wr=wr))

    def fetch_add(self, qp, mr, off, raddr, rkey, add, wr=0):
        return self.cmd(f"fadd qp={qp} mr={mr} " + self._args(off=off, raddr=raddr, rkey=rkey, add=add, wr=wr))

    def compare_swap(self, qp, mr, off, raddr, rkey, compare, swap, wr=0):
        return self.cmd(f"cswap qp={qp} mr={mr} " + self._args(off=off, raddr=raddr, rkey=rkey, cmp=compare, swap=swap, wr=wr))

    def send(self, qp, mr, off=0, length=0, imm=None, wr=0, sges=None):
        """SEND (with immediate when ``imm`` is given); ``sges``: a gather list [(off, len), ...]."""
        return self._post("send", qp, mr, off, length, sges, imm=imm, wr=wr)

    def send_imm(self, qp, mr, off=0, length=0, imm=0, wr=0, sges=None):
        """SEND with immediate (``imm``: host order; on the wire big-endian)."""
        return self._post("send_imm", qp, mr, off, length, sges, imm=imm, wr=wr)

    def post_recv(self, qp, mr, off=0, length=0, wr=0, sges=None):
        """One receive WQE: one buffer (off, length) or a scatter list ``sges`` [(off, len), ...]
        on ``mr``; the reply says num_sge and len (the sum)."""
        return self._post("recv", qp, mr, off, length, sges, wr=wr)

    def poll_cq(self, qp, ms=1000):
        """One completion of ``qp``'s CQ, or None if none came within ``ms`` (guest wall time).
        A dict: wr, status (ibv_wc_status number), status_str (ibv_wc_status_str, blanks as
        '_'), status_name ('IBV_WC_SUCCESS', 'IBV_WC_RNR_RETRY_EXC_ERR', ...), opcode ('SEND',
        'RDMA_WRITE', 'RDMA_READ', 'COMP_SWAP', 'FETCH_ADD', 'RECV', 'RECV_RDMA_WITH_IMM';
        verbs defines it only for successful completions), opcode_num, byte_len, qp_num,
        src_qp, wc_flags, with_imm (bool: IBV_WC_WITH_IMM set) and imm (host order, only
        when with_imm)."""
        r = self.cmd(f"poll qp={qp} ms={ms}", timeout=ms / 1000 + 30)
        if r.get("empty"):
            return None
        if "with_imm" in r:
            r["with_imm"] = bool(r["with_imm"])
        return r

    def wait_cq(self, qp, n=1, ms=10000):
        """``n`` completions of ``qp`` (a list); GuestError if fewer come within ``ms`` each."""
        out = []
        for _ in range(n):
            wc = self.poll_cq(qp, ms)
            if wc is None:
                raise GuestError(f"qp {qp}: only {len(out)} of {n} completions: {out}")
            out.append(wc)
        return out

    def write_mem(self, mr, off, data):
        data = bytes(data)
        for i in range(0, len(data), 1024) or [0]:
            self.cmd(f"wmem mr={mr} off={off + i} hex={data[i:i + 1024].hex()}")

    def read_mem(self, mr, off, length):
        out = b""
        while len(out) < length:
            n = min(4096, length - len(out))
            out += self.cmd(f"rmem mr={mr} off={off + len(out)} len={n}")["data"]
        return out

    def counters(self):
        return self.cmd("counters")

    def qp_state(self, qp):
        return self.cmd(f"state qp={qp}")["state"]
