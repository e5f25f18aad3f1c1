package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/karamble/brmcp"
	"github.com/karamble/brmcp/wire"
)

// vectorFile is the shape of tests/vectors/wire-v1.json.
type vectorFile struct {
	Parse []struct {
		Name   string      `json:"name"`
		Text   string      `json:"text"`
		Expect *partResult `json:"expect"`
	} `json:"parse"`
	Encode []struct {
		Name       string   `json:"name"`
		PayloadB64 string   `json:"payload_b64"`
		SID        string   `json:"sid"`
		MID        string   `json:"mid"`
		Exp        int64    `json:"exp"`
		ChunkSize  int      `json:"chunk_size"`
		Parts      []string `json:"parts"`
	} `json:"encode"`
}

// partResult is a parsed part as JSON: the chunk in standard base64.
type partResult struct {
	SID      string `json:"sid"`
	MID      string `json:"mid"`
	Seq      int    `json:"seq"`
	Total    int    `json:"total"`
	Exp      int64  `json:"exp"`
	ChunkB64 string `json:"chunk_b64"`
}

func toResult(p *wire.Part) *partResult {
	return &partResult{p.SID, p.MID, p.Seq, p.Total, p.Exp, base64.StdEncoding.EncodeToString(p.Chunk)}
}

var midRE = regexp.MustCompile(`,mid=[0-9a-f]{1,32},`)

// expTime maps unix seconds to the reference's Encode argument: 0 is the
// zero time (no deadline).
func expTime(exp int64) time.Time {
	if exp == 0 {
		return time.Time{}
	}
	return time.Unix(exp, 0)
}

// encodeWithMID runs wire.Encode and replaces its random mid with mid.
func encodeWithMID(sid string, payload []byte, exp int64, chunk int, mid string) ([]string, error) {
	parts, err := wire.Encode(sid, payload, expTime(exp), chunk)
	if err != nil {
		return nil, err
	}
	if mid != "" {
		for i, p := range parts {
			parts[i] = midRE.ReplaceAllLiteralString(p, ",mid="+mid+",")
		}
	}
	return parts, nil
}

func runVectors(files []string) int {
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "vectors: no files")
		return 2
	}
	passed, failed := 0, 0
	fail := func(format string, a ...any) {
		failed++
		fmt.Printf(format+"\n", a...)
	}
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			fail("%s: %v", name, err)
			continue
		}
		var vf vectorFile
		if err := json.Unmarshal(raw, &vf); err != nil {
			fail("%s: %v", name, err)
			continue
		}
		for _, v := range vf.Parse {
			p, ok := wire.Parse(v.Text)
			env := brmcp.IsEnvelope(v.Text)
			switch {
			case env != ok:
				fail("parse %s: IsEnvelope=%v but Parse ok=%v", v.Name, env, ok)
			case v.Expect == nil && ok:
				fail("parse %s: expected no envelope, reference parsed %+v", v.Name, *toResult(p))
			case v.Expect != nil && !ok:
				fail("parse %s: expected %+v, reference rejected", v.Name, *v.Expect)
			case v.Expect != nil && *toResult(p) != *v.Expect:
				fail("parse %s: expected %+v, reference gave %+v", v.Name, *v.Expect, *toResult(p))
			default:
				passed++
			}
		}
		for _, v := range vf.Encode {
			payload, err := base64.StdEncoding.DecodeString(v.PayloadB64)
			if err != nil {
				fail("encode %s: payload_b64: %v", v.Name, err)
				continue
			}
			parts, err := encodeWithMID(v.SID, payload, v.Exp, v.ChunkSize, v.MID)
			if err != nil {
				fail("encode %s: reference error %v", v.Name, err)
				continue
			}
			a, _ := json.Marshal(parts)
			b, _ := json.Marshal(v.Parts)
			if !bytes.Equal(a, b) {
				fail("encode %s: %d parts from the reference differ from the %d expected", v.Name, len(parts), len(v.Parts))
				continue
			}
			passed++
		}
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}
