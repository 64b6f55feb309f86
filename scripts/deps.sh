#!/usr/bin/env bash
# Installs the Debian packages podnet needs at run and test time, only those
# that are missing, so it is cheap to run before every build.
set -euo pipefail

packages=(
	iproute2        # ip, bridge
	iptables        # iptables, iptables-restore (nft and legacy)
	kmod            # modprobe br_netfilter, vxlan
	procps          # sysctl, ps
	bind9-dnsutils  # dig
	iperf3          # throughput benchmarks
	dnsmasq-base    # a real upstream DNS server for dnsd's forwarder tests
	dnsperf         # DNS benchmarks
	ethtool
	etcd-server     # the e2e tests' kube-apiserver stores its objects here
	clang-19        # compiles bpf/ (make generate, and make test's check of the committed objects)
	llvm-19         # llvm-strip-19 for the generated objects
	mmdebstrap      # make image: the Debian layer of the image, without a Docker engine
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: all ${#packages[@]} packages present"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing ${missing[*]}; run as root to install them" >&2
	exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# etcd-server's package would start a system etcd on the host; podnet's tests
# run their own in a namespace of their own. Keep services from starting
# while installing (Debian's policy-rc.d), unless the machine already has a
# policy of its own.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod +x "$policy"
	trap 'rm -f "$policy"' EXIT
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
