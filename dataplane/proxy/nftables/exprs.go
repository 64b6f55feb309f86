package nftables

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Network header offsets and lengths of the addresses, by family.
func addrOffset(f ipfamily.Family, fl Field) (off, n uint32) {
	switch {
	case f == ipfamily.IPv6 && fl == FieldSaddr:
		return 8, 16
	case f == ipfamily.IPv6:
		return 24, 16
	case fl == FieldSaddr:
		return 12, 4
	}
	return 16, 4
}

// load puts a field into the 32-bit register reg32 and returns how many
// 32-bit registers it takes.
func load(f ipfamily.Family, fl Field, reg32 uint32) (expr.Any, uint32) {
	switch fl {
	case FieldL4Proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32}, 1
	case FieldDport:
		return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg32, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, 1
	}
	off, n := addrOffset(f, fl)
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg32, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}, n / 4
}

// loadKey loads the concatenation of fields from the key register on.
func loadKey(f ipfamily.Family, fields []Field) []expr.Any {
	var out []expr.Any
	reg := uint32(reg32Key)
	for _, fl := range fields {
		e, n := load(f, fl, reg)
		out = append(out, e)
		reg += n
	}
	return out
}

// nftDynsetOpDelete is NFT_DYNSET_OP_DELETE (Linux 5.13), which
// golang.org/x/sys does not name.
const nftDynsetOpDelete = 2

func native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// bitsSet tests reg & mask != 0 (host byte order, 32 bits).
func bitsSet(mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Bitwise{SourceRegister: regKey, DestRegister: regKey, Len: 4, Mask: native32(mask), Xor: native32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regKey, Data: native32(0)},
	}
}

func matchExprs(f ipfamily.Family, m Match) []expr.Any {
	switch m.Kind {
	case MatchPrefix:
		e, _ := load(f, m.Field, regKey)
		out := []expr.Any{e}
		p := m.Prefix.Masked()
		if !p.IsSingleIP() {
			mask := make([]byte, p.Addr().BitLen()/8)
			for i := 0; i < p.Bits(); i++ {
				mask[i/8] |= 0x80 >> (i % 8)
			}
			out = append(out, &expr.Bitwise{SourceRegister: regKey, DestRegister: regKey, Len: uint32(len(mask)), Mask: mask, Xor: make([]byte, len(mask))})
		}
		op := expr.CmpOpEq
		if m.Neg {
			op = expr.CmpOpNeq
		}
		return append(out, &expr.Cmp{Op: op, Register: regKey, Data: p.Addr().AsSlice()})
	case MatchSet:
		return append(loadKey(f, m.Key), &expr.Lookup{SourceRegister: regKey, SetName: m.Set})
	case MatchLocal:
		fib := &expr.Fib{Register: regKey, ResultADDRTYPE: true, FlagDADDR: m.Field == FieldDaddr, FlagSADDR: m.Field == FieldSaddr}
		return []expr.Any{fib, &expr.Cmp{Op: expr.CmpOpEq, Register: regKey, Data: native32(unix.RTN_LOCAL)}}
	case MatchNew:
		return append([]expr.Any{&expr.Ct{Register: regKey, Key: expr.CtKeySTATE}}, bitsSet(expr.CtStateBitNEW)...)
	case MatchEstablished:
		return append([]expr.Any{&expr.Ct{Register: regKey, Key: expr.CtKeySTATE}}, bitsSet(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)...)
	case MatchDNAT:
		const ipsDstNAT = 0x20 // IPS_DST_NAT
		return append([]expr.Any{&expr.Ct{Register: regKey, Key: expr.CtKeySTATUS}}, bitsSet(ipsDstNAT)...)
	case MatchMark:
		want := m.Mark
		if m.Neg {
			want = 0
		}
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey},
			&expr.Bitwise{SourceRegister: regKey, DestRegister: regKey, Len: 4, Mask: native32(m.Mark), Xor: native32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regKey, Data: native32(want)},
		}
	case MatchFamily:
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: regKey},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regKey, Data: []byte{byte(f.AF())}},
		}
	}
	return nil
}

func setMark(mask, xor uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regKey},
		&expr.Bitwise{SourceRegister: regKey, DestRegister: regKey, Len: 4, Mask: native32(mask), Xor: native32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regKey},
	}
}

