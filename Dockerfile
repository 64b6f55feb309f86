# One image with the three podnet binaries. Static, so the runtime stage
# needs only the tools proxyd execs (iptables, modprobe).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN make bin/podnet bin/loopback bin/portmap bin/proxyd bin/dnsd VERSION=${VERSION} CGO_ENABLED=0

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables kmod iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/podnet /src/bin/loopback /src/bin/portmap /src/bin/proxyd /src/bin/dnsd /usr/local/bin/
# dnsd runs as this user (the Deployment sets it too); the CNI installer and
# proxyd need root for /opt/cni, netlink and iptables and set runAsUser: 0.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dnsd"]
