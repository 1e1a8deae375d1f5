#!/bin/bash
# Build (idempotently) the Soft-RoCE (rdma_rxe) qemu guest, from Debian packages only.
#
#   interop/guest/build_guest.sh           build if needed; prints one status line, then the folder
#   interop/guest/build_guest.sh --path    print the folder only; exit 0 if built, 3 if not
#
# Output: ${IBGDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibgda-nic}/rxe-guest-<key>/ with
# vmlinux (booted directly, PVH), initramfs.cpio.gz, verbs_peer, build.log and a stamp.
# key = the Debian kernel version + a hash of the guest sources and the package versions,
# so any change rebuilds. The guest packages are fetched with `apt-get download` and
# extracted, never installed; only host tools (qemu-system-x86, gcc) are installed with apt.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${IBGDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibgda-nic}
PKGS=(busybox-static iproute2 rdma-core libibverbs1 ibverbs-providers libibverbs-dev
      libnl-3-200 libnl-route-3-200 libc6 libbpf1 libelf1 libmnl0 libbsd0 libmd0 libcap2 zlib1g)

die() { echo "build_guest: $*" >&2; exit 1; }

# one apt-cache call (it costs ~0.7 s): the kernel meta package names the kernel and its version
INFO=$(apt-cache show --no-all-versions linux-image-amd64 "${PKGS[@]}" 2>/dev/null |
       awk '/^(Package|Version):/ {print $2} /^Depends:/ && !k {k = 1; print "kpkg", $2}') || true
KPKG=$(echo "$INFO" | awk '$1 == "kpkg" {print $2; exit}')
KDEB=$(echo "$INFO" | awk '$0 == "linux-image-amd64" {getline; print; exit}')
[ -n "$KPKG" ] && [ -n "$KDEB" ] || die "apt-cache cannot resolve linux-image-amd64 (run: apt-get update)"
KVER=${KPKG#linux-image-}
VERSIONS=$INFO
HASH=$( (cat "$SRC/build_guest.sh" "$SRC/init.sh" "$SRC/mkimage.py" "$SRC/verbs_peer.c"; echo "$VERSIONS") |
        sha256sum | cut -c1-12)
OUT="$CACHE/rxe-guest-$KDEB-$HASH"

if [ "${1:-}" = "--path" ]; then
    echo "$OUT"; [ -f "$OUT/stamp" ] && exit 0 || exit 3
fi
if [ -f "$OUT/stamp" ]; then
    echo "rxe guest: cached ($KPKG $KDEB)"
    echo "$OUT"; exit 0
fi

mkdir -p "$OUT"
LOG="$OUT/build.log"
echo "rxe guest: building for $KPKG $KDEB (log: $LOG)"
: > "$LOG"
fail() { echo "build_guest: FAILED: $*; last lines of $LOG:" >&2; tail -n 25 "$LOG" >&2; rm -rf "${WORK:-/nonexistent}"; exit 1; }
run() { echo "+ $*" >> "$LOG"; nice "$@" >> "$LOG" 2>&1; }
START=$(date +%s)

# host tools: qemu to run the guest, gcc to compile verbs_peer
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing host packages ${need[*]} (apt-get install them as root)"
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" ||
        fail "apt-get install ${need[*]}"
fi

WORK="$OUT/work"
rm -rf "$WORK"; mkdir -p "$WORK/debs" "$WORK/root"
(cd "$WORK/debs" && run apt-get -o APT::Sandbox::User=root download "$KPKG" "${PKGS[@]}") ||
    fail "apt-get download"
for d in "$WORK"/debs/*.deb; do
    case "$d" in
    */linux-image-*)   # the kernel, and only the module folders rxe and virtio-net come from
        echo "+ extract $d (boot, drivers, crypto, net)" >> "$LOG"
        dpkg-deb --fsys-tarfile "$d" | nice tar -x -C "$WORK/root" --wildcards './boot/vmlinuz-*' \
            './lib/modules/*/kernel/drivers/*' './lib/modules/*/kernel/crypto/*' \
            './lib/modules/*/kernel/net/*' >> "$LOG" 2>&1 || fail "extract $d" ;;
    *) run dpkg-deb -x "$d" "$WORK/root" || fail "extract $d" ;;
    esac
done

R="$WORK/root"; L="$R/usr/lib/x86_64-linux-gnu"
run gcc -O2 -Wall -Wextra -o "$OUT/verbs_peer" "$SRC/verbs_peer.c" -I"$R/usr/include" \
    -L"$L" -Wl,-rpath-link,"$L" -Wl,-rpath-link,"$R/lib/x86_64-linux-gnu" -libverbs || fail "compile verbs_peer"
run /usr/bin/python3 "$SRC/mkimage.py" "$R" "$KVER" "$OUT/verbs_peer" "$SRC/init.sh" "$OUT" || fail "mkimage"
rm -rf "$WORK"
{ echo "kernel=$KPKG $KDEB"; echo "hash=$HASH"; echo "built=$(date -u +%FT%TZ) in $(( $(date +%s) - START )) s"; } > "$OUT/stamp"
echo "$OUT"
