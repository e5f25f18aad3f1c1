package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/karamble/brmcp"
	"github.com/karamble/brmcp/wire"
)

// wireRequest is one line on the wire server's stdin. Each op takes a batch so
// a differential test pays one round trip per thousands of cases.
type wireRequest struct {
	Op    string       `json:"op"`
	Texts []string     `json:"texts"`
	Cases []encodeCase `json:"cases"`
	Seqs  []asmSeq     `json:"seqs"`
	// Rounds repeats a bench op over its batch.
	Rounds int `json:"rounds"`
}

type encodeCase struct {
	SID        string `json:"sid"`
	PayloadB64 string `json:"payload_b64"`
	Exp        int64  `json:"exp"`
	ChunkSize  int    `json:"chunk_size"`
	MID        string `json:"mid"`
}

type asmConfig struct {
	MaxPendingPerPeer int   `json:"max_pending_per_peer"`
	MaxMessageBytes   int64 `json:"max_message_bytes"`
	MaxTotalBytes     int64 `json:"max_total_bytes"`
	TimeoutNS         int64 `json:"timeout_ns"`
}

type asmStep struct {
	Peer     string `json:"peer"`
	SID      string `json:"sid"`
	MID      string `json:"mid"`
	Seq      int    `json:"seq"`
	Total    int    `json:"total"`
	Exp      int64  `json:"exp"`
	ChunkB64 string `json:"chunk_b64"`
	NowNS    int64  `json:"now_ns"`
}

type asmSeq struct {
	Config asmConfig `json:"config"`
	Steps  []asmStep `json:"steps"`
}

type parseOut struct {
	Part *partResult `json:"part"`
	Env  bool        `json:"env"`
}

type encodeOut struct {
	Parts []string `json:"parts,omitempty"`
	Error string   `json:"error,omitempty"`
}

// asmOut is one Add result: the payload, nothing yet, or an error.
type asmOut struct {
	PayloadB64 *string `json:"payload_b64"`
	Error      string  `json:"error,omitempty"`
}

func runWire() int {
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			var req wireRequest
			var resp any
			if jerr := json.Unmarshal(line, &req); jerr != nil {
				resp = map[string]string{"error": "bad request: " + jerr.Error()}
			} else {
				resp = serveWire(&req)
			}
			if err := enc.Encode(resp); err != nil {
				fmt.Fprintln(os.Stderr, "wire:", err)
				return 1
			}
			if err := out.Flush(); err != nil {
				return 1
			}
		}
		if err == io.EOF {
			return 0
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "wire:", err)
			return 1
		}
	}
}

func serveWire(req *wireRequest) any {
	switch req.Op {
	case "parse":
		res := make([]parseOut, len(req.Texts))
		for i, t := range req.Texts {
			p, ok := wire.Parse(t)
			res[i].Env = brmcp.IsEnvelope(t)
			if ok {
				res[i].Part = toResult(p)
			}
		}
		return map[string]any{"results": res}
	case "encode":
		res := make([]encodeOut, len(req.Cases))
		for i, c := range req.Cases {
			payload, err := base64.StdEncoding.DecodeString(c.PayloadB64)
			if err != nil {
				res[i].Error = "bad payload_b64: " + err.Error()
				continue
			}
			parts, err := encodeWithMID(c.SID, payload, c.Exp, c.ChunkSize, c.MID)
			if err != nil {
				res[i].Error = err.Error()
			} else {
				res[i].Parts = parts
			}
		}
		return map[string]any{"results": res}
	case "assemble":
		res := make([][]asmOut, len(req.Seqs))
		for i, s := range req.Seqs {
			res[i] = runSeq(s)
		}
		return map[string]any{"results": res}
	case "bench_parse":
		return benchParse(req)
	case "bench_encode":
		return benchEncode(req)
	}
	return map[string]string{"error": "unknown op " + req.Op}
}

func runSeq(s asmSeq) []asmOut {
	a := wire.NewAssembler(wire.AssemblerConfig{
		MaxPendingPerPeer: s.Config.MaxPendingPerPeer,
		MaxMessageBytes:   s.Config.MaxMessageBytes,
		MaxTotalBytes:     s.Config.MaxTotalBytes,
		Timeout:           time.Duration(s.Config.TimeoutNS),
	})
	out := make([]asmOut, len(s.Steps))
	for i, st := range s.Steps {
		chunk, err := base64.StdEncoding.DecodeString(st.ChunkB64)
		if err != nil {
			out[i].Error = "bad chunk_b64: " + err.Error()
			continue
		}
		p := &wire.Part{SID: st.SID, MID: st.MID, Seq: st.Seq, Total: st.Total, Exp: st.Exp, Chunk: chunk}
		full, err := a.Add(st.Peer, p, time.Unix(0, st.NowNS))
		if err != nil {
			out[i].Error = err.Error()
		} else if full != nil {
			b := base64.StdEncoding.EncodeToString(full)
			out[i].PayloadB64 = &b
		}
	}
	return out
}

// benchParse times wire.Parse over the batch, Rounds times.
func benchParse(req *wireRequest) any {
	rounds := max(req.Rounds, 1)
	var n, nbytes int
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for _, t := range req.Texts {
			if _, ok := wire.Parse(t); ok {
				n++
			}
			nbytes += len(t)
		}
	}
	return map[string]any{"ns": time.Since(start).Nanoseconds(), "ok": n, "bytes": nbytes}
}

// benchEncode times wire.Encode over the batch, Rounds times.
func benchEncode(req *wireRequest) any {
	rounds := max(req.Rounds, 1)
	payloads := make([][]byte, len(req.Cases))
	for i, c := range req.Cases {
		payloads[i], _ = base64.StdEncoding.DecodeString(c.PayloadB64)
	}
	var parts, nbytes int
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for i, c := range req.Cases {
			out, err := wire.Encode(c.SID, payloads[i], expTime(c.Exp), c.ChunkSize)
			if err == nil {
				parts += len(out)
			}
			nbytes += len(payloads[i])
		}
	}
	return map[string]any{"ns": time.Since(start).Nanoseconds(), "ok": parts, "bytes": nbytes}
}
