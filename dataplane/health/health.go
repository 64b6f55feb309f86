// Package health aggregates the readiness of a daemon's parts into one HTTP
// answer: 200 when every registered component is healthy, 503 naming each
// one that is not.
package health

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Checker holds the state of each component: the last one reported (Set),
// or the answer of its check when asked (Check). Safe for concurrent use.
type Checker struct {
	mu     sync.Mutex
	state  map[string]error
	checks map[string]func() error
}

// NewChecker returns a Checker with no components (healthy).
func NewChecker() *Checker {
	return &Checker{state: make(map[string]error), checks: make(map[string]func() error)}
}

// Set records the component's state: nil error means healthy.
func (c *Checker) Set(component string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.checks, component)
	c.state[component] = err
}

// Check makes check the component's state: it is called whenever the
// state is asked for (States, Err, the HTTP answer), so a state that
// turns bad with the passing of time (no successful sync for two periods)
// is seen when it is, with nothing polling it. check must be cheap and
// must not call back into the Checker.
func (c *Checker) Check(component string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.state, component)
	c.checks[component] = check
}

// States returns every component's state (nil: healthy).
func (c *Checker) States() map[string]error {
	c.mu.Lock()
	out := make(map[string]error, len(c.state)+len(c.checks))
	for name, err := range c.state {
		out[name] = err
	}
	checks := make(map[string]func() error, len(c.checks))
	for name, check := range c.checks {
		checks[name] = check
	}
	c.mu.Unlock()
	// Outside the lock: a check may take locks of its own.
	for name, check := range checks {
		out[name] = check()
	}
	return out
}

// Err returns an error naming every unhealthy component, or nil.
func (c *Checker) Err() error {
	var bad []string
	for name, err := range c.States() {
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("%s", strings.Join(bad, "; "))
}

// ServeHTTP answers 200 "ok" or 503 with the reasons, one per line.
func (c *Checker) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := c.Err(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.ReplaceAll(err.Error(), "; ", "\n"))
		return
	}
	fmt.Fprintln(w, "ok")
}
