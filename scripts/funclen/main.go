// Command funclen lists the functions longer than -max lines in the Go
// files under the given directories, skipping tests and generated files. A
// function that must stay one piece says why in its doc comment, next to a
// //funclen:ignore line, and is not listed. make lint runs it beside
// gocyclo.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

func main() {
	maxLines := flag.Int("max", 80, "longest function allowed, in lines")
	ignore := flag.String("ignore", "", "regexp of paths to skip")
	flag.Parse()
	var skip *regexp.Regexp
	if *ignore != "" {
		skip = regexp.MustCompile(*ignore)
	}
	found := 0
	for _, root := range flag.Args() {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if skip != nil && skip.MatchString(path) {
				return nil
			}
			n, err := check(path, *maxLines)
			found += n
			return err
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "funclen:", err)
			os.Exit(2)
		}
	}
	if found > 0 {
		os.Exit(1)
	}
}

// check prints the long functions of one file and returns how many.
func check(path string, maxLines int) (int, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return 0, err
	}
	if ast.IsGenerated(f) {
		return 0, nil
	}
	n := 0
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil || exempt(fn) {
			continue
		}
		start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
		if lines := end.Line - start.Line + 1; lines > maxLines {
			fmt.Printf("%d %s %s:%d\n", lines, fn.Name.Name, path, start.Line)
			n++
		}
	}
	return n, nil
}

func exempt(fn *ast.FuncDecl) bool {
	if fn.Doc == nil {
		return false
	}
	for _, c := range fn.Doc.List {
		if strings.HasPrefix(c.Text, "//funclen:ignore") {
			return true
		}
	}
	return false
}
