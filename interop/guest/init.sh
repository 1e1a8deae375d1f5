#!/bin/busybox sh
# /init of the rxe guest: modules, eth0, rxe0, then verbs_peer on the serial console.
# Parameters from the kernel command line (defaults in brackets):
#   ibgda_ip=10.0.0.2/24  ibgda_mac=(qemu's)  ibgda_mtu=9000  ibgda_dev=eth0
#   ibgda_peer_ip=, ibgda_peer_mac=   optional permanent neighbour entry (the engine answers no ARP)
#   ibgda_shell=1                     a shell instead of verbs_peer (debugging)
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/bin:/sbin:/usr/bin
IP=/usr/sbin/ip      # iproute2 (busybox sh prefers its own applets to PATH, and its ip is limited)
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "fatal init: $*"; sleep 1; reboot -f; }

ibgda_ip=10.0.0.2/24; ibgda_mac=; ibgda_mtu=9000; ibgda_dev=eth0; ibgda_peer_ip=; ibgda_peer_mac=; ibgda_shell=
for kv in $(cat /proc/cmdline); do
    case "$kv" in ibgda_*=*) eval "${kv%%=*}=\"\${kv#*=}\"" ;; esac
done

for m in $(cat /lib/modules/load.order); do
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
done
i=0
while [ ! -e "/sys/class/net/$ibgda_dev" ]; do
    i=$((i + 1)); [ $i -gt 50 ] && fail "no $ibgda_dev"; sleep 0.1
done
$IP link set lo up
[ -n "$ibgda_mac" ] && { $IP link set "$ibgda_dev" address "$ibgda_mac" || fail "mac"; }
$IP link set "$ibgda_dev" mtu "$ibgda_mtu" up || fail "mtu $ibgda_mtu"
$IP addr add "$ibgda_ip" dev "$ibgda_dev" || fail "ip $ibgda_ip"
if [ -n "$ibgda_peer_ip" ] && [ -n "$ibgda_peer_mac" ]; then
    $IP neigh replace "$ibgda_peer_ip" lladdr "$ibgda_peer_mac" nud permanent dev "$ibgda_dev" || fail "neigh"
fi
/usr/sbin/rdma link add rxe0 type rxe netdev "$ibgda_dev" || fail "rdma link add"

stty -echo 2>/dev/null
echo "init: up in $(cut -d' ' -f1 /proc/uptime) s"
if [ -n "$ibgda_shell" ]; then sh; else verbs_peer "$ibgda_dev"; fi
echo "init: verbs_peer exited ($?), rebooting"
reboot -f
