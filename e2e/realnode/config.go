package realnode

import "fmt"

// containerdConfig is containerd 1.6's CRI configuration for the node.
// restrict_oom_score_adj: root here may lack CAP_SYS_RESOURCE, and runc
// cannot create the sandbox when it must lower an OOM score.
func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`, n.o.PauseImage, n.o.Binaries.Runc())
}

// kubeletConfig is the kubelet's configuration: cgroup v1 through cgroupfs
// under the node's own root, no eviction or image GC to fight the locally
// imported images, anonymous access to its API for the lab's API server
// (logs, exec).
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
evictionPressureTransitionPeriod: 0s
readOnlyPort: 0
healthzPort: 0
localStorageCapacityIsolation: false
volumePluginDir: /var/lib/kubelet/volumeplugins
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
`, n.CgroupV1)
}
