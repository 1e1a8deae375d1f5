#!/usr/bin/python3
"""Assemble the rxe guest from an extracted Debian root (called by build_guest.sh).

    mkimage.py ROOT KVER VERBS_PEER INIT OUTDIR

ROOT: the .debs extracted with dpkg-deb -x; KVER: kernel release (6.1.0-57-amd64);
VERBS_PEER: the compiled program; INIT: the /init script. Writes OUTDIR/vmlinux (the
uncompressed kernel, booted directly through its PVH note) and OUTDIR/initramfs.cpio.gz
(busybox, iproute2's ip and rdma, verbs_peer, their shared libraries from ROOT, the rxe
provider, and the kernel modules rdma_rxe and virtio-net need, in load order).
Standard library only.
"""
import gzip
import lzma
import os
import re
import struct
import sys

MODULES = ["virtio_pci", "virtio_net", "crc32_generic", "rdma_rxe"]   # crc32 before rxe (INTEROP)
LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib"]


def extract_vmlinux(bzimage, out):
    """The bzImage's xz payload (boot protocol: setup_sects, payload_offset/length)."""
    d = open(bzimage, "rb").read()
    if d[0x202:0x206] != b"HdrS":
        sys.exit(f"{bzimage}: not a bzImage")
    setup_sects = d[0x1F1] or 4
    off, length = struct.unpack_from("<II", d, 0x248)
    start = (setup_sects + 1) * 512 + off
    payload = d[start:start + length]
    if not payload.startswith(b"\xfd7zXZ\x00"):
        sys.exit(f"{bzimage}: payload is not xz (magic {payload[:6].hex()})")
    vmlinux = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    if vmlinux[:4] != b"\x7fELF":
        sys.exit("decompressed kernel is not an ELF")
    with open(out, "wb") as f:
        f.write(vmlinux)


def module_order(root, kver):
    """The .ko files of MODULES and their depends= (from .modinfo), dependencies first."""
    base = os.path.join(root, "lib/modules", kver, "kernel")
    index = {}
    for dp, _, files in os.walk(base):
        for fn in files:
            if fn.endswith(".ko"):
                index[fn[:-3].replace("-", "_")] = os.path.join(dp, fn)
    order = []

    def visit(m, stack=()):
        if m in order:
            return
        if m not in index:
            sys.exit(f"module {m} not found in {base}")
        data = open(index[m], "rb").read()
        dep = re.search(rb"\x00depends=([^\x00]*)\x00", data)
        for d in (dep.group(1).decode().split(",") if dep and dep.group(1) else []):
            if d not in stack:
                visit(d, stack + (m,))
        order.append(m)

    for m in MODULES:
        visit(m)
    return [(m, index[m]) for m in order]


def needed(path):
    """DT_NEEDED names of an ELF64 little-endian file (no external tools)."""
    d = open(path, "rb").read()
    if d[:4] != b"\x7fELF" or d[4] != 2:
        return []
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for s in secs:
        if s[1] == 6:                                   # SHT_DYNAMIC; sh_link -> its string table
            strtab = secs[s[6]]
            for i in range(0, s[5], 16):
                tag, val = struct.unpack_from("<qQ", d, s[4] + i)
                if tag == 1:
                    end = d.index(b"\x00", strtab[4] + val)
                    out.append(d[strtab[4] + val:end].decode())
    return out


def find_lib(root, name):
    for ld in LIBDIRS:
        p = os.path.join(root, ld, name)
        for _ in range(8):                  # follow symlinks inside ROOT (absolute ones too)
            if not os.path.islink(p):
                break
            t = os.readlink(p)
            p = os.path.join(root, t.lstrip("/")) if t.startswith("/") else os.path.join(os.path.dirname(p), t)
        if os.path.isfile(p):
            return p
    sys.exit(f"shared library {name} not found in the extracted packages (add its package)")


class Cpio:
    """A newc cpio archive, written in memory."""

    def __init__(self):
        self.buf = bytearray()
        self.ino = 1000
        self.seen = set()

    def _entry(self, name, mode, data=b""):
        self.ino += 1
        nb = name.encode() + b"\x00"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        self.buf += hdr.encode() + nb + b"\x00" * ((-(110 + len(nb))) % 4)
        self.buf += data + b"\x00" * ((-len(data)) % 4)

    def dir(self, name):
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p and p not in self.seen:
                self.seen.add(p)
                self._entry(p, 0o040755)

    def file(self, name, data, mode=0o755):
        name = name.strip("/")
        self.dir(os.path.dirname(name))
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name, target):
        name = name.strip("/")
        self.dir(os.path.dirname(name))
        self._entry(name, 0o120777, target.encode())

    def trailer(self):
        self._entry("TRAILER!!!", 0)
        return bytes(self.buf)


def main():
    root, kver, peer, init, outdir = sys.argv[1:6]
    root = os.path.realpath(root)
    extract_vmlinux(os.path.join(root, "boot", f"vmlinuz-{kver}"), os.path.join(outdir, "vmlinux"))
    c = Cpio()
    for d in ("proc", "sys", "dev", "tmp", "etc", "usr/sbin", "sbin", "usr/bin"):
        c.dir(d)
    c.file("init", open(init, "rb").read())
    c.file("bin/busybox", open(os.path.join(root, "bin/busybox"), "rb").read())
    c.symlink("bin/sh", "busybox")
    elves = {"usr/sbin/ip": os.path.join(root, "bin/ip"),
             "usr/sbin/rdma": os.path.join(root, "usr/bin/rdma"),
             "usr/bin/verbs_peer": peer}
    prov = "usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
    elves[prov] = os.path.join(root, prov)
    for dst, src in elves.items():
        c.file(dst, open(src, "rb").read())
    c.file("etc/libibverbs.d/rxe.driver", open(os.path.join(root, "etc/libibverbs.d/rxe.driver"), "rb").read(), 0o644)
    # shared libraries: the DT_NEEDED closure, all from the extracted packages
    todo, libs = list(elves.values()), {}
    while todo:
        for n in needed(todo.pop()):
            if n not in libs:
                libs[n] = find_lib(root, n)
                todo.append(libs[n])
    for n, p in sorted(libs.items()):
        c.file("lib/x86_64-linux-gnu/" + n, open(p, "rb").read())
    c.symlink("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    mods = module_order(root, kver)
    for m, p in mods:
        c.file(f"lib/modules/{m}.ko", open(p, "rb").read(), 0o644)
    c.file("lib/modules/load.order", ("\n".join(m for m, _ in mods) + "\n").encode(), 0o644)
    data = gzip.compress(c.trailer(), compresslevel=6, mtime=0)
    with open(os.path.join(outdir, "initramfs.cpio.gz"), "wb") as f:
        f.write(data)
    print(f"modules: {' '.join(m for m, _ in mods)}")
    print(f"libraries: {' '.join(sorted(libs))}")
    print(f"initramfs: {len(data)} bytes")


if __name__ == "__main__":
    main()
