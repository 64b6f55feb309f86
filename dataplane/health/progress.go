package health

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Progress is the Service proxy's health as kube-proxy defines it: the
// proxy is unhealthy only when a change has been waiting to be programmed
// for longer than the timeout. A proxy with nothing to do is healthy, so
// an API server that is merely away (no changes arrive, the last state is
// served) never fails the liveness probe nor a load balancer's check.
// Safe for concurrent use; the zero value is not usable, see NewProgress.
type Progress struct {
	timeout time.Duration
	now     func() time.Time

	mu sync.Mutex
	// oldestQueued is when the oldest change not yet programmed arrived;
	// zero when none waits. lastQueued is the newest one.
	oldestQueued, lastQueued time.Time
	lastUpdated              time.Time
	// leaving: the node is being deleted or drained; /healthz fails so
	// load balancers move away, /livez does not.
	leaving bool

	healthz, livez *prometheus.CounterVec
	// notes says what else is wrong without failing the probe (the
	// cluster state half read, the node network not synced); nil: nothing.
	notes *Checker
}

// NewProgress returns a healthy Progress whose changes may wait up to
// timeout (kube-proxy: twice the sync period), with the probe counters
// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total registered
// with reg (if not nil).
func NewProgress(timeout time.Duration, reg prometheus.Registerer) *Progress {
	p := &Progress{
		timeout: timeout,
		now:     time.Now,
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_healthz_total", Help: "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_livez_total", Help: "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
	}
	p.lastUpdated = p.now()
	if reg != nil {
		reg.MustRegister(p.healthz, p.livez)
	}
	return p
}

// Queued records that a change is waiting to be programmed.
func (p *Progress) Queued() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if p.oldestQueued.IsZero() {
		p.oldestQueued = now
	}
	p.lastQueued = now
}

// Updated records a successful sync that took every change queued up to
// taken. A change queued after taken still waits, measured from the
// newest one (the older ones of that kind are not kept).
func (p *Progress) Updated(taken time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastUpdated = p.now()
	if p.lastQueued.After(taken) {
		p.oldestQueued = p.lastQueued
		return
	}
	p.oldestQueued = time.Time{}
}

// Note makes /healthz and /livez name c's unhealthy components in a
// "notes" field beside kube-proxy's, without changing their verdict: an
// operator reading the probe learns why the node serves its last state.
func (p *Progress) Note(c *Checker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notes = c
}

// SetNodeLeaving records whether this node is being deleted or drained.
func (p *Progress) SetNodeLeaving(leaving bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaving = leaving
}

// State is what /healthz answers.
type State struct {
	Healthy bool
	// LastUpdated is the last successful sync; Pending the wait of the
	// oldest change not yet programmed (0: none).
	LastUpdated time.Time
	Pending     time.Duration
	Now         time.Time
	// NodeEligible is false while the node is being deleted or drained.
	NodeEligible bool
	// Notes names the noted Checker's unhealthy components (nil: none).
	Notes map[string]string
}

// State returns the current health.
func (p *Progress) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := State{Healthy: true, LastUpdated: p.lastUpdated, Now: p.now(), NodeEligible: !p.leaving}
	if p.notes != nil {
		for name, err := range p.notes.States() {
			if err == nil {
				continue
			}
			if s.Notes == nil {
				s.Notes = make(map[string]string)
			}
			s.Notes[name] = err.Error()
		}
	}
	if !p.oldestQueued.IsZero() {
		s.Pending = s.Now.Sub(p.oldestQueued)
		s.Healthy = s.Pending <= p.timeout
	}
	return s
}

// Healthz serves /healthz as kube-proxy does: 200 or 503 with
// {"lastUpdated": …, "currentTime": …, "nodeEligible": true}; a healthy
// answer reports lastUpdated as now, as kube-proxy does for older clients.
func (p *Progress) Healthz() http.Handler { return p.handler(p.healthz, true) }

// Livez serves /livez: the same verdict, without the node's eligibility
// for load balancer traffic.
func (p *Progress) Livez() http.Handler { return p.handler(p.livez, false) }

func (p *Progress) handler(count *prometheus.CounterVec, eligibility bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s := p.State()
		code := http.StatusOK
		if !s.Healthy || eligibility && !s.NodeEligible {
			code = http.StatusServiceUnavailable
		} else {
			s.LastUpdated = s.Now
		}
		count.WithLabelValues(strconv.Itoa(code)).Inc()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(struct {
			LastUpdated  string            `json:"lastUpdated"`
			CurrentTime  string            `json:"currentTime"`
			NodeEligible bool              `json:"nodeEligible"`
			Notes        map[string]string `json:"notes,omitempty"`
		}{s.LastUpdated.Round(0).String(), s.Now.Round(0).String(), s.NodeEligible, s.Notes})
	})
}
