{{/* The image every container runs. */}}
{{- define "podnet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* proxyd's --cluster-cidr: one prefix per family, IPv4 first. */}}
{{- define "podnet.clusterCIDR" -}}
{{- $cidrs := list -}}
{{- with .Values.clusterCIDR.ipv4 }}{{ $cidrs = append $cidrs . }}{{ end -}}
{{- with .Values.clusterCIDR.ipv6 }}{{ $cidrs = append $cidrs . }}{{ end -}}
{{- if not $cidrs }}{{ fail "clusterCIDR: set ipv4, ipv6 or both" }}{{ end -}}
{{ join "," $cidrs }}
{{- end -}}

{{/* Refuses values the chart cannot honour, naming each. */}}
{{- define "podnet.validate" -}}
{{- if not (has .Values.proxyMode (list "iptables" "ebpf" "nftables")) -}}
{{- fail (printf "proxyMode %q: want iptables, ebpf or nftables" .Values.proxyMode) -}}
{{- end -}}
{{- if not (has .Values.migrationStage (list "" "beside" "services" "dns" "pod-network")) -}}
{{- fail (printf "migrationStage %q: want \"\" (podnet whole), beside, services, dns or pod-network" .Values.migrationStage) -}}
{{- end -}}
{{- if and (eq .Values.migrationStage "pod-network") (ne .Values.proxyMode "iptables") -}}
{{- fail (printf "migrationStage pod-network runs proxyMode iptables only (deploy/migrate/4-pod-network), not %q" .Values.proxyMode) -}}
{{- end -}}
{{- end -}}

{{/* Whether podnet-dns and the kube-dns Service are installed: not while
CoreDNS still serves (stages beside and services). */}}
{{- define "podnet.withDNS" -}}
{{- if not (has .Values.migrationStage (list "beside" "services")) }}true{{ end -}}
{{- end -}}
