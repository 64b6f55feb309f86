// Command podnet-lab brings the lab cluster up and down (make demo).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "podnet-lab: the lab is being built (issue 2)")
	os.Exit(1)
}
