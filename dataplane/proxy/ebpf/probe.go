package ebpf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/podnet/podnet/bpf"
)

// Probe reports what this kernel lacks for ebpf mode, naming the program
// type, helper or program the verifier refuses; nil when it has it all.
// It loads nothing it keeps and touches no cgroup.
func Probe() error {
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return fmt.Errorf("ebpf mode needs program type cgroup_sock_addr: %w", err)
	}
	for _, h := range []asm.BuiltinFunc{asm.FnGetSocketCookie, asm.FnGetNetnsCookie, asm.FnSetRetval} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h); err != nil {
			return fmt.Errorf("ebpf mode needs helper %s in cgroup_sock_addr programs: %w", h, err)
		}
	}
	spec, err := bpf.LoadSock()
	if err != nil {
		return err
	}
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	slices.Sort(names)
	// The verifier does not care how big the maps are; the real ones take
	// ~50 MiB to create, eight times over here.
	for _, m := range spec.Maps {
		m.MaxEntries = min(m.MaxEntries, 64)
	}
	for _, name := range names {
		one := spec.Copy()
		for other := range one.Programs {
			if other != name {
				delete(one.Programs, other)
			}
		}
		coll, err := ebpf.NewCollection(one)
		if err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return fmt.Errorf("ebpf mode: the kernel refuses program %s (attach type %s): %v", name, spec.Programs[name].AttachType, ve)
			}
			return fmt.Errorf("ebpf mode: load program %s (attach type %s): %w", name, spec.Programs[name].AttachType, err)
		}
		coll.Close()
	}
	return nil
}
