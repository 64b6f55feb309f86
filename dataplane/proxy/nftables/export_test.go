package nftables

import (
	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink/nltest"
)

// ApplyDry builds ops' batch as Apply does and hands it to fn instead of
// the kernel: the Go side of a transaction alone.
func ApplyDry(ops []Op, fn nltest.Func) error {
	c, err := nft.New(nft.WithTestDial(fn))
	if err != nil {
		return err
	}
	return applyOn(c, ops)
}
