// Package conntrack deletes connection-tracking entries, so that a UDP
// client whose flow was pinned to an endpoint that went away (or to a
// Service VIP that had no endpoints) is sent somewhere that answers. It runs
// the conntrack CLI, which acts in the calling thread's network namespace.
package conntrack

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Filter selects entries. Zero fields match anything.
type Filter struct {
	Protocol    string // "udp", "tcp", "sctp"; required
	OrigDst     netip.Addr
	OrigDstPort uint16
	ReplySrc    netip.Addr
}

func (f Filter) args() ([]string, error) {
	if f.Protocol == "" {
		return nil, errors.New("conntrack filter: protocol is required")
	}
	args := []string{"-p", strings.ToLower(f.Protocol)}
	if f.OrigDst.IsValid() {
		args = append(args, "--orig-dst", f.OrigDst.String())
	}
	if f.OrigDstPort != 0 {
		args = append(args, "--orig-port-dst", strconv.Itoa(int(f.OrigDstPort)))
	}
	if f.ReplySrc.IsValid() {
		args = append(args, "--reply-src", f.ReplySrc.String())
	}
	return args, nil
}

var deletedRE = regexp.MustCompile(`(\d+) flow entries have been deleted`)

// Delete removes the entries matching f and returns how many it removed.
// Finding none is not an error.
func Delete(f Filter) (int, error) {
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command("conntrack", append([]string{"-D"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	if m := deletedRE.FindSubmatch(out.Bytes()); m != nil {
		n, _ := strconv.Atoi(string(m[1]))
		return n, nil
	}
	if runErr != nil {
		return 0, fmt.Errorf("conntrack -D %s: %w: %s", strings.Join(args, " "), runErr, strings.TrimSpace(out.String()))
	}
	return 0, nil
}

// Count returns how many entries match f.
func Count(f Filter) (int, error) {
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command("conntrack", append([]string{"-L"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("conntrack -L %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return bytes.Count(stdout.Bytes(), []byte("\n")), nil
}
