package statedir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// ParseError is a file that could not be read as Kubernetes objects, with
// the 1-based line where the problem is (the start of the offending
// document when the decoder does not say more).
type ParseError struct {
	Path string
	Line int
	Err  error
}

func (e *ParseError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Path, e.Line, e.Err) }
func (e *ParseError) Unwrap() error { return e.Err }

// Ignored names an object of a kind the dataplane does not use.
type Ignored struct {
	APIVersion, Kind, Name string
	Line                   int
}

// Refused is an object of a file that the API server would have refused: a
// field of the wrong type, a value out of range. The rest of the file is
// used without it.
type Refused struct {
	Kind cluster.Kind
	Key  cluster.Key
	// Err names the file, the object's line, the object and the field.
	Err *ParseError
}

// Parsed is what one state file holds.
type Parsed struct {
	Objects []cluster.Object
	Ignored []Ignored
	Refused []Refused
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// ParseFile decodes the contents of one state file, checking Services
// against limits as the API server would. JSON files (by name) may hold a
// stream of objects; everything else is YAML with "---" separated
// documents. Either may hold a List. The error is for a file that cannot be
// read as a whole (syntax, an object without kind or name); an object that
// is merely invalid is Refused and the rest kept.
func ParseFile(path string, data []byte, limits convert.Limits) (Parsed, error) {
	p := parser{limits: limits}
	if strings.HasSuffix(path, ".json") {
		p.parseJSON(data)
	} else {
		p.parseYAML(data)
	}
	if p.err != nil {
		p.err.Path = path
		return Parsed{}, p.err
	}
	for _, r := range p.out.Refused {
		r.Err.Path = path
	}
	return p.out, nil
}

type parser struct {
	limits convert.Limits
	out    Parsed
	err    *ParseError
}

func (p *parser) fail(line int, err error) {
	if p.err == nil {
		p.err = &ParseError{Line: line, Err: err}
	}
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

func (p *parser) parseYAML(data []byte) {
	for _, doc := range splitYAML(data) {
		if p.err != nil {
			return
		}
		j, err := yaml.YAMLToJSON(doc.text)
		if err != nil {
			line := doc.line
			if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
				n, _ := strconv.Atoi(m[1])
				line = doc.line + n - 1
			}
			p.fail(line, errors.New(strings.TrimPrefix(yamlLine.ReplaceAllString(err.Error(), "line "+strconv.Itoa(line)), "error converting YAML to JSON: ")))
			continue
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue // empty document
		}
		p.objectAt(j, doc.line, func() []int { return listItemLines(doc.text, doc.line) })
	}
}

// listItemLines returns the file line of each entry of a List document's
// items, so an error in one item names its own line. Nil if the document
// is not shaped like a List.
func listItemLines(doc []byte, first int) []int {
	var n yamlv3.Node
	if err := yamlv3.Unmarshal(doc, &n); err != nil || len(n.Content) == 0 {
		return nil
	}
	m := n.Content[0]
	if m.Kind != yamlv3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "items" && m.Content[i+1].Kind == yamlv3.SequenceNode {
			var lines []int
			for _, item := range m.Content[i+1].Content {
				lines = append(lines, first+item.Line-1)
			}
			return lines
		}
	}
	return nil
}

func (p *parser) parseJSON(data []byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		start := dec.InputOffset()
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if err == io.EOF {
			return
		}
		if err != nil {
			off := dec.InputOffset()
			var se *json.SyntaxError
			if errors.As(err, &se) {
				off = se.Offset
			}
			p.fail(lineAt(data, int(off)), err)
			return
		}
		// The decoder's start offset may sit before whitespace.
		s := int(start)
		for s < len(data) && isSpace(data[s]) {
			s++
		}
		p.object(raw, lineAt(data, s))
		if p.err != nil {
			return
		}
	}
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// lineAt is the 1-based line of byte offset off.
func lineAt(data []byte, off int) int {
	if off > len(data) {
		off = len(data)
	}
	return bytes.Count(data[:off], []byte("\n")) + 1
}

// object decodes one JSON object (from any document) into the Store's form.
func (p *parser) object(j []byte, line int) { p.objectAt(j, line, nil) }

