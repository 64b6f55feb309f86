package proxy

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

type testSettings struct{ dir string }

func (s *testSettings) AddFlags(fs *pflag.FlagSet) { fs.StringVar(&s.dir, "test-mode-dir", s.dir, "") }

// TestRegistry: modes register themselves and come back the default first,
// then by name, none last; a name registered twice is refused; each mode's
// own Settings get their flags and reach the mode by its name.
func TestRegistry(t *testing.T) {
	Register(Mode{Name: "zz-test"})
	Register(Mode{Name: DefaultMode})
	Register(Mode{Name: "aa-test", NewSettings: func() Settings { return &testSettings{dir: "/default"} }})
	ms := Registered()
	if got := ms.Names(); !slices.Equal(got, []string{DefaultMode, "aa-test", "zz-test", "none"}) {
		t.Errorf("Registered = %v", got)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a second mode named zz-test was registered")
			}
		}()
		Register(Mode{Name: "zz-test"})
	}()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	settings := ms.AddFlags(fs)
	if err := fs.Parse([]string{"--test-mode-dir=/x"}); err != nil {
		t.Fatal(err)
	}
	if s, ok := settings["aa-test"].(*testSettings); !ok || s.dir != "/x" || len(settings) != 1 {
		t.Errorf("settings = %v", settings)
	}
}
