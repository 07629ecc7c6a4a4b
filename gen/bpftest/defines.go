package bpftest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Define returns the value of a #define in bpf/include, for tests that check
// a Go constant against the C one it mirrors (the C headers are the single
// source of truth). Values may be numbers (with u/ULL suffixes), other
// defines, and expressions of them with parentheses, <<, * and /.
func Define(tb testing.TB, name string) uint64 {
	tb.Helper()
	defs, err := headerDefines()
	if err != nil {
		tb.Fatal(err)
	}
	v, err := evalDefine(defs, name, 0)
	if err != nil {
		tb.Fatalf("#define %s: %v", name, err)
	}
	return v
}

var (
	definesOnce sync.Once
	defines     map[string]string
	definesErr  error
)

var defineLine = regexp.MustCompile(`^#define\s+([A-Z_][A-Z0-9_]*)\s+(.+?)\s*(/\*.*)?$`)

// headerDefines reads every object-like #define of bpf/include.
func headerDefines() (map[string]string, error) {
	definesOnce.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		dir := filepath.Join(filepath.Dir(self), "..", "..", "bpf", "include")
		files, err := filepath.Glob(filepath.Join(dir, "*.h"))
		if err != nil || len(files) == 0 {
			definesErr = fmt.Errorf("no headers in %s: %v", dir, err)
			return
		}
		defines = map[string]string{}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				definesErr = err
				return
			}
			for _, line := range strings.Split(string(data), "\n") {
				if m := defineLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
					defines[m[1]] = m[2]
				}
			}
		}
	})
	return defines, definesErr
}

func evalDefine(defs map[string]string, name string, depth int) (uint64, error) {
	expr, ok := defs[name]
	if !ok {
		return 0, fmt.Errorf("not defined in bpf/include")
	}
	if depth > 8 {
		return 0, fmt.Errorf("defined in terms of itself")
	}
	p := &exprParser{s: strings.ReplaceAll(expr, " ", ""), defs: defs, depth: depth}
	v, err := p.product()
	if err == nil && p.pos != len(p.s) {
		err = fmt.Errorf("cannot read %q", expr)
	}
	return v, err
}

// exprParser reads the small expressions the headers' defines use.
type exprParser struct {
	s     string
	pos   int
	defs  map[string]string
	depth int
}

// product: shifts and products, left to right (enough for the headers).
func (p *exprParser) product() (uint64, error) {
	v, err := p.atom()
	for err == nil && p.pos < len(p.s) {
		var rhs uint64
		switch {
		case strings.HasPrefix(p.s[p.pos:], "<<"):
			p.pos += 2
			if rhs, err = p.atom(); err == nil {
				v <<= rhs
			}
		case p.s[p.pos] == '*':
			p.pos++
			if rhs, err = p.atom(); err == nil {
				v *= rhs
			}
		case p.s[p.pos] == '/':
			p.pos++
			if rhs, err = p.atom(); err == nil && rhs != 0 {
				v /= rhs
			}
		default:
			return v, nil
		}
	}
	return v, err
}

var numberOrName = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*|^[A-Za-z_][A-Za-z0-9_]*`)

func (p *exprParser) atom() (uint64, error) {
	if p.pos < len(p.s) && p.s[p.pos] == '(' {
		p.pos++
		v, err := p.product()
		if err != nil {
			return 0, err
		}
		if p.pos >= len(p.s) || p.s[p.pos] != ')' {
			return 0, fmt.Errorf("unbalanced parentheses in %q", p.s)
		}
		p.pos++
		return v, nil
	}
	m := numberOrName.FindStringSubmatch(p.s[p.pos:])
	if m == nil {
		return 0, fmt.Errorf("cannot read %q", p.s[p.pos:])
	}
	p.pos += len(m[0])
	if m[1] != "" {
		return strconv.ParseUint(m[1], 0, 64)
	}
	return evalDefine(p.defs, m[0], p.depth+1)
}