// dnat DNATs to the address and port in the value register.
func dnat(f ipfamily.Family) expr.Any {
	_, n := addrOffset(f, FieldDaddr)
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.AF()), RegAddrMin: regValue, RegProtoMin: reg32Val + n/4, Specified: true}
}

// Registers of the affinity statements (32-bit registers): the key
// (id . address) from reg32Key, the endpoint found at reg32Val, a copy
// of the id right before it (id . endpoint, the key of the set of live
// endpoints), and the key the dynamic map is written with from
// reg32Remember (apart from the others, IPv6 keys are 20 bytes).
const (
	reg32IDCopy   = reg32Val - 2
	reg32Remember = unix.NFT_REG32_00 + 10
)

func idBytes(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// idKey loads (id . field) from the 32-bit register reg32.
func idKey(f ipfamily.Family, id uint64, fl Field, reg32 uint32) []expr.Any {
	e, _ := load(f, fl, reg32+2)
	return []expr.Any{&expr.Immediate{Register: reg32, Data: idBytes(id)}, e}
}

// remember writes (id . client address) → the endpoint in the value
// register into the dynamic map set (op add or update: an element there
// keeps its endpoint, its timeout is refreshed; op delete).
func remember(f ipfamily.Family, s Stmt, op uint32) []expr.Any {
	return append(idKey(f, s.ID, FieldSaddr, reg32Remember),
		&expr.Dynset{SrcRegKey: reg32Remember, SrcRegData: regValue, SetName: s.Affinity, Operation: op, Timeout: s.Timeout})
}

func stmtExprs(f ipfamily.Family, s Stmt) []expr.Any {
	switch s.Kind {
	case StmtJump:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: s.Chain}}
	case StmtGoto:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: s.Chain}}
	case StmtAccept:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	case StmtDrop:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
	case StmtReturn:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}
	case StmtReject:
		return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}}
	case StmtVmap:
		return append(loadKey(f, s.Key), &expr.Lookup{SourceRegister: regKey, DestRegister: 0, IsDestRegSet: true, SetName: s.Map})
	case StmtMarkOr:
		return setMark(^s.Mark, s.Mark)
	case StmtMarkXor:
		return setMark(0xffffffff, s.Mark)
	case StmtMasquerade:
		return []expr.Any{&expr.Masq{FullyRandom: s.Random}}
	case StmtDNATRandom:
		out := []expr.Any{
			&expr.Immediate{Register: reg32Key, Data: idBytes(s.ID)},
			&expr.Numgen{Register: reg32Key + 2, Modulus: s.N, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg32Key, DestRegister: regValue, IsDestRegSet: true, SetName: s.Map},
		}
		if s.Affinity != "" {
			out = append(out, remember(f, s, unix.NFT_DYNSET_OP_UPDATE)...)
		}
		return append(out, dnat(f))
	case StmtDNATAffinity:
		out := append(idKey(f, s.ID, FieldSaddr, reg32Key),
			&expr.Lookup{SourceRegister: reg32Key, DestRegister: regValue, IsDestRegSet: true, SetName: s.Affinity},
			&expr.Immediate{Register: reg32IDCopy, Data: idBytes(s.ID)},
			&expr.Lookup{SourceRegister: reg32IDCopy, SetName: s.Map})
		out = append(out, remember(f, s, unix.NFT_DYNSET_OP_UPDATE)...)
		return append(out, dnat(f))
	case StmtForget:
		// The lookup first: a client there only, and the map's value
		// register written (a kernel refuses a rule reading a register
		// no expression before wrote: ENODATA).
		out := append(idKey(f, s.ID, FieldSaddr, reg32Key),
			&expr.Lookup{SourceRegister: reg32Key, DestRegister: regValue, IsDestRegSet: true, SetName: s.Affinity})
		return append(out, remember(f, s, nftDynsetOpDelete)...)
	}
	return nil
}

// ruleExprs translates a rule into netlink expressions.
func ruleExprs(f ipfamily.Family, r Rule) ([]expr.Any, error) {
	var out []expr.Any
	for _, m := range r.Match {
		e := matchExprs(f, m)
		if e == nil {
			return nil, fmt.Errorf("match kind %d has no expressions", m.Kind)
		}
		out = append(out, e...)
	}
	for _, s := range r.Do {
		e := stmtExprs(f, s)
		if e == nil {
			return nil, fmt.Errorf("statement kind %d has no expressions", s.Kind)
		}
		out = append(out, e...)
	}
	return out, nil
}
