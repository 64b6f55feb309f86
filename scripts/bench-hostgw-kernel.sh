#!/bin/bash
# The kernel's ceiling for the host-gw pod path, per family (issue 22): the
# path BenchmarkPodThroughputFamilies measures with podnet (pod veth, cbr0,
# node forwarding, underlay bridge, peer node, its cbr0, pod veth) built with
# ip commands alone, IPv4 and IPv6 pods, one iperf3 stream each, the family
# going first alternating by round; prints each round's IPv6 / IPv4.
# BRNF=1 adds what a podnet node has on the way: br_netfilter's hooks on
# (bridge-nf-call-iptables and -ip6tables) and a MASQUERADE rule per family
# (conntrack). ROUNDS (7) and SECS (5) set the runs. Needs root and iperf3;
# everything lives in namespaces named $PREFIX-* (v6bk-*), removed at exit.
# "up" only builds the path and leaves it (the server pod is $PREFIX-pod2
# at 10.1.2.2 and fd00:1:2::2, the client $PREFIX-pod1; BenchmarkPodThroughputFamilies
# measures it beside podnet's host-gw); "down" removes it.
set -e
P=${PREFIX:-v6bk}
ROUNDS=${ROUNDS:-7}; SECS=${SECS:-5}
cleanup() { for n in pod1 node1 ul node2 pod2; do ip netns del $P-$n 2>/dev/null || true; done; }
case "${1:-}" in
  down) cleanup; exit 0 ;;
  up) ;;
  "") trap cleanup EXIT ;;
  *) echo "usage: $0 [up|down]" >&2; exit 2 ;;
esac
cleanup
for n in pod1 node1 ul node2 pod2; do ip netns add $P-$n; ip -n $P-$n link set lo up; done
ip -n $P-ul link add br0 type bridge; ip -n $P-ul link set br0 up
for i in 1 2; do
  N=$P-node$i; Pd=$P-pod$i
  ip netns exec $N sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.all.accept_dad=0
  ip netns exec $Pd sysctl -qw net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.all.accept_dad=0
  ip -n $N link add eth0 type veth peer name n$i netns $P-ul
  ip -n $P-ul link set n$i master br0 up
  ip -n $N addr add 192.168.50.1$i/24 dev eth0; ip -n $N addr add fd00:50::1$i/64 dev eth0 nodad; ip -n $N link set eth0 up
  ip -n $N link add cbr0 type bridge; ip -n $N addr add 10.1.$i.1/24 dev cbr0; ip -n $N addr add fd00:1:$i::1/64 dev cbr0 nodad; ip -n $N link set cbr0 up
  ip -n $N link add vp$i type veth peer name eth0 netns $Pd
  ip -n $N link set vp$i master cbr0 up
  ip -n $Pd addr add 10.1.$i.2/24 dev eth0; ip -n $Pd addr add fd00:1:$i::2/64 dev eth0 nodad; ip -n $Pd link set eth0 up
  ip -n $Pd route add default via 10.1.$i.1; ip -n $Pd -6 route add default via fd00:1:$i::1
done
if [ "${BRNF:-0}" = 1 ]; then for i in 1 2; do
  ip netns exec $P-node$i sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
  ip netns exec $P-node$i iptables-nft -t nat -A POSTROUTING -s 10.1.0.0/16 ! -d 10.1.0.0/16 -j MASQUERADE
  ip netns exec $P-node$i ip6tables-nft -t nat -A POSTROUTING -s fd00:1::/32 ! -d fd00:1::/32 -j MASQUERADE
done; fi
ip -n $P-node1 route add 10.1.2.0/24 via 192.168.50.12; ip -n $P-node1 -6 route add fd00:1:2::/64 via fd00:50::12
ip -n $P-node2 route add 10.1.1.0/24 via 192.168.50.11; ip -n $P-node2 -6 route add fd00:1:1::/64 via fd00:50::11
sleep 1
for a in 10.1.2.2 fd00:1:2::2; do for t in $(seq 50); do r=0; ip netns exec $P-pod1 timeout 1 bash -c "echo >/dev/tcp/$a/9" 2>/dev/null || r=$?; [ $r = 1 ] && break; sleep 0.1; done; done
[ "${1:-}" = up ] && exit 0
run() { ip netns exec $P-pod2 iperf3 -s -1 -p 5202 >/dev/null 2>&1 & sleep 0.3; ip netns exec $P-pod1 iperf3 -c $1 -p 5202 -t $SECS -J | python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'; wait; }
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then a=$(run 10.1.2.2); b=$(run fd00:1:2::2); else b=$(run fd00:1:2::2); a=$(run 10.1.2.2); fi
  echo "round $r v4 $a v6 $b ratio $(python3 -c "print('%.2f' % ($b/$a))")"
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
