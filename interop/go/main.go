// Command brmcp-goref runs the Go reference implementation of brmcp
// (github.com/karamble/brmcp) for the Python project's interop tests.
//
//	brmcp-goref vectors FILE...   check wire vectors against the reference codec
//	brmcp-goref wire              JSON-lines codec server (parse, encode, assembler)
//	brmcp-goref harness [flags]   reference serving harness, PMs as JSON lines
//	brmcp-goref bridge [flags]    reference client bridge, PMs as JSON lines
//	brmcp-goref directory [flags] reference directory service, PMs as JSON lines
//	brmcp-goref provider [flags]  reference harness with a priced test tool and a
//	                              directory Registrant, PMs as JSON lines
//	brmcp-goref snapshot sign|verify [flags]  sign or verify directory snapshots
//
// It is built by the Python test helper (brmcp.testing.goref) in a cache
// directory against a clone of the reference's git bundle.
package main

import (
	"fmt"
	"os"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: brmcp-goref vectors FILE... | wire | harness [flags] | bridge [flags] |"+
		" directory [flags] | provider [flags] | snapshot sign|verify [flags]")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	args := os.Args[2:]
	var code int
	switch os.Args[1] {
	case "vectors":
		code = runVectors(args)
	case "wire":
		code = runWire()
	case "harness":
		code = runHarness(args)
	case "bridge":
		code = runBridge(args)
	case "directory":
		code = runDirectory(args)
	case "provider":
		code = runProvider(args)
	case "snapshot":
		code = runSnapshot(args)
	default:
		usage()
	}
	os.Exit(code)
}
