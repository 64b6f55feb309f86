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

// Checker holds the last reported state of each component. Safe for
// concurrent use.
type Checker struct {
	mu    sync.Mutex
	state map[string]error
}

// NewChecker returns a Checker with no components (healthy).
func NewChecker() *Checker { return &Checker{state: make(map[string]error)} }

// Set records the component's state: nil error means healthy.
func (c *Checker) Set(component string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state[component] = err
}

// States returns every component's state (nil: healthy).
func (c *Checker) States() map[string]error {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]error, len(c.state))
	for name, err := range c.state {
		out[name] = err
	}
	return out
}

// Err returns an error naming every unhealthy component, or nil.
func (c *Checker) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var bad []string
	for name, err := range c.state {
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
