package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/karamble/brmcp/directory"
)

// keyFile is the directory's snapshotkey.json: hex ed25519 public key and
// hex 64-byte private key (seed followed by the public key).
type keyFile struct {
	Pub  string `json:"pub"`
	Priv string `json:"priv"`
}

// loadKey reads a key file, creating one (0600) when it does not exist,
// as a directory does on its first start.
func loadKey(path string) (ed25519.PrivateKey, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		pub, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, gerr
		}
		out, merr := json.MarshalIndent(keyFile{Pub: hex.EncodeToString(pub), Priv: hex.EncodeToString(priv)}, "", "  ")
		if merr != nil {
			return nil, merr
		}
		return priv, os.WriteFile(path, out, 0o600)
	}
	if err != nil {
		return nil, err
	}
	var kf keyFile
	if err := json.Unmarshal(raw, &kf); err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	priv, err := hex.DecodeString(kf.Priv)
	if err != nil || len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("key file %s: priv is not %d hex bytes", path, ed25519.PrivateKeySize)
	}
	key := ed25519.PrivateKey(priv)
	if hex.EncodeToString(key.Public().(ed25519.PublicKey)) != kf.Pub {
		return nil, fmt.Errorf("key file %s: pub does not match priv", path)
	}
	return key, nil
}

func readInput(path string) ([]byte, error) {
	if path == "" || path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

func printJSON(v any) int {
	out, err := json.Marshal(v)
	if err != nil {
		logf("snapshot: %v", err)
		return 1
	}
	fmt.Println(string(out))
	return 0
}

// runSnapshot signs or verifies snapshots with the reference's types:
//
//	snapshot sign -key FILE [-generated-at N] [-raw] [-in FILE]
//	    input: a JSON array of listings (directory.SnapshotListing), or with
//	    -raw the payload bytes verbatim; output: the signed snapshot as the
//	    reference encodes it, {"payload":BASE64,"sig":HEX,"pub":HEX}
//	snapshot verify -pub HEX [-in FILE]
//	    input: a signed snapshot; output {"ok":true,"snapshot":{...}} or
//	    {"ok":false,"error":E} (directory.VerifySnapshot's error text)
func runSnapshot(args []string) int {
	if len(args) < 1 {
		usage()
	}
	switch args[0] {
	case "sign":
		fs := flag.NewFlagSet("snapshot sign", flag.ExitOnError)
		keyPath := fs.String("key", "", "snapshotkey.json (created when absent)")
		generatedAt := fs.Int64("generated-at", 0, "generatedAt, unix seconds (0 = now)")
		raw := fs.Bool("raw", false, "sign the input bytes verbatim as the payload")
		in := fs.String("in", "", "input file (empty or - = stdin)")
		_ = fs.Parse(args[1:])
		if *keyPath == "" {
			logf("snapshot sign: -key is required")
			return 2
		}
		key, err := loadKey(*keyPath)
		if err != nil {
			logf("snapshot sign: %v", err)
			return 1
		}
		data, err := readInput(*in)
		if err != nil {
			logf("snapshot sign: %v", err)
			return 1
		}
		payload := data
		if !*raw {
			snap := directory.Snapshot{Version: directory.SnapshotVersion, GeneratedAt: *generatedAt}
			if snap.GeneratedAt == 0 {
				snap.GeneratedAt = time.Now().Unix()
			}
			if err := json.Unmarshal(data, &snap.Listings); err != nil {
				logf("snapshot sign: listings: %v", err)
				return 1
			}
			if len(snap.Listings) == 0 {
				// An index without listings signs as null, as the
				// directory's buildSnapshot writes it.
				snap.Listings = nil
			}
			if payload, err = json.Marshal(snap); err != nil {
				logf("snapshot sign: %v", err)
				return 1
			}
		}
		return printJSON(directory.SignedSnapshot{
			Payload: payload,
			Sig:     hex.EncodeToString(ed25519.Sign(key, payload)),
			Pub:     hex.EncodeToString(key.Public().(ed25519.PublicKey)),
		})
	case "verify":
		fs := flag.NewFlagSet("snapshot verify", flag.ExitOnError)
		pub := fs.String("pub", "", "the trusted signer key, hex")
		in := fs.String("in", "", "input file (empty or - = stdin)")
		_ = fs.Parse(args[1:])
		data, err := readInput(*in)
		if err != nil {
			logf("snapshot verify: %v", err)
			return 1
		}
		var ss directory.SignedSnapshot
		if err := json.Unmarshal(data, &ss); err != nil {
			return printJSON(map[string]any{"ok": false, "error": "decode: " + err.Error()})
		}
		snap, err := directory.VerifySnapshot(ss, *pub)
		if err != nil {
			return printJSON(map[string]any{"ok": false, "error": err.Error()})
		}
		return printJSON(map[string]any{"ok": true, "snapshot": snap})
	default:
		usage()
	}
	return 2
}