// objectAt is object with, for a List, a way to find each item's line
// (asked only when an item fails).
func (p *parser) objectAt(j []byte, line int, itemLines func() []int) {
	var tm typeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		p.fail(line, fmt.Errorf("not a Kubernetes object: %w", err))
		return
	}
	if tm.Kind == "" {
		p.fail(line, errors.New("object has no kind"))
		return
	}
	// kubectl prints "kind: List"; the API's own lists (ServiceList,
	// EndpointSliceList, ...) read the same way.
	if strings.HasSuffix(tm.Kind, "List") {
		var lines []int
		itemLine := func(i int) int {
			if lines == nil && itemLines != nil {
				lines = itemLines()
			}
			if i < len(lines) {
				return lines[i]
			}
			return line
		}
		for i, item := range tm.Items {
			refused := len(p.out.Refused)
			p.object(item, line)
			if p.err != nil {
				if p.err.Line == line {
					p.err.Line = itemLine(i)
				}
				return
			}
			if len(p.out.Refused) > refused {
				p.out.Refused[refused].Err.Line = itemLine(i)
			}
		}
		return
	}
	d, ok := decoders[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		p.out.Ignored = append(p.out.Ignored, Ignored{APIVersion: tm.APIVersion, Kind: tm.Kind, Name: tm.Metadata.Name, Line: line})
		return
	}
	if tm.Metadata.Name == "" {
		p.fail(line, fmt.Errorf("%s has no metadata.name", tm.Kind))
		return
	}
	obj, err := d.decode(j, p.limits)
	if err != nil {
		key := cluster.Key{Name: tm.Metadata.Name}
		if d.namespaced {
			key.Namespace = tm.Metadata.Namespace
			if key.Namespace == "" {
				key.Namespace = "default"
			}
		}
		p.out.Refused = append(p.out.Refused, Refused{Kind: d.kind, Key: key,
			Err: &ParseError{Line: line, Err: fmt.Errorf("%s %s refused: %w", tm.Kind, key, err)}})
		return
	}
	p.out.Objects = append(p.out.Objects, obj)
}

type decoder struct {
	kind       cluster.Kind
	namespaced bool
	decode     func(j []byte, l convert.Limits) (cluster.Object, error)
}

// decoders are the kinds the dataplane uses, by apiVersion/kind.
var decoders = map[string]decoder{
	"v1/Node":                            {cluster.KindNode, false, decodeAs(convert.FromV1Node, nil)},
	"v1/Namespace":                       {cluster.KindNamespace, false, decodeAs(convert.FromV1Namespace, nil)},
	"v1/Pod":                             {cluster.KindPod, true, decodeAs(convert.FromV1Pod, nil)},
	"networking.k8s.io/v1/NetworkPolicy": {cluster.KindNetworkPolicy, true, decodeAs(convert.FromV1NetworkPolicy, nil)},
	"v1/Service": {cluster.KindService, true, decodeAs(convert.FromV1Service, func(s *v1.Service, l convert.Limits) error {
		return convert.ValidateV1Service(s, l)
	})},
	"discovery.k8s.io/v1/EndpointSlice": {cluster.KindEndpointSlice, true, decodeAs(convert.FromV1EndpointSlice, func(e *discoveryv1.EndpointSlice, _ convert.Limits) error {
		return convert.ValidateV1EndpointSlice(e)
	})},
}

// decodeAs unmarshals into T, checks it (when validate is set) and reduces
// it.
func decodeAs[T any, O cluster.Object](reduce func(*T) (O, error), validate func(*T, convert.Limits) error) func([]byte, convert.Limits) (cluster.Object, error) {
	return func(j []byte, l convert.Limits) (cluster.Object, error) {
		var v T
		if err := json.Unmarshal(j, &v); err != nil {
			return nil, err
		}
		if validate != nil {
			if err := validate(&v, l); err != nil {
				return nil, err
			}
		}
		return reduce(&v)
	}
}

type yamlDoc struct {
	text []byte
	line int // 1-based line of the document's first line in the file
}

// splitYAML cuts a YAML stream at "---" lines, remembering where each
// document starts so errors can name the file's line.
func splitYAML(data []byte) []yamlDoc {
	var docs []yamlDoc
	start, startLine, line := 0, 1, 1
	for off := 0; off < len(data); {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		}
		l := bytes.TrimRight(data[off:next], "\r\n")
		if bytes.Equal(l, []byte("---")) || bytes.HasPrefix(l, []byte("--- ")) || bytes.HasPrefix(l, []byte("---\t")) {
			docs = append(docs, yamlDoc{text: data[start:off], line: startLine})
			start, startLine = next, line+1
		}
		off = next
		line++
	}
	docs = append(docs, yamlDoc{text: data[start:], line: startLine})
	return docs
}
