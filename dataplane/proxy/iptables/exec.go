package iptables

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// Backends of the iptables command.
const (
	BackendNFT    = "nft"
	BackendLegacy = "legacy"
)

// ExecRunner runs the iptables-<backend> commands. The commands inherit the
// calling thread's network namespace.
type ExecRunner struct {
	Backend string // BackendNFT or BackendLegacy
}

func (r ExecRunner) cmd(tool string) string { return "iptables-" + r.Backend + tool }

func run(name string, stdin []byte, args ...string) ([]byte, error) {
	c := exec.Command(name, args...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	c.Stdout, c.Stderr = &out, &stderr
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}

// Restore implements Runner.
func (r ExecRunner) Restore(data []byte) error {
	_, err := run(r.cmd("-restore"), data, "--noflush", "-w", "5")
	return err
}

// Save implements Runner.
func (r ExecRunner) Save(table string) ([]byte, error) {
	return run(r.cmd("-save"), nil, "-t", table)
}

// ListRules implements Runner. iptables-legacy reads the whole table for
// any command, so one iptables-save is cheaper than one -S per chain; with
// nft, -S reads just the chain.
func (r ExecRunner) ListRules(table string, chains []string) (map[string][]string, error) {
	if r.Backend == BackendLegacy {
		out, err := r.Save(table)
		if err != nil {
			return nil, err
		}
		return ChainRules(out, chains), nil
	}
	rules := make(map[string][]string)
	for _, c := range chains {
		out, err := run(r.cmd(""), nil, "-w", "5", "-t", table, "-S", c)
		if err != nil {
			return nil, err
		}
		rules[c] = ChainRules(out, []string{c})[c]
	}
	return rules, nil
}

// DetectBackend picks the iptables backend the node already uses, the way
// kube-proxy's iptables-wrapper does: the one holding more rules; on a tie
// the one the node's own iptables command uses, else nft. A backend whose
// tools are missing is not chosen.
func DetectBackend() string {
	count := func(b string) int {
		out, err := exec.Command("iptables-" + b + "-save").Output()
		if err != nil {
			return -1
		}
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-") {
				n++
			}
		}
		return n
	}
	nft, legacy := count(BackendNFT), count(BackendLegacy)
	switch {
	case legacy > nft:
		return BackendLegacy
	case legacy == nft && legacy >= 0:
		if out, err := exec.Command("iptables", "--version").Output(); err == nil && strings.Contains(string(out), "legacy") {
			return BackendLegacy
		}
	}
	return BackendNFT
}
