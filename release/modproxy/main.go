// Command modproxy writes a Go module proxy, as files (GOPROXY=file://DIR),
// that serves this repository's modules at one version from their
// directories: what the module proxy would serve once release.sh has tagged
// them. CI builds the examples against it with GOWORK=off, so they resolve
// the modules as an outside project does, without replace directives.
//
//	modproxy -version v0.1.0 -out DIR MODULE_DIR...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "", "the version to serve every module at")
	out := flag.String("out", "", "the proxy's directory")
	flag.Parse()
	if err := run(*version, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(version, out string, dirs []string) error {
	if !semver.IsValid(version) || semver.Major(version) > "v1" {
		return fmt.Errorf("version %q: want a v0 or v1 semantic version", version)
	}
	if out == "" || len(dirs) == 0 {
		return fmt.Errorf("usage: modproxy -version V -out DIR MODULE_DIR...")
	}
	for _, dir := range dirs {
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return err
		}
		path := modfile.ModulePath(gomod)
		if path == "" {
			return fmt.Errorf("%s/go.mod names no module", dir)
		}
		escaped, err := module.EscapePath(path)
		if err != nil {
			return err
		}
		at := filepath.Join(out, escaped, "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(at, version+".zip"))
		if err != nil {
			return err
		}
		err = zip.CreateFromDir(f, module.Version{Path: path, Version: version}, dir)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Unix(0, 0).UTC()})
		for name, data := range map[string][]byte{version + ".mod": gomod, version + ".info": info, "list": []byte(version + "\n")} {
			if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
