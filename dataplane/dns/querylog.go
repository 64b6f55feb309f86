package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/time/rate"
)

// Query and error logging, as CoreDNS's `log` and `errors` plugins: off
// unless configured; queries logged by the class of their answer; both
// rate-limited, the lines left out counted on the next line written. The
// query path pays one pointer load when logging is off.

// LogClass is a set of answer classes, as CoreDNS's log plugin names them.
type LogClass uint8

const (
	// LogSuccess: NOERROR with records in the answer.
	LogSuccess LogClass = 1 << iota
	// LogDenial: NXDOMAIN, or NOERROR without answer records (NODATA).
	LogDenial
	// LogError: every other rcode (SERVFAIL, REFUSED, FORMERR, …).
	LogError
	// LogAll is every class.
	LogAll = LogSuccess | LogDenial | LogError
)

// ParseLogClasses reads a comma-separated list of success, denial, error
// and all; "" and "none" are no class (query logging off).
func ParseLogClasses(s string) (LogClass, error) {
	var c LogClass
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(strings.ToLower(f)) {
		case "", "none":
		case "success":
			c |= LogSuccess
		case "denial":
			c |= LogDenial
		case "error":
			c |= LogError
		case "all":
			c |= LogAll
		default:
			return 0, fmt.Errorf("log classes %q: %q is not success, denial, error, all or none", s, f)
		}
	}
	return c, nil
}

// LogOptions configure query and error logging.
type LogOptions struct {
	// Queries are the classes of answers whose queries are logged (0: none).
	Queries LogClass
	// Errors logs why a query was answered SERVFAIL (the upstreams'
	// errors), as CoreDNS's errors plugin.
	Errors bool
	// Rate caps the lines per second (queries and errors each); 0: 100.
	Rate float64
	// Logger receives the lines; nil discards them.
	Logger *slog.Logger
}

// DefaultLogRate is the lines per second logged unless configured.
const DefaultLogRate = 100

type logger struct {
	o                  LogOptions
	qlim, elim         *rate.Limiter
	qdropped, edropped atomic.Uint64
	now                func() time.Time // the limiters' clock
}

// SetLog replaces the query and error logging; queries that arrive from
// now on use it.
func (s *Server) SetLog(o LogOptions) {
	if (o.Queries == 0 && !o.Errors) || o.Logger == nil {
		s.qlog.Store(nil)
		return
	}
	if o.Rate <= 0 {
		o.Rate = DefaultLogRate
	}
	burst := max(int(o.Rate), 1)
	s.qlog.Store(&logger{o: o, qlim: rate.NewLimiter(rate.Limit(o.Rate), burst), elim: rate.NewLimiter(rate.Limit(o.Rate), burst), now: time.Now})
}

// answerClass classifies a response by its header.
func answerClass(resp []byte) LogClass {
	if len(resp) < headerLen {
		return LogError
	}
	switch resp[3] & 0x0f {
	case 0:
		if binary.BigEndian.Uint16(resp[6:8]) == 0 {
			return LogDenial
		}
		return LogSuccess
	case rcodeNXDomain:
		return LogDenial
	}
	return LogError
}

// logQuery writes one line for a query answered with resp, in the fields
// of CoreDNS's common log format: client, id, type, class, name, proto,
// request size, DO bit, UDP size; rcode, flags, response size, duration.
func (l *logger) logQuery(q *queryInfo, r *request, resp []byte) {
	if l.o.Queries&answerClass(resp) == 0 {
		return
	}
	if !l.qlim.AllowN(l.now(), 1) {
		l.qdropped.Add(1)
		return
	}
	proto := "udp"
	if q.tcp {
		proto = "tcp"
	}
	attrs := []slog.Attr{
		slog.String("client", q.from.String()),
		slog.Int("id", int(binary.BigEndian.Uint16(resp[0:2]))),
		slog.String("type", typeName(r.qtype)),
		slog.String("class", mdns.ClassToString[r.qclass]),
		slog.String("name", presentName(r.lower)),
		slog.String("proto", proto),
		slog.Int("size", q.size),
		slog.Bool("do", q.do),
		slog.Int("bufsize", r.udpLimit()),
		slog.String("rcode", mdns.RcodeToString[int(resp[3]&0x0f)]),
		slog.String("flags", headerFlags(resp)),
		slog.Int("rsize", len(resp)),
		slog.Duration("duration", time.Since(q.start)),
	}
	if n := l.qdropped.Swap(0); n > 0 {
		attrs = append(attrs, slog.Uint64("suppressed", n))
	}
	l.o.Logger.LogAttrs(context.Background(), slog.LevelInfo, "query", attrs...)
}

// logError writes why a query got SERVFAIL.
func (l *logger) logError(r *request, err error) {
	if !l.o.Errors {
		return
	}
	if !l.elim.AllowN(l.now(), 1) {
		l.edropped.Add(1)
		return
	}
	attrs := []slog.Attr{
		slog.String("name", presentName(r.lower)),
		slog.String("type", typeName(r.qtype)),
		slog.String("err", err.Error()),
	}
	if n := l.edropped.Swap(0); n > 0 {
		attrs = append(attrs, slog.Uint64("suppressed", n))
	}
	l.o.Logger.LogAttrs(context.Background(), slog.LevelError, "query failed", attrs...)
}

func typeName(t uint16) string {
	if s, ok := mdns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

// headerFlags lists a response's header flags as dig and CoreDNS do.
func headerFlags(resp []byte) string {
	var b strings.Builder
	for _, f := range []struct {
		byteAt int
		mask   byte
		name   string
	}{{2, 0x80, "qr"}, {2, 0x04, "aa"}, {2, 0x02, "tc"}, {2, 0x01, "rd"}, {3, 0x80, "ra"}} {
		if resp[f.byteAt]&f.mask != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(f.name)
		}
	}
	return b.String()
}
